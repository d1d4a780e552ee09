-- Library of the dead-letter record (prepended by scrapy_dist/scripts.py to every
-- script whose header says "-- uses: _deadletter"). No KEYS or ARGV of its own.
--
-- The record format is scrapy_dist/deadletter.py's, which owns it: a JSON object
-- {"kind", "reason", "data", "time", "worker", "deliveries"}, data being the raw text
-- when it is UTF-8, else {"$b": <its latin-1 text>}, so Python gets its exact bytes
-- back (tests/test_deadletter.py checks that both writers agree).

-- The well-formed UTF-8 sequences of two to four bytes (Unicode's table 3-7: no
-- overlong forms, no surrogates, nothing above U+10FFFF). Their lead bytes differ, and
-- a continuation byte never leads, so they can be matched in any order.
local UTF8_SEQUENCES = {
  "[\194-\223][\128-\191]",
  "\224[\160-\191][\128-\191]",
  "[\225-\236\238\239][\128-\191][\128-\191]",
  "\237[\128-\159][\128-\191]",
  "\240[\144-\191][\128-\191][\128-\191]",
  "[\241-\243][\128-\191][\128-\191][\128-\191]",
  "\244[\128-\143][\128-\191][\128-\191]",
}

-- True if s is well-formed UTF-8 as Python's strict decoder sees it: once every valid
-- multi-byte sequence is replaced by an ASCII letter (so that no two bytes meet that
-- were apart), no byte above 127 is left. gsub runs in C: no per-byte Lua loop.
local function is_utf8(s)
  if not string.find(s, "[\128-\255]") then
    return true
  end
  for _, sequence in ipairs(UTF8_SEQUENCES) do
    s = string.gsub(s, sequence, "u")
  end
  return not string.find(s, "[\128-\255]")
end

-- Bytes as their latin-1 text, in UTF-8 (what Python's bytes.decode("latin-1") gives).
local function latin1(s)
  return (string.gsub(s, "[\128-\255]", function(ch)
    local b = string.byte(ch)
    return string.char(192 + math.floor(b / 64), 128 + b % 64)
  end))
end

-- A dead-letter record (JSON), in the one format scrapy_dist/deadletter.py defines:
-- data is the raw text when it is UTF-8, else {"$b": <its latin-1 text>}; a reason
-- that is not UTF-8 is stored as its latin-1 text.
local function dead_json(kind, data, reason, now, worker, times)
  local text = data
  if not is_utf8(data) then
    text = {["$b"] = latin1(data)}
  end
  if not is_utf8(reason) then
    reason = latin1(reason)
  end
  return cjson.encode({
    kind = kind, reason = reason, data = text, time = now, worker = worker,
    deliveries = times,
  })
end
