-- Extend the deadlines of leases this worker still holds (one call for all of them).
--
-- KEYS[1] = leases zset (lease id -> deadline, server time in seconds)
-- KEYS[2] = leased hash (lease id -> "<origin>|<score>|<worker>|<entry>")
-- ARGV[1] = worker id
-- ARGV[2] = lease duration in seconds from now
-- ARGV[3..] = lease ids
-- Returns: the number of leases renewed (a lease already reclaimed is not revived)
-- uses: _leases

local leases, leased, worker = KEYS[1], KEYS[2], ARGV[1]
local t = redis.call("TIME")
local deadline = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[2])
local renewed = 0
for i = 3, #ARGV do
  local record = redis.call("HGET", leased, ARGV[i])
  if record then
    local _, _, holder = parse_record(record)
    if holder == worker then
      renewed = renewed + redis.call("ZADD", leases, "XX", "CH", deadline, ARGV[i])
    end
  end
end
return renewed
