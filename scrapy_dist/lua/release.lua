-- Hand back the leases this worker holds without knowing it. When a reply is lost (the
-- connection dropped or timed out after Redis ran the call, e.g. while it was frozen),
-- a reserve may have leased entries the worker never received; instead of waiting for
-- their leases to expire they go back where they came from, not counted as a delivery.
-- Only this worker's holding is read.
--
-- A record it cannot read (edited by hand) is dead-lettered whole, and a priority level
-- that is not a list, a deliveries key that is not a hash, or a queue or seeds key of
-- another type than ARGV[1] or ARGV[2] puts back to, is set aside with a
-- dead-letter record naming it (lua/_levels.lua, lua/_leases.lua), all counted as dead:
-- nothing is dropped or renamed silently. So is a dead-letter key of another type, when
-- a record is pushed (push_dead).
--
-- KEYS[1] = this worker's holding hash (lua/_leases.lua), KEYS[2] = deliveries hash
-- KEYS[3] = request queue, KEYS[4] = seeds key, KEYS[5] = crawl epoch
-- KEYS[6] = dead-letter list, KEYS[7] = crawl stats hash (counter: dead)
--            (a counter that is not an integer is restarted, and a key of another type
--            set aside when the call counts, lua/_leases.lua add_counts)
-- ARGV[1] = how a request goes back to the queue: "rpush" | "lpush" | "level" | "zadd"
-- ARGV[2] = how a seed goes back to the seeds key: "lpush" | "sadd" | "zadd"
-- ARGV[3] = the crawl epoch this worker joined ("" = unfenced)
-- ARGV[4] = worker id (named in dead-letter records)
-- ARGV[5..] = the lease ids the worker knows it holds (buffered, in its engine, or
--             waiting in its outbox to be settled)
-- Returns: the number of leases handed back (not those dead-lettered); an error
--          "EPOCH ..." (or "TRYAGAIN ...", lua/_fence.lua) if the crawl's epoch is not ARGV[3]
-- uses: _deadletter, _leases, _fence, _batch

local holding, deliveries, queue, seeds = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dead, stats = KEYS[6], KEYS[7]
local qback, sback, worker = ARGV[1], ARGV[2], ARGV[4]
local refused = fence(KEYS[5], ARGV[3])
if refused then
  return redis.error_reply(refused)
end
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local known = {}
for i = 5, #ARGV do
  known[ARGV[i]] = true
end

-- a deliveries key that is not a hash is set aside first (lua/_leases.lua): reading it
-- would fail the call once the leases are out of the holding
local buried, malformed = 0, 0
-- every dead-letter record goes through bury (a dead key of another type is set aside
-- first, lua/_leases.lua push_dead), counted as dead at the end
local function bury(record)
  buried = buried + push_dead(dead, record, now, worker)
end
local deliveries_aside = set_aside_deliveries(deliveries)
if deliveries_aside then
  bury(dead_json("request", "", deliveries_aside, now, worker, 0))
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
-- a queue or seeds key of another type than entries go back to is set aside before
-- they leave the holding (lua/_leases.lua)
if #mine > 0 then
  for _, reason in ipairs(set_aside_destinations(queue, qback, seeds, sback)) do
    bury(dead_json("request", "", reason, now, worker, 0))
  end
end
batched({"HDEL", holding}, mine)
local times = delivered(deliveries, mine)
for k, id in ipairs(mine) do
  local origin, score, entry = parse_holding(id, records[k])
  if origin then
    count_hand_back(deliveries, id, times[k])
    return_entry(origin, score, entry, queue, qback, seeds, sback)
  else
    bury(dead_json("request", records[k], malformed_reason(holding, id), now, worker, times[k]))
    if times[k] > 1 then
      redis.call("HDEL", deliveries, id)
    end
    malformed = malformed + 1
  end
end
push_returned(function(key, kind, aside)
  bury(dead_json("request", "", set_aside_reason(key, kind, aside), now, worker, 0))
end)
-- a counter written by hand is restarted, not a failure after the writes (add_counts)
add_counts(stats, dead, {"dead", buried}, worker)
return #mine - malformed
