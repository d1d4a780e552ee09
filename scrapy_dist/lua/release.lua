-- Hand back the leases this worker holds without knowing it. When a reply is lost (the
-- connection dropped or timed out after Redis ran the call, e.g. while it was frozen),
-- a reserve may have leased entries the worker never received; instead of waiting for
-- their leases to expire they go back where they came from, not counted as a delivery.
-- Only this worker's holding is read.
--
-- KEYS[1] = this worker's holding hash (lua/_leases.lua), KEYS[2] = deliveries hash
-- KEYS[3] = request queue, KEYS[4] = seeds key, KEYS[5] = crawl epoch
-- ARGV[1] = how a request goes back to the queue: "rpush" | "lpush" | "level" | "zadd"
-- ARGV[2] = how a seed goes back to the seeds key: "lpush" | "sadd" | "zadd"
-- ARGV[3] = the crawl epoch this worker joined ("" = unfenced)
-- ARGV[4..] = the lease ids the worker knows it holds (buffered, in its engine, or
--             waiting in its outbox to be settled)
-- Returns: the number of leases handed back; an error "EPOCH ..." if the crawl's epoch
--          is not ARGV[3]
-- uses: _leases, _fence, _batch

local holding, deliveries, queue, seeds = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local qback, sback = ARGV[1], ARGV[2]
local refused = fence(KEYS[5], ARGV[3])
if refused then
  return redis.error_reply(refused)
end
local known = {}
for i = 4, #ARGV do
  known[ARGV[i]] = true
end

-- one HGETALL and one HDEL of the leases handed back (lua/_batch.lua); deliveries and
-- entries go back one by one
local flat = redis.call("HGETALL", holding)
local mine, records = {}, {}
for i = 1, #flat, 2 do
  if not known[flat[i]] then
    mine[#mine + 1] = flat[i]
    records[#records + 1] = flat[i + 1]
  end
end
batched({"HDEL", holding}, mine)
local times = delivered(deliveries, mine)
for k, id in ipairs(mine) do
  local origin, score, entry = parse_holding(id, records[k])
  count_hand_back(deliveries, id, times[k])
  return_entry(origin, score, entry, queue, qback, seeds, sback)
end
push_returned()
return #mine
