-- Settle leases this worker holds: acknowledge (done), return for another try after a
-- failure (or dead-letter it past the delivery limit), dead-letter it at once, or hand
-- back untouched.
-- Leases no longer held by this worker (expired and reclaimed) are left alone. A
-- deliveries key that is not a hash (written by hand), or a queue or seeds key of
-- another type than ARGV[2] or ARGV[3] puts back to, is set aside first, with a
-- dead-letter record naming it (counted as dead, lua/_leases.lua); so is a dead-letter
-- key of another type, when a record is pushed (push_dead).
--
-- KEYS[1] = this worker's holding hash (lua/_leases.lua), KEYS[2] = deliveries hash
-- KEYS[3] = dead-letter list, KEYS[4] = request queue, KEYS[5] = seeds key
-- KEYS[6] = crawl stats hash (counters: done, retried, dead; seeds_done, the seeds among
--            done: a seed's lease is done once its request is queued, and that request
--            is done again when fetched)
--            (a counter that is not an integer is restarted, and a key of another type
--            set aside when the call counts, lua/_leases.lua add_counts)
-- KEYS[7] = crawl epoch
-- ARGV[1] = worker id
-- ARGV[2] = how a request goes back to the queue: "rpush" | "lpush" | "level" | "zadd"
-- ARGV[3] = how a seed goes back to the seeds key: "lpush" | "sadd" | "zadd"
-- ARGV[4] = maximum deliveries of one entry
-- ARGV[5] = the crawl epoch this worker joined ("" = unfenced)
-- ARGV[6..] = pairs: lease id, outcome; outcome DONE ("") = done, HAND_BACK ("~") =
--             hand back (not counted as a delivery), DEAD_NOW .. record ("!<record>") =
--             dead-letter it now with this JSON record (a seed that can never become a
--             request), DEAD_BECAUSE .. reason ("#<reason>") = dead-letter the held
--             entry now with this reason, its delivery count kept (a callback that
--             raised, SCHEDULER_CALLBACK_ERRORS = "dead"), anything else = the
--             failure's reason (the constants are scrapy_dist/frontier/wire.py's)
-- Returns: {done, retried, dead, handed back, not ours}; an error "EPOCH ..." (or "TRYAGAIN ...", lua/_fence.lua) if the
--          crawl's epoch is not ARGV[5]
-- uses: _deadletter, _leases, _fence, _batch

local holding, deliveries, dead = KEYS[1], KEYS[2], KEYS[3]
local queue, seeds, stats = KEYS[4], KEYS[5], KEYS[6]
local worker, qback, sback = ARGV[1], ARGV[2], ARGV[3]
local max_deliveries = tonumber(ARGV[4])
local refused = fence(KEYS[7], ARGV[5])
if refused then
  return redis.error_reply(refused)
end
local now -- read from the server's clock when a dead-letter record needs it
local function clock()
  if not now then
    local t = redis.call("TIME")
    now = tonumber(t[1]) + tonumber(t[2]) / 1e6
  end
  return now
end

-- The common call: every outcome is "done" and no delivery count is kept (no entry is on
-- a second delivery). One HDEL settles them without reading a record: it deletes each
-- id held once, so an id not held (taken back) or repeated in the call is not ours, as
-- below.
local all_done = true
for i = 7, #ARGV, 2 do
  if ARGV[i] ~= DONE then
    all_done = false
    break
  end
