-- Library of the lease scripts (prepended by scrapy_dist/scripts.py to every script
-- whose header says "-- uses: _leases"). No KEYS or ARGV of its own.
--
-- A leased record is "<origin>|<score>|<worker>|<entry>": origin FROM_QUEUE ("q") for
-- an entry of the request queue ("<ENTRY_ID_LEN-digit id><payload>"), FROM_SEEDS ("s")
-- for a raw seed. (The constants are prepended by scrapy_dist/scripts.py.)
-- uses: _levels

-- Split a leased record into origin, score, worker, entry.
local function parse_record(record)
  local a = string.find(record, "|", 1, true)
  local b = string.find(record, "|", a + 1, true)
  local c = string.find(record, "|", b + 1, true)
  return string.sub(record, 1, a - 1), string.sub(record, a + 1, b - 1),
    string.sub(record, b + 1, c - 1), string.sub(record, c + 1)
end

-- Put an entry back where it was taken from; how: "level" (at the head of the level
-- of its score, lua/_levels.lua), "zadd", "sadd", "rpush" or "lpush".
local function put_back(key, how, score, entry)
  if how == "level" then
    put_back_level(key, score, entry)
  elseif how == "zadd" then
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
-- the request queue (FROM_QUEUE), each with its own way of taking it back. Entries put
-- back to a priority queue's levels are pushed when the script calls push_returned()
-- (lua/_levels.lua), which it does once it has returned them all.
local function return_entry(origin, score, entry, queue, qback, seeds, sback)
  if origin == FROM_SEEDS then
    put_back(seeds, sback, score, entry)
  else
    put_back(queue, qback, score, entry)
  end
end

-- dead_record calls dead_json, which is lua/_deadletter.lua's: a script that calls
-- dead_record lists "_deadletter" before "_leases" on its "-- uses:" line.

-- The dead-letter record of a leased entry that will not be tried again.
local function dead_record(origin, entry, reason, now, worker, times)
  local data = entry
  if origin == FROM_QUEUE then
    data = string.sub(entry, ENTRY_ID_LEN + 1)
  end
  return dead_json(origin == FROM_QUEUE and "request" or "seed", data, reason, now, worker, times)
end
