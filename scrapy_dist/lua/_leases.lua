-- Library of the lease scripts (prepended by scrapy_dist/scripts.py to every script
-- whose header says "-- uses: _leases"). No KEYS or ARGV of its own.
--
-- A leased record is "<origin>|<score>|<worker>|<entry>": origin FROM_QUEUE ("q") for
-- an entry of the request queue ("<ENTRY_ID_LEN-digit id><payload>"), FROM_SEEDS ("s")
-- for a raw seed. (The constants are prepended by scrapy_dist/scripts.py.)

-- Split a leased record into origin, score, worker, entry.
local function parse_record(record)
  local a = string.find(record, "|", 1, true)
  local b = string.find(record, "|", a + 1, true)
  local c = string.find(record, "|", b + 1, true)
  return string.sub(record, 1, a - 1), string.sub(record, a + 1, b - 1),
    string.sub(record, b + 1, c - 1), string.sub(record, c + 1)
end

-- Put an entry back where it was taken from; how: "zadd", "sadd", "rpush" or "lpush".
local function put_back(key, how, score, entry)
  if how == "zadd" then
    redis.call("ZADD", key, score, entry)
  elseif how == "sadd" then
    redis.call("SADD", key, entry)
  elseif how == "rpush" then
    redis.call("RPUSH", key, entry)
  else
    redis.call("LPUSH", key, entry)
  end
end

-- Put an entry back where its origin says it came from: the seeds key (FROM_SEEDS) or
-- the request queue (FROM_QUEUE), each with its own way of taking it back.
local function return_entry(origin, score, entry, queue, qback, seeds, sback)
  if origin == FROM_SEEDS then
    put_back(seeds, sback, score, entry)
  else
    put_back(queue, qback, score, entry)
  end
end

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
-- data is the raw text when it is UTF-8, else {"$b": <its latin-1 text>}.
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

-- The dead-letter record of a leased entry that will not be tried again.
local function dead_record(origin, entry, reason, now, worker, times)
  local data = entry
  if origin == FROM_QUEUE then
    data = string.sub(entry, ENTRY_ID_LEN + 1)
  end
  return dead_json(origin == FROM_QUEUE and "request" or "seed", data, reason, now, worker, times)
end