end
if all_done and redis.call("EXISTS", deliveries) == 0 then
  local n = (#ARGV - 5) / 2
  -- seeds' leases (ids FROM_SEEDS..) are deleted apart, to count them as seeds_done (an
  -- id's first byte read as a number: no one-character string made per id)
  local seed_byte = string.byte(FROM_SEEDS)
  local seed_ids, request_ids = {}, array_of(n)
  for k = 1, n do
    local id = ARGV[4 + 2 * k]
    local list = string.byte(id) == seed_byte and seed_ids or request_ids
    list[#list + 1] = id
  end
  local function hdel(list)
    local count = 0
    for i = 1, #list, BATCH_ARGS do
      local last = math.min(i + BATCH_ARGS - 1, #list)
      count = count + redis.call("HDEL", holding, unpack(list, i, last))
    end
    return count
  end
  local seeds_removed = hdel(seed_ids)
  local removed = seeds_removed + hdel(request_ids)
  local buried = add_counts(stats, dead, {"done", removed, "seeds_done", seeds_removed},
    worker)
  return {removed, 0, buried, 0, n - removed}
end
-- (the libraries' other definitions go here)

local done, retried, buried, handed, lost, seeds_done = 0, 0, 0, 0, 0, 0
-- every dead-letter record goes through bury (a dead key of another type is set aside
-- first, lua/_leases.lua push_dead), counted as dead at the end
local function bury(record)
  buried = buried + push_dead(dead, record, clock(), worker)
end

-- a deliveries key that is not a hash is set aside first (lua/_leases.lua): reading it
-- would fail the call after a lease was dead-lettered, which the next try did again
local deliveries_aside = set_aside_deliveries(deliveries)
if deliveries_aside then
  bury(dead_json("request", "", deliveries_aside, clock(), worker, 0))
end

-- One HMGET of the records for the whole call; the leases settled are then deleted
-- with one HDEL (lua/_batch.lua). An id settled earlier in the same call is not ours
-- any more (its record is gone), as before.
local ids = {}
for i = 6, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
end
local records = batched({"HMGET", holding}, ids)

-- so is a queue or seeds key of another type than entries go back to, when one may go
-- back (a failed put-back stopped every settle of this worker)
for i = 7, #ARGV, 2 do
  local outcome = ARGV[i]
  if outcome ~= DONE and string.sub(outcome, 1, #DEAD_NOW) ~= DEAD_NOW
      and string.sub(outcome, 1, #DEAD_BECAUSE) ~= DEAD_BECAUSE then
    for _, reason in ipairs(set_aside_destinations(queue, qback, seeds, sback)) do
      bury(dead_json("request", "", reason, clock(), worker, 0))
    end
    break
  end
end

local settled, removed, cleared = {}, {}, {}
for k, id in ipairs(ids) do
  local outcome = ARGV[5 + 2 * k]
  local record = not settled[id] and records[k]
  local origin, score, entry
  if record then
    origin, score, entry = parse_holding(id, record)
  end
  if not record then
    lost = lost + 1
  else
    settled[id] = true
    removed[#removed + 1] = id
    if outcome == DONE then
      cleared[#cleared + 1] = id
      done = done + 1
      if origin == FROM_SEEDS then
        seeds_done = seeds_done + 1
      end
    elseif string.sub(outcome, 1, #DEAD_NOW) == DEAD_NOW then
      bury(string.sub(outcome, #DEAD_NOW + 1))
      cleared[#cleared + 1] = id
    elseif not origin then
      -- a record no reserve wrote (edited by hand): it cannot go back, it is kept aside
      bury(dead_json("request", record, malformed_reason(holding, id), clock(), worker,
        delivered(deliveries, {id})[1]))
      cleared[#cleared + 1] = id
    elseif string.sub(outcome, 1, #DEAD_BECAUSE) == DEAD_BECAUSE then
      bury(dead_record(origin, entry, string.sub(outcome, #DEAD_BECAUSE + 1), clock(), worker,
        delivered(deliveries, {id})[1]))
      cleared[#cleared + 1] = id
    elseif outcome == HAND_BACK then
      count_hand_back(deliveries, id, delivered(deliveries, {id})[1])
      return_entry(origin, score, entry, queue, qback, seeds, sback)
      handed = handed + 1
    else
      local times = delivered(deliveries, {id})[1]
      if times >= max_deliveries then
        local reason = outcome .. " (failed on " .. times .. " deliveries; "
          .. "SCHEDULER_MAX_DELIVERIES reached)"
        bury(dead_record(origin, entry, reason, clock(), worker, times))
        cleared[#cleared + 1] = id
      else
        count_return(deliveries, id, times)
        return_entry(origin, score, entry, queue, qback, seeds, sback)
        retried = retried + 1
      end
    end
  end
end
push_returned(function(key, kind, aside)
  bury(dead_json("request", "", set_aside_reason(key, kind, aside), clock(), worker, 0))
end)
batched({"HDEL", holding}, removed)
if #cleared > 0 and redis.call("EXISTS", deliveries) == 1 then
  batched({"HDEL", deliveries}, cleared)
end
-- a counter written by hand is restarted, not a failure after the writes (add_counts)
buried = buried + add_counts(stats, dead, {"done", done, "retried", retried, "dead", buried,
  "seeds_done", seeds_done}, worker)
return {done, retried, buried, handed, lost}
