-- Register a worker in the crawl's registry; optionally flush the crawl's frontier
-- first, but only when no other live worker would lose its work.
--
-- A worker started after the crawl was marked finished starts a new run: the completion
-- marks (idle_since, finished_at) are cleared and run_base is set to the settlements so
-- far (done + dead), so completion is judged on this run's own work (lua/progress.lua)
-- while the persisted data and counters stay. A worker started before the crawl
-- finished (a replacement that joins late) belongs to that run and sees it finished.
--
-- The start requests a plain spider's workers queue once between them are recorded
-- in KEYS[3] (the first worker to add a fingerprint crawls it): the record is dropped
-- when a new run starts or no other worker is alive, so each run, and a crawl resumed
-- after all its workers stopped, crawls its start requests once.
--
-- KEYS[1] = worker registry hash (worker id -> last heartbeat, server time in seconds)
-- KEYS[2] = crawl progress hash (fields: done, dead, idle_since, finished_at, run_base)
-- KEYS[3] = the start requests queued in this run (set of fingerprints)
-- KEYS[4..] = frontier keys deleted by a flush (queue, dupefilter, sequence; a priority
--           queue's marker takes its levels with it, lua/_levels.lua)
-- ARGV[1] = this worker's id
-- ARGV[2] = seconds without heartbeat after which a worker counts as gone
-- ARGV[3] = "1" to flush the frontier if no other worker is alive, else "0"
-- ARGV[4] = seconds since this worker started (its age, so no clocks are compared)
-- Returns: {number of other live workers, 1 if the frontier was flushed else 0,
--          1 if a new run started else 0}
-- uses: _levels

local workers, progress = KEYS[1], KEYS[2]
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
  unlink_frontier(KEYS, 4)
  flushed = 1
end

local new_run = 0
local finished_at = tonumber(redis.call("HGET", progress, "finished_at") or "")
if finished_at and finished_at < now - tonumber(ARGV[4]) then
  local settled = tonumber(redis.call("HGET", progress, "done") or "0")
    + tonumber(redis.call("HGET", progress, "dead") or "0")
  redis.call("HDEL", progress, "idle_since", "finished_at")
  redis.call("HSET", progress, "run_base", tostring(settled))
  redis.call("PERSIST", progress)
  new_run = 1
end
if others == 0 or new_run == 1 then
  redis.call("UNLINK", KEYS[3])
end
redis.call("HSET", workers, me, tostring(now))
return {others, flushed, new_run}
