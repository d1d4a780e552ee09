-- Register a worker in the crawl's registry; optionally flush the crawl's frontier
-- first, but only when no other live worker would lose its work.
--
-- KEYS[1] = worker registry hash (worker id -> last heartbeat, server time in seconds)
-- KEYS[2..] = frontier keys deleted by a flush (queue, dupefilter, sequence)
-- ARGV[1] = this worker's id
-- ARGV[2] = seconds without heartbeat after which a worker counts as gone
-- ARGV[3] = "1" to flush the frontier if no other worker is alive, else "0"
-- Returns: {number of other live workers, 1 if the frontier was flushed else 0}

local workers = KEYS[1]
local me, timeout, flush = ARGV[1], tonumber(ARGV[2]), ARGV[3] == "1"
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

local entries = redis.call("HGETALL", workers)
local others = 0
for i = 1, #entries, 2 do
  if tonumber(entries[i + 1]) < now - timeout then
    redis.call("HDEL", workers, entries[i])
  elseif entries[i] ~= me then
    others = others + 1
  end
end

local flushed = 0
if flush and others == 0 then
  for i = 2, #KEYS do
    redis.call("UNLINK", KEYS[i])
  end
  flushed = 1
end
redis.call("HSET", workers, me, tostring(now))
return {others, flushed}
