-- Remove a worker from the crawl's registry, pruning workers whose heartbeat is stale.
-- Leaving never deletes shared state: only a finished crawl does (lua/progress.lua).
--
-- KEYS[1] = worker registry hash (worker id -> last heartbeat, server time in seconds)
-- KEYS[2] (optional) = worker figures hash (lua/heartbeat.lua): the figures of this
--           worker and of the workers pruned go with them (the hash goes with the last)
-- ARGV[1] = this worker's id
-- ARGV[2] = seconds without heartbeat after which a worker counts as gone
-- A heartbeat that is not a finite number (written by hand) counts as a gone worker's
-- (pruned), as in lua/join.lua.
-- A KEYS[1] of another type (written by hand) is renamed to "<KEYS[1]>:wrongtype" (named in
-- the server log, lua/_registry.lua): none is known alive then, and none remains.
-- Returns: {live workers remaining, workers pruned as gone} (a gone worker may be paused
-- rather than dead: it learns how the crawl ended from the progress record)
-- uses: _registry

local workers = KEYS[1]
local me, timeout = ARGV[1], tonumber(ARGV[2])
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

registry_write({"HDEL", workers, me})
local figures = KEYS[2]
local function forget_figures(worker)
  if figures and redis.call("TYPE", figures)["ok"] == "hash" then
    redis.call("HDEL", figures, worker)
  end
end
forget_figures(me)
local entries = redis.call("HGETALL", workers)
local remaining, pruned = 0, 0
for i = 1, #entries, 2 do
  local beat = tonumber(entries[i + 1])
  if not (beat and beat >= now - timeout and beat ~= math.huge) then
    redis.call("HDEL", workers, entries[i])
    forget_figures(entries[i])
    pruned = pruned + 1
  else
    remaining = remaining + 1
  end
end
return {remaining, pruned}
