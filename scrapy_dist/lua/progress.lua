-- Report whether the crawl as a whole is finished, and mark it finished once it has
-- been: nothing queued, no seeds, nothing leased, after at least one request or seed
-- was settled in this run (done + dead above run_base, see lua/join.lua),
-- continuously for GRACE seconds. The first worker to see it finished
-- deletes the frontier when the crawl does not persist; the stats hash stays, with the
-- time of completion, so every worker sees the same answer.
--
-- KEYS[1] = request queue, KEYS[2] = seeds key, KEYS[3] = holders zset (lua/_leases.lua)
-- KEYS[4] = crawl stats hash (fields: done, dead, idle_since, finished_at, run_base,
--           finished_epoch: the epoch of the run last marked finished, kept when a new
--           run starts, so a worker of that run learns it finished, not was replaced)
-- KEYS[5] = crawl epoch (deleted with the frontier, so a late write is refused)
-- KEYS[6] = the previous version's leases zset (counted as leased)
-- KEYS[7..] = frontier keys deleted (UNLINK) at completion when ARGV[4] == "1" (a
--           priority queue's marker takes its levels with it, lua/_levels.lua)
-- ARGV[1] = queue kind ("list" or "levels", lua/_levels.lua), ARGV[2] = seeds type
--           ("list", "set", "zset")
-- ARGV[3] = GRACE seconds, ARGV[4] = "1" to delete the frontier at completion (and
--           again whenever a finished crawl is found with its epoch re-created by a
--           replacement that joined it late, so no key is left behind)
-- ARGV[5] = seconds the stats hash is kept after completion when deleting (0 = forever)
-- ARGV[6] = the crawl epoch this worker joined ("" = unfenced)
-- ARGV[7], ARGV[8] (a sharded crawl, lua/census.lua; absent: one shard) = entries queued
--           or leased in the other shards, and settlements the other shards counted
--           so far; the latter is stored as others_base when the crawl finishes, so a
--           new run counts only its own
-- ARGV[9], ARGV[10], ARGV[11] (a sharded crawl) = the other shards' done, dead and
--           retried counters: when the crawl finishes and its frontier is deleted
--           (ARGV[4] == "1"), they are added to KEYS[4]'s, whose record is then the
--           whole crawl's, which status and reset find without the other shards: their
--           progress hashes are deleted with their keys next, and only then is
--           others_base set to 0 (scrapy_dist/frontier/shards.py), so a shard whose keys outlive
--           the crawl (its worker killed between the two) is never counted twice
-- A counter or base of KEYS[4] that is not a number (written by hand) reads as 0 and is
-- reset, its text kept in "<field>:wrongtype"; the run then counts as having settled one
-- (never finished while anything is queued, seeded or leased, only after GRACE). So does
-- a KEYS[4] of another type: it is renamed to "<KEYS[4]>:wrongtype" (named in the server
-- log, lua/_leases.lua set_aside_progress) and counting starts again in a fresh hash.
-- A finished_at that is not a number (written by hand) is not read as finished: it is
-- moved to "finished_at:wrongtype" (lua/_leases.lua finished_time) and the crawl judged
-- as if it had none.
-- Returns: {state, queued, seeds, leased, finished_at}; state is "busy", "waiting"
--          (nothing settled in this run), "idle" (empty, within the grace) or "finished";
--          an error "EPOCH ..." (or "TRYAGAIN ...", lua/_fence.lua) if the crawl's epoch is not ARGV[6] (unless the crawl
--          finished and its epoch was deleted with its keys: "finished"); an error
--          "WRONGTYPE ..." if the queue cannot be counted
-- uses: _fence, _leases

local queue, seeds, holders, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local refused = fence(KEYS[5], ARGV[6])
if refused then
  local finished_at = redis.pcall("HGET", stats, "finished_at") -- an error: not finished
  if decimal_of(finished_at) and redis.call("EXISTS", KEYS[5]) == 0 then
    -- finished, and its keys deleted: every worker of it may read that answer
    return {"finished", 0, 0, 0, finished_at}
  end
  return redis.error_reply(refused)
