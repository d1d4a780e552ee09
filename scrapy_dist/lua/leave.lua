-- Remove a worker from the crawl's registry; if it was the last live worker and the
-- crawl does not persist, delete the crawl's frontier in the same step.
--
-- KEYS[1] = worker registry hash (worker id -> last heartbeat, server time in seconds)
-- KEYS[2..] = frontier keys deleted when the last worker leaves (queue, dupefilter, ...)
-- ARGV[1] = this worker's id
-- ARGV[2] = seconds without heartbeat after which a worker counts as gone
-- ARGV[3] = "1" to delete the frontier when no live worker remains, else "0"
-- Returns: {number of live workers remaining, 1 if the frontier was deleted else 0}

local workers = KEYS[1]
local me, timeout, clear = ARGV[1], tonumber(ARGV[2]), ARGV[3] == "1"
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

redis.call("HDEL", workers, me)
local entries = redis.call("HGETALL", workers)
local remaining = 0
for i = 1, #entries, 2 do
  if tonumber(entries[i + 1]) < now - timeout then
    redis.call("HDEL", workers, entries[i])
  else
    remaining = remaining + 1
  end
end

local cleared = 0
if clear and remaining == 0 then
  for i = 2, #KEYS do
    redis.call("DEL", KEYS[i])
  end
  cleared = 1
end
return {remaining, cleared}
