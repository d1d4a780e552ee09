-- Extend the deadline of every lease this worker holds (lua/_leases.lua: a worker's
-- leases share one deadline), and tell which of the leases it names it no longer holds.
--
-- KEYS[1] = holders zset (worker id -> deadline of its leases, server time in seconds)
-- KEYS[2] = this worker's holding hash (lease id -> "<origin>|<score>|<data>")
-- KEYS[3] = crawl epoch
-- ARGV[1] = worker id
-- ARGV[2] = lease duration in seconds from now
-- ARGV[3] = the crawl epoch this worker joined ("" = unfenced)
-- ARGV[4..] = lease ids
-- Returns: the ids of the leases this worker no longer holds (expired and taken back,
--          a lease already reclaimed is not revived; all of them when its holding is
--          not a hash); an error "EPOCH ..." (or "TRYAGAIN ...", lua/_fence.lua) if the crawl's epoch is not ARGV[3]
-- uses: _fence, _batch

local holders, holding, worker = KEYS[1], KEYS[2], ARGV[1]
local refused = fence(KEYS[3], ARGV[3])
if refused then
  return redis.error_reply(refused)
end
local t = redis.call("TIME")
local deadline = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[2])
-- one HMGET of the records (lua/_batch.lua); a holding that is not a hash (written by
-- hand) holds nothing, and is not renewed: it expires, and a reserve sets it aside
local ids = {}
for i = 4, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
if redis.call("TYPE", holding)["ok"] ~= "hash" then
  return ids
end
-- a holders key of another type (written by hand) is not renewed into: the next
-- reserve sets it aside and rebuilds it, this worker's deadline one lease away
-- (lua/_leases.lua rebuild_holders)
local renewed = redis.pcall("ZADD", holders, deadline, worker)
if type(renewed) == "table" and string.sub(renewed.err, 1, 9) ~= "WRONGTYPE" then
  redis.call("ZADD", holders, deadline, worker) -- fails with Redis's own error
end
local lost = {}
for k, record in ipairs(batched({"HMGET", holding}, ids)) do
  if not record then
    lost[#lost + 1] = ids[k]
  end
end
return lost
