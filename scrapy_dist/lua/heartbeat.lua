-- Record that a worker is alive, stamped with the server's clock (so workers on
-- machines with skewed clocks agree on who is alive).
--
-- KEYS[1] = worker registry hash (worker id -> last heartbeat, server time in seconds)
-- ARGV[1] = this worker's id
-- A KEYS[1] of another type (written by hand) is renamed to "<KEYS[1]>:wrongtype" (named in
-- the server log, lua/_registry.lua) and the heartbeat written to a fresh hash, so that
-- the worker is known alive again within one heartbeat.
-- Returns: the server time written, as a string
-- uses: _registry

local t = redis.call("TIME")
local now = tostring(tonumber(t[1]) + tonumber(t[2]) / 1e6)
registry_write({"HSET", KEYS[1], ARGV[1], now})
return now
