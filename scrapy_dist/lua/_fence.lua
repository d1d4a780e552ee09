-- Library of the frontier scripts (prepended by scrapy_dist/scripts.py to every script
-- whose header says "-- uses: _fence"). No KEYS or ARGV of its own.
--
-- A crawl's epoch key holds a random id written when the crawl's first worker opened
-- it. Every frontier write carries the epoch its worker joined: a write for a crawl
-- that finished (its keys deleted), was flushed (FLUSHDB), evicted or rolled back by a
-- failover finds another epoch, or none, and is refused before it changes anything.

-- Redis Cluster refuses a call up front (TRYAGAIN, ASK) while the crawl's hash slot is
-- moved to another node (a reshard) only for the keys it declares in KEYS. A key a
-- script reaches by a name it computes (a priority level, another worker's holding, a
-- Bloom segment) is refused command by command instead, mid-call, after the call's
-- earlier writes: a reclaimed lease taken out of its holding but never put back. So a
-- script that computes key names first reads a key that never exists, named after one
-- of its keys (same hash tag, so same slot): on a slot being moved that read is
-- refused, and so is the whole call, before anything changed. Returns nil, or the
-- refusal ("TRYAGAIN ...", which callers wait out as Redis's own TRYAGAIN).
local function slot_moving(key)
  local probe = redis.pcall("EXISTS", key .. SLOT_PROBE_SUFFIX)
  if type(probe) == "table" and probe.err then
    return "TRYAGAIN the crawl's hash slot is being moved to another node (" .. probe.err
      .. "); retry when it has moved"
  end
  return nil
end

-- Check that the crawl's slot is not being moved (slot_moving) and the epoch, then
-- make one small write (the epoch rewritten unchanged) so that a server refusing
-- writes (OOM, NOREPLICAS, READONLY...) refuses the whole call here, before anything
-- else changed. Returns nil, or the refusal ("TRYAGAIN ...", "EPOCH <found> ...").
-- An empty expected epoch means an unfenced caller (a command-line tool): no epoch
-- check.
local function fence(key, expected)
  local moving = slot_moving(key)
  if moving or expected == "" then
    return moving
  end
  local current = redis.call("GET", key)
  if current ~= expected then
    return EPOCH_REFUSAL .. " " .. (current or NO_EPOCH) .. " expected " .. expected
  end
  redis.call("SET", key, expected, "XX")
  return nil
end
