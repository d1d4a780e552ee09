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
-- A heartbeat that is not a finite number (written by hand) counts as a gone worker's.
-- A KEYS[1] or KEYS[2] of another type (written by hand) is renamed out of the way
-- before anything is written ("<key>:wrongtype", lua/_registry.lua; named in the
-- server log), and a fresh one started; who is alive is then unknown, so the frontier
-- is not flushed nor KEYS[3] dropped (unless a new run starts). A KEYS[2] set aside
-- took its completion mark with it: when no other worker is known alive, this worker
-- starts a new run (run_base 0: nothing settled in it yet, so it waits for its seeds
-- rather than finishes within the grace); with others alive the run goes on, counted
-- as having settled one (lua/_leases.lua set_aside_progress). A counter of KEYS[2]
-- that is not a number reads as 0 (lua/_leases.lua read_counts); a finished_at that is
-- not a number is moved to "finished_at:wrongtype" and, when no other worker is known
-- alive, counts as a finish long ago (a new run starts).
-- Returns: {number of other live workers, 1 if the frontier was flushed else 0,
--          1 if a new run started else 0}; an error "TRYAGAIN ..." while the crawl's
--          hash slot is being moved to another cluster node (lua/_fence.lua; nothing written)
-- uses: _registry, _leases, _fence

local workers, progress = KEYS[1], KEYS[2]
local moving = slot_moving(workers)
if moving then
  return redis.error_reply(moving)
end
local me, timeout, flush = ARGV[1], tonumber(ARGV[2]), ARGV[3] == "1"
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

-- both read before anything is written (a flush, a heartbeat pruned)
local entries, unknown = call_or_set_aside({"HGETALL", workers}, {}, set_aside_registry)
local finished_at, progress_aside = call_or_set_aside({"HGET", progress, "finished_at"},
  false, set_aside_progress)
-- a completion time written by hand (not a number) is a finish at an unknown time: its
-- text is kept aside, and with no other worker alive this worker starts the next run
-- (with others alive, the run goes on and is judged again by lua/progress.lua)
local finished_long_ago
finished_at, finished_long_ago = finished_time(progress, finished_at)

local others = 0
for i = 1, #entries, 2 do
  local beat = tonumber(entries[i + 1])
  if not (beat and beat >= now - timeout and beat ~= math.huge) then
    redis.call("HDEL", workers, entries[i])
  elseif entries[i] ~= me then
    others = others + 1
  end
end

local flushed = 0
if flush and others == 0 and not unknown then
  unlink_frontier(KEYS, 4)
  flushed = 1
end

local new_run = 0
if ((finished_long_ago or progress_aside) and others == 0 and not unknown)
    or (finished_at and finished_at < now - tonumber(ARGV[4])) then
  -- one HMGET; a counter written by hand reads as 0, reset (lua/_leases.lua read_counts)
  local c = read_counts(progress, {"done", "dead"})
  redis.call("HDEL", progress, "idle_since", "finished_at")
  redis.call("HSET", progress, "run_base", string.format("%.0f", c[1] + c[2]))
  redis.call("PERSIST", progress)
  new_run = 1
end
if (others == 0 and not unknown) or new_run == 1 then
  redis.call("UNLINK", KEYS[3])
end
redis.call("HSET", workers, me, tostring(now))
return {others, flushed, new_run}
