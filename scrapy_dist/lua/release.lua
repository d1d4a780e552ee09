-- Hand back the leases this worker holds without knowing it. When a reply is lost (the
-- connection dropped or timed out after Redis ran the call, e.g. while it was frozen),
-- a reserve may have leased entries the worker never received; instead of waiting for
-- their leases to expire they go back where they came from, not counted as a delivery.
-- Only this worker's lease index is read, never the whole leased hash.
--
-- KEYS[1] = leases zset, KEYS[2] = leased hash, KEYS[3] = deliveries hash
-- KEYS[4] = request queue, KEYS[5] = seeds key
-- KEYS[6] = crawl epoch, KEYS[7] = this worker's lease index (set)
-- ARGV[1] = worker id
-- ARGV[2] = how a request goes back to the queue: "rpush" | "lpush" | "level" | "zadd"
-- ARGV[3] = how a seed goes back to the seeds key: "lpush" | "sadd" | "zadd"
-- ARGV[4] = the crawl epoch this worker joined ("" = unfenced)
-- ARGV[5..] = the lease ids the worker knows it holds (buffered, in its engine, or
--             waiting in its outbox to be settled)
-- Returns: the number of leases handed back; an error "EPOCH ..." if the crawl's epoch
--          is not ARGV[4]
-- uses: _leases, _fence, _batch

local leases, leased, deliveries, queue, seeds = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local index = KEYS[7]
local worker, qback, sback = ARGV[1], ARGV[2], ARGV[3]
local refused = fence(KEYS[6], ARGV[4])
if refused then
  return redis.error_reply(refused)
end
local known = {}
for i = 5, #ARGV do
  known[ARGV[i]] = true
end

-- one SREM from the index, one HMGET of the records, one ZREM and one HDEL of the
-- leases handed back (lua/_batch.lua); deliveries and entries go back one by one
local unknown = {}
for _, id in ipairs(redis.call("SMEMBERS", index)) do
  if not known[id] then
    unknown[#unknown + 1] = id
  end
end
batched({"SREM", index}, unknown)
local mine, records = {}, {}
for k, record in ipairs(batched({"HMGET", leased}, unknown)) do
  if record then
    local origin, score, holder, entry = parse_record(record)
    if holder == worker then
      mine[#mine + 1] = unknown[k]
      records[#records + 1] = {origin, score, entry}
    end
  end
end
batched({"ZREM", leases}, mine)
batched({"HDEL", leased}, mine)
for k, id in ipairs(mine) do
  local record = records[k]
  redis.call("HINCRBY", deliveries, id, -1)
  return_entry(record[1], record[2], record[3], queue, qback, seeds, sback)
end
push_returned()
return #mine