end
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
-- a stats hash of another type (written by hand) is set aside before it is written (one
-- TYPE: this script runs when a worker is idle, not per page)
local kind = redis.call("TYPE", stats)["ok"]
if kind ~= "hash" and kind ~= "none" then
  redis.log(redis.LOG_WARNING, "scrapy_dist: " .. set_aside_progress(stats, kind))
end

local function size(key, kind)
  if kind == "zset" then
    return redis.call("ZCARD", key)
  elseif kind == "set" then
    return redis.call("SCARD", key)
  end
  return redis.call("LLEN", key)
end

local queued, refusal = queued_count(queue, ARGV[1])
if refusal then
  return redis.error_reply(refusal)
end
local waiting, leased = size(seeds, ARGV[2]), leased_count(holders, KEYS[6])
local others_busy, others_settled = tonumber(ARGV[7] or "0"), tonumber(ARGV[8] or "0")
queued = queued + others_busy
if queued + waiting + leased > 0 then
  redis.call("HDEL", stats, "idle_since", "finished_at")
  redis.call("PERSIST", stats)
  return {"busy", queued, waiting, leased, ""}
end
local finished_at = redis.call("HGET", stats, "finished_at")
if finished_time(stats, finished_at) then
  if ARGV[4] == "1" then
    -- a replacement that joined this run after its keys were deleted re-created its
    -- epoch (and maybe a key or two, all empty now): delete them again
    unlink_frontier(KEYS, 5)
  end
  return {"finished", 0, 0, 0, finished_at}
end
-- one HMGET; a counter written by hand reads as 0, reset (lua/_leases.lua read_counts)
local c, garbled = read_counts(stats, {"done", "dead", "run_base", "others_base"})
local others = others_settled - c[4]
if others < 0 then
  -- the other shards count less than when the crawl last finished (a counter of theirs
  -- reset, or expired): the base follows
  redis.call("HSET", stats, "others_base", tostring(others_settled))
  others = 0
end
local settled = c[1] + c[2] - c[3] + others
if garbled and settled <= 0 then
  -- a garbled counter existed, so something was settled: counted as this run's (one),
  -- so that an emptied crawl finishes rather than waits for ever
  redis.call("HSET", stats, "run_base", string.format("%.0f", c[1] + c[2] + others - 1))
  settled = 1
end
if settled <= 0 then
  return {"waiting", 0, 0, 0, ""}
end
-- one written by hand (not a number: decimal_of) starts the grace again, never ends it
local idle_since = decimal_of(redis.call("HGET", stats, "idle_since"))
if not idle_since then
  redis.call("HSET", stats, "idle_since", tostring(now))
  idle_since = now
end
if now - idle_since < tonumber(ARGV[3]) then
  return {"idle", 0, 0, 0, ""}
end
finished_at = tostring(now)
redis.call("HSET", stats, "finished_at", finished_at)
if ARGV[6] ~= "" then
  redis.call("HSET", stats, "finished_epoch", ARGV[6])
end
if ARGV[9] and ARGV[4] == "1" then
  -- the other shards' counters join this hash (written whole, never HINCRBY: a value
  -- written by hand that read_counts took, "1e300", is no integer to it)
  local r = read_counts(stats, {"retried"})
  local had = {c[1], c[2], r[1]}
  for k, field in ipairs({"done", "dead", "retried"}) do
    local n = tonumber(ARGV[8 + k])
    if n > 0 then
      redis.call("HSET", stats, field, string.format("%.0f", had[k] + n))
    end
  end
end
if ARGV[8] then
  redis.call("HSET", stats, "others_base", ARGV[8])
end
if ARGV[4] == "1" then
  -- UNLINK: a large dupefilter is freed in the background, not on the server's thread
  unlink_frontier(KEYS, 5)
  if tonumber(ARGV[5]) > 0 then
    redis.call("EXPIRE", stats, tonumber(ARGV[5]))
  end
end
return {"finished", 0, 0, 0, finished_at}
