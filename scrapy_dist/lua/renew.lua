-- Extend the deadlines of leases this worker still holds (one call for all of them).
--
-- KEYS[1] = leases zset (lease id -> deadline, server time in seconds)
-- KEYS[2] = leased hash (lease id -> "<origin>|<score>|<worker>|<entry>")
-- KEYS[3] = crawl epoch, KEYS[4] = this worker's lease index (set)
-- ARGV[1] = worker id
-- ARGV[2] = lease duration in seconds from now
-- ARGV[3] = the crawl epoch this worker joined ("" = unfenced)
-- ARGV[4..] = lease ids
-- Returns: the ids of the leases this worker no longer holds (expired and taken back,
--          a lease already reclaimed is not revived); an error "EPOCH ..." if the
--          crawl's epoch is not ARGV[3]
-- uses: _leases, _fence, _batch

local leases, leased, index, worker = KEYS[1], KEYS[2], KEYS[4], ARGV[1]
local refused = fence(KEYS[3], ARGV[3])
if refused then
  return redis.error_reply(refused)
end
local t = redis.call("TIME")
local duration = tonumber(ARGV[2])
local deadline = tonumber(t[1]) + tonumber(t[2]) / 1e6 + duration
-- one HMGET of the records, then one ZADD XX of the deadlines and one SREM of the lost
-- (lua/_batch.lua)
local ids = {}
for i = 4, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
local lost, kept = {}, {}
for k, record in ipairs(batched({"HMGET", leased}, ids)) do
  local holder
  if record then
    local _
    _, _, holder = parse_record(record)
  end
  if holder == worker then
    kept[#kept + 1] = deadline
    kept[#kept + 1] = ids[k]
  else
    lost[#lost + 1] = ids[k]
  end
end
batched({"ZADD", leases, "XX"}, kept, 2)
batched({"SREM", index}, lost)
redis.call("EXPIRE", index, math.ceil(duration * 2 + 60))
return lost
