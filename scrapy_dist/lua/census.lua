-- Count what one shard of a sharded crawl holds, for the crawl's completion
-- (lua/progress.lua on shard 0 adds these up): fenced by the shard's epoch like every
-- frontier script, so a shard that refuses writes (or whose master rolled back) makes
-- the crawl unknown rather than finished.
--
-- KEYS[1] = the shard's request queue, KEYS[2] = its holders zset (lua/_leases.lua)
-- KEYS[3] = its progress hash (counters: done, dead, retried), KEYS[4] = its epoch
-- KEYS[5] = its previous version's leases zset (counted as leased)
-- ARGV[1] = queue kind ("list" or "levels", lua/_levels.lua)
-- ARGV[2] = the crawl epoch this worker joined in that shard ("" = unfenced)
-- A counter that is not a number (written by hand) reads as 0 and is reset, its text
-- kept in "<field>:wrongtype" (lua/progress.lua lets its shard's base follow); a KEYS[3]
-- of another type is renamed to "<KEYS[3]>:wrongtype" (named in the server log) and
-- counting starts again in a fresh hash (lua/_leases.lua read_counts).
-- Returns: {queued, leased, done, dead, retried} (settled: done + dead; the three
--          counters are added to shard 0's when a crawl that does not persist finishes,
--          lua/progress.lua); an error "EPOCH ..." (or "TRYAGAIN ...", lua/_fence.lua)
--          if the shard's epoch is not ARGV[2], "WRONGTYPE ..." if the queue cannot be
--          counted
-- uses: _fence, _leases

local refused = fence(KEYS[4], ARGV[2])
if refused then
  return redis.error_reply(refused)
end
local queued, refusal = queued_count(KEYS[1], ARGV[1])
if refusal then
  return redis.error_reply(refusal)
end
-- one HMGET; a counter written by hand reads as 0, reset (lua/_leases.lua read_counts)
local c = read_counts(KEYS[3], {"done", "dead", "retried"})
return {queued, leased_count(KEYS[2], KEYS[5]), c[1], c[2], c[3]}
