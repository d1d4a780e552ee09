-- Library of the frontier scripts (prepended by scrapy_dist/scripts.py to every script
-- whose header says "-- uses: _fence"). No KEYS or ARGV of its own.
--
-- A crawl's epoch key holds a random id written when the crawl's first worker opened
-- it. Every frontier write carries the epoch its worker joined: a write for a crawl
-- that finished (its keys deleted), was flushed (FLUSHDB), evicted or rolled back by a
-- failover finds another epoch, or none, and is refused before it changes anything.

-- Check the epoch, then make one small write (the epoch rewritten unchanged) so that a
-- server refusing writes (OOM, NOREPLICAS, READONLY...) refuses the whole call here,
-- before anything else changed. Returns nil, or the refusal ("EPOCH <found> ...").
-- An empty expected epoch means an unfenced caller (a command-line tool): no check.
local function fence(key, expected)
  if expected == "" then
    return nil
  end
  local current = redis.call("GET", key)
  if current ~= expected then
    return "EPOCH " .. (current or "none") .. " expected " .. expected
  end
  redis.call("SET", key, expected, "XX")
  return nil
end
