-- Hand back the leases this worker holds without knowing it. When a reply is lost (the
-- connection dropped or timed out after Redis ran the call, e.g. while it was frozen),
-- a reserve may have leased entries the worker never received; instead of waiting for
-- their leases to expire they go back where they came from, not counted as a delivery.
--
-- KEYS[1] = leases zset, KEYS[2] = leased hash, KEYS[3] = deliveries hash
-- KEYS[4] = request queue, KEYS[5] = seeds key
-- ARGV[1] = worker id
-- ARGV[2] = how a request goes back to the queue: "rpush" | "lpush" | "zadd"
-- ARGV[3] = how a seed goes back to the seeds key: "lpush" | "sadd" | "zadd"
-- ARGV[4..] = the lease ids the worker knows it holds
-- Returns: the number of leases handed back
-- uses: _leases

local leases, leased, deliveries, queue, seeds = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local worker, qback, sback = ARGV[1], ARGV[2], ARGV[3]
local known = {}
for i = 4, #ARGV do
  known[ARGV[i]] = true
end

local released = 0
local entries = redis.call("HGETALL", leased)
for i = 1, #entries, 2 do
  local id = entries[i]
  local origin, score, holder, entry = parse_record(entries[i + 1])
  if holder == worker and not known[id] then
    redis.call("ZREM", leases, id)
    redis.call("HDEL", leased, id)
    redis.call("HINCRBY", deliveries, id, -1)
    return_entry(origin, score, entry, queue, qback, seeds, sback)
    released = released + 1
  end
end
return released
