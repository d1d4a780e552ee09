-- Record that a worker is alive, stamped with the server's clock (so workers on
-- machines with skewed clocks agree on who is alive).
--
-- KEYS[1] = worker registry hash (worker id -> last heartbeat, server time in seconds)
-- ARGV[1] = this worker's id
-- Returns: the server time written, as a string

local t = redis.call("TIME")
local now = tostring(tonumber(t[1]) + tonumber(t[2]) / 1e6)
redis.call("HSET", KEYS[1], ARGV[1], now)
return now
