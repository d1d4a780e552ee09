-- Count what one shard of a sharded crawl holds, for the crawl's completion
-- (lua/progress.lua on shard 0 adds these up): fenced by the shard's epoch like every
-- frontier script, so a shard that refuses writes (or whose master rolled back) makes
-- the crawl unknown rather than finished.
--
-- KEYS[1] = the shard's request queue, KEYS[2] = its holders zset (lua/_leases.lua)
-- KEYS[3] = its progress hash (counters: done, dead), KEYS[4] = its epoch
-- KEYS[5] = its previous version's leases zset (counted as leased)
-- ARGV[1] = queue kind ("list" or "levels", lua/_levels.lua)
-- ARGV[2] = the crawl epoch this worker joined in that shard ("" = unfenced)
-- Returns: {queued, leased, settled (done + dead)}; an error "EPOCH ..." if the shard's
--          epoch is not ARGV[2], "WRONGTYPE ..." if the queue cannot be counted
-- uses: _fence, _leases

local refused = fence(KEYS[4], ARGV[2])
if refused then
  return redis.error_reply(refused)
end
local queued, refusal = queued_count(KEYS[1], ARGV[1])
if refusal then
  return redis.error_reply(refusal)
end
local settled = tonumber(redis.call("HGET", KEYS[3], "done") or "0")
  + tonumber(redis.call("HGET", KEYS[3], "dead") or "0")
return {queued, leased_count(KEYS[2], KEYS[5]), settled}
