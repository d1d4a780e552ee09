-- Lease up to COUNT entries to a worker: first return expired leases to where they came
-- from (or to the dead-letter list past the delivery limit), then move entries from the
-- source (request queue or seeds key) into this worker's holding and, when it granted
-- some, give every lease the worker holds a new deadline (lua/_leases.lua).
--
-- KEYS[1] = holders zset (worker id -> deadline of its leases, server time in seconds)
-- KEYS[2] = this worker's holding hash (lease id -> "<origin>|<score>|<data>")
-- KEYS[3] = deliveries hash (lease id -> times handed to a worker, from the second)
-- KEYS[4] = dead-letter list
-- KEYS[5] = request queue
-- KEYS[6] = seeds key
-- KEYS[7] = sequence counter (tells apart copies of one seed leased at the same time;
--           one written by hand is set aside and restarted, lua/_sequence.lua)
-- KEYS[8] = crawl progress hash (counters: dead, reclaimed: expired leases put back;
--            idle_since and finished_at are removed
--            when the call leases something: the crawl is busy again)
--            (a counter that is not an integer is restarted, and a key of another type
--            set aside when the call counts, lua/_leases.lua add_counts)
-- KEYS[9] = crawl epoch (string, see lua/_fence.lua)
-- KEYS[10] = the previous version's leases zset (lease id -> deadline; only reclaimed)
-- KEYS[11] = the previous version's leased hash (lease id -> "<origin>|<score>|<worker>|
--            <entry>"; only reclaimed)
-- KEYS[12..] = with ARGV[2] "slots" only, one key: the crawl's slot pauses (zset, slot
--            -> server ms its pause ends; lua/slot_pauses.lua): a paused slot waits
-- ARGV[1] = source to take from: FROM_QUEUE ("q", request queue) or FROM_SEEDS ("s")
-- ARGV[2] = how to take: "rpop" | "lpop" | "slots[:<order>]" (ARGV[11..14]) | "levels" (a priority queue's levels, highest
--           first, lua/_levels.lua; "levels:<order>" in the order <order> gives, two
--           letters "f"/"l", lua/_levels.lua take_levels) | "zpopmin" | "spop" | "zpopmax"
-- ARGV[3] = how a request goes back to the queue: "rpush" | "lpush" | "level" | "zadd"
-- ARGV[4] = how a seed goes back to the seeds key: "lpush" | "sadd" | "zadd"
-- ARGV[5] = COUNT, entries to lease (0 = only reclaim)
-- ARGV[6] = lease duration in seconds
-- ARGV[7] = worker id
-- ARGV[8] = maximum deliveries of one entry
-- ARGV[9] = maximum expired leases to reclaim in this call
-- ARGV[10] = the crawl epoch this worker joined ("" = unfenced)
-- ARGV[11..] = with ARGV[2] "slots" (a queue per download slot, lua/_levels.lua
--           take_slots and slot_rules; "slots:<order>" as "levels:<order>"): the delay
--           of a slot that has none of its own (seconds), the jitter (0 to 1), the most
--           taken from one slot without delay per round, a seed (1 to 2^31 - 2) for the
--           jitter's draws, then pairs: a slot and its own delay (DOWNLOAD_SLOTS)
-- Returns: flat array id1, deliveries1, entry1, id2, ... (entry = queue entry or raw
-- seed), then, only when the call put expired leases back where they came from, one
-- integer more: how many (so the worker that ran it can say so; its length is then one
-- more than a multiple of three, LeaseClient.leases); a queue per slot that gave less
-- than COUNT while a slot waits for its delay adds, after that count (then 0 if none),
-- the ms until the first waiting slot is ready (the length two more than a multiple); an error "EPOCH ..." (or "TRYAGAIN ...", lua/_fence.lua) if the crawl's epoch is not ARGV[10]
--
-- A queued request's lease id is its entry id. A seed carries no id, so its lease id is
-- derived from its content (FROM_SEEDS + 15 hex digits of its SHA-1): the same seed keeps its
-- id, and so its delivery count, each time its lease expires and it is read again. A
-- copy of a seed whose id is leased at that moment (by any worker: each holding is read)
-- gets "<id>:<n>" instead, whose count is not kept when it comes back.
--
-- A worker's own expired leases are reclaimed like any other's: it let them lapse (it
-- was paused past its lease, or it holds leases it no longer knows of, which a reserve
-- that grants nothing does not keep alive). A holding that is not a hash (written by
-- hand), this worker's or an expired one's, is renamed out of the way
-- ("<holding>:wrongtype", lua/_leases.lua) with a dead-letter record naming it (counted
-- as dead), before anything is taken; so is a holders key that is not a zset (its index
-- rebuilt from the holdings found, lua/_leases.lua rebuild_holders), a deliveries key
-- that is not a hash, and a queue or seeds key of another type than ARGV[3] or ARGV[4]
-- puts back to ("<key>:wrongtype"). A priority level that holds another type than a list (written by
-- hand) cannot be read: it is renamed out of the way ("<level>:wrongtype",
-- lua/_levels.lua) and leaves the queue's index, with a dead-letter record naming it
-- (counted as dead), and the other levels go on; the same when an entry is put back to
-- such a level. A lease record no reserve wrote is dead-lettered whole (malformed). A
-- dead-letter key of another type is renamed out of the way ("<dead>:wrongtype") when a
-- record is pushed, the record naming it going first into the fresh list.
-- A previous version's queue (a zset) found at the queue key when the levels run short
-- is moved into levels by the call (as much as it would take: lua/migrate.lua's step).
-- uses: _deadletter, _leases, _fence, _batch, _sequence

local holders, holding, deliveries, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue, seeds, seq, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local previous, previous_records = KEYS[10], KEYS[11]
local source, take, qback, sback = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local count, duration, worker = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local max_deliveries, reclaim_limit = tonumber(ARGV[8]), tonumber(ARGV[9])
local refused = fence(KEYS[9], ARGV[10])
if refused then
  return redis.error_reply(refused)
end

local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
-- the same time as a command's argument: a Lua number passed to redis.call is formatted
-- with snprintf, which costs more than the call's other work on an argument
local now_arg = t[1] .. "." .. string.rep("0", 6 - #t[2]) .. t[2]

-- every dead-letter record of the call, counted as dead at the end (one HINCRBY); a dead
-- key of another type is set aside first (push_dead, lua/_leases.lua)
local buried = 0
local function bury(record)
  buried = buried + push_dead(dead, record, now, worker)
end

-- a level renamed out of the way (lua/_levels.lua) is named in a dead-letter record
local function set_aside_loudly(key, kind, aside)
  bury(dead_json("request", "", set_aside_reason(key, kind, aside), now, worker, 0))
end

-- a holding that is not a hash is set aside (lua/_leases.lua), named in a dead-letter
-- record (counted as dead)
local function holding_aside(key, holder)
  local reason, hash = set_aside_holding(key)
  if reason then
    bury(dead_json("request", "", reason, now, holder, 0))
  end
  return reason, hash
end
-- this worker's first, before anything is taken that could not be recorded in it
holding_aside(holding, worker)
-- expired leases put back where they came from (the progress counter "reclaimed")
local returned = 0
-- (a holders key of another type, written by hand, is set aside and rebuilt first,
-- lua/_leases.lua rebuild_holders: every call would fail on it, the crawl stalled)
local expired_holders = redis.pcall("ZRANGEBYSCORE", holders, "-inf", now_arg, "LIMIT", "0",
  ARGV[9])
if expired_holders.err then
  -- (the libraries' definitions only this block uses go here)
  if string.sub(expired_holders.err, 1, 9) ~= "WRONGTYPE" then
    redis.call("ZRANGEBYSCORE", holders, "-inf", now_arg) -- fails with Redis's own error
  end
  bury(dead_json("request", "", rebuild_holders(holders, now + duration), now, worker, 0))
  expired_holders = {}
end
-- the previous version's expired leases, asked here when no holder's have expired (else
-- after those, with the budget they leave)
local expired_previous = #expired_holders == 0 and reclaim_limit > 0
  and redis.call("ZRANGEBYSCORE", previous, "-inf", now_arg, "LIMIT", "0", ARGV[9])
-- Only a call that finds expired leases runs this block, and builds what it uses.
if #expired_holders > 0 or (expired_previous and #expired_previous > 0) then
  -- (the libraries' definitions only this block uses go here)
  -- as this worker's holding above, before the first expired lease leaves its holding, a
  -- deliveries key that is not a hash and a queue or seeds key of another type than
  -- entries go back to are set aside: reading or putting back would fail the call after
  -- the holding was emptied (Redis keeps what was taken). Only a call that reclaims pays
  -- for the check.
  local guarded = false
  local function guard_reclaim()
    if guarded then
      return
    end
    guarded = true
    local counts_aside = set_aside_deliveries(deliveries)
    if counts_aside then
      bury(dead_json("request", "", counts_aside, now, worker, 0))
    end
    for _, reason in ipairs(set_aside_destinations(queue, qback, seeds, sback)) do
      bury(dead_json("request", "", reason, now, worker, 0))
    end
  end

  -- 1. reclaim expired leases, at most reclaim_limit: those of holders past their deadline
  -- (this worker's too), then the previous version's. Their delivery counts are
  -- written at the end, one HSET and one HDEL for the call (lua/_batch.lua): `counted`
  -- holds each id's count to keep (false: none), in the order first met (`recounted`), and
  -- is read before the hash meanwhile.
  local budget, counted, recounted = reclaim_limit, {}, {}
  local function recount(id, times)
    if counted[id] == nil then
      recounted[#recounted + 1] = id
    end
    counted[id] = times
  end
  local function times_of(ids)
    local times = delivered(deliveries, ids)
    for k, id in ipairs(ids) do
      if counted[id] ~= nil then
        times[k] = counted[id] or 1
      end
    end
    return times
  end
  local function reclaim(id, origin, score, entry, times, holder)
    if times >= max_deliveries then
      local reason = "lease expired on " .. times .. " deliveries (last held by " .. holder
        .. "); SCHEDULER_MAX_DELIVERIES reached"
      bury(dead_record(origin, entry, reason, now, holder, times))
      recount(id, false)
    else
      return_entry(origin, score, entry, queue, qback, seeds, sback)
      returned = returned + 1
      -- a copy's id is not kept across deliveries
      recount(id, not string.find(id, ":", 1, true) and times)
    end
  end
  -- a record no reserve wrote (edited by hand) is dead-lettered whole
  local function bury_malformed(key, id, record, holder, times)
    bury(dead_json("request", record, malformed_reason(key, id), now, holder, times))
    recount(id, false)
  end
  for _, holder in ipairs(expired_holders) do
    if budget <= 0 then
      break
    end
    guard_reclaim()
    local key = holding_key(holders, holder)
    if holder ~= worker and holding_aside(key, holder) then
      redis.call("ZREM", holders, holder)
    else
      local left = redis.call("HLEN", key)
      local flat
      if left <= budget then
        flat = redis.call("HGETALL", key)
        redis.call("UNLINK", key)
        redis.call("ZREM", holders, holder)
      else
        flat = redis.call("HRANDFIELD", key, budget, "WITHVALUES")
      end
      local ids = {}
      for i = 1, #flat, 2 do
        ids[#ids + 1] = flat[i]
      end
      if left > budget then
        batched({"HDEL", key}, ids)
      end
      budget = budget - #ids
      local times = times_of(ids)
      for k, id in ipairs(ids) do
        local origin, score, entry = parse_holding(id, flat[2 * k])
        if origin then
          reclaim(id, origin, score, entry, times[k], holder)
        else
          bury_malformed(key, id, flat[2 * k], holder, times[k])
        end
      end
    end
  end
  if budget > 0 then
    local expired = expired_previous or redis.call("ZRANGEBYSCORE", previous, "-inf", now_arg,
      "LIMIT", "0", budget == reclaim_limit and ARGV[9] or budget)
    if #expired > 0 then
      guard_reclaim()
      local records = batched({"HMGET", previous_records}, expired)
      local times = times_of(expired)
      batched({"ZREM", previous}, expired)
      batched({"HDEL", previous_records}, expired)
      for k, id in ipairs(expired) do
        if records[k] then
          local origin, score, holder, entry = parse_previous(records[k])
          if origin then
            reclaim(id, origin, score, entry, times[k], holder)
          else
            bury_malformed(previous_records, id, records[k], "", times[k])
          end
        end
      end
    end
  end
  local kept, forgotten = {}, {}
  for _, id in ipairs(recounted) do
    local times = counted[id]
    if times then
      kept[#kept + 1] = id
      kept[#kept + 1] = times
    else
      forgotten[#forgotten + 1] = id
    end
  end
  batched({"HSET", deliveries}, kept, 2)
  if #forgotten > 0 and redis.call("EXISTS", deliveries) == 1 then
    batched({"HDEL", deliveries}, forgotten)
  end
  -- (only a reclaim puts entries back: a call that does not has nothing to push)
  push_returned(set_aside_loudly)
end

-- 2. lease new entries: `entries`, and `scores`, the score each was taken at ("0" from a
-- list or a set). A number given to a command is formatted with snprintf, which costs
-- more than the command's own work on it: COUNT goes as ARGV's text when Redis reads
-- that text as COUNT (digits, no sign, point or leading zero; "5.0" from a float is
-- refused by a pop, and goes as a number).
local count_arg = string.find(ARGV[5], "^[1-9]%d*$") and ARGV[5] or count
local entries, scores = {}, {}
if count <= 0 then
  -- only reclaim
elseif take == "levels" or string.sub(take, 1, 7) == "levels:" then
  -- (the libraries' definitions only this block uses go here)
  local order = string.sub(take, 8)
  local function set_aside_broken(_, key, kind)
    set_aside_loudly(key, kind, set_aside(key))
    return true
  end
  entries, scores = take_levels(queue, count, set_aside_broken, count_arg, order)
  -- a previous version's queue still at the key (written after this worker opened and
  -- moved it: a previous version's worker started on the crawl since): move what this
  -- call would take, rather than wait beside it
  if #entries < count and marker_state(queue) == "zset" then
    move_previous(queue, count - #entries)
    local more, more_scores = take_levels(queue, count - #entries, set_aside_broken, nil, order)
    local n = #entries
    for k, entry in ipairs(more) do
      entries[n + k], scores[n + k] = entry, more_scores[k]
    end
  end
elseif take == "slots" or string.sub(take, 1, 6) == "slots:" then
  -- (the libraries' definitions only this block uses go here)
  -- (an index of another type would fail a write after entries were taken: set aside
  -- first, named in a dead-letter record)
  local aside = slot_keys_aside(queue)
  if aside then
    bury(dead_json("request", "", aside, now, worker, 0))
  end
  local rules = slot_rules(ARGV, 11)
  rules.on_junk = function(key, slot, value)
    bury(dead_json("request", "", key .. " held " .. string.format("%q", string.sub(value, 1, 100))
      .. " for slot " .. slot .. ", not a delay in seconds: deleted (a worker that read the "
      .. "site's robots.txt writes its Crawl-delay again within 30 s)", now, worker, 0))
  end
  entries, scores = take_slots(queue, count, now, rules, function(_, key, kind)
    set_aside_loudly(key, kind, set_aside(key))
    return true
  end, string.sub(take, 7), KEYS[12])
elseif take == "zpopmin" or take == "zpopmax" then
  local popped = redis.call(take == "zpopmin" and "ZPOPMIN" or "ZPOPMAX",
    source == FROM_QUEUE and queue or seeds, count_arg)
  for i = 1, #popped, 2 do
    entries[#entries + 1], scores[#scores + 1] = popped[i], popped[i + 1]
  end
else
  local popped = redis.call(string.upper(take), source == FROM_QUEUE and queue or seeds, count_arg)
  if popped then
    entries = popped
    for k = 1, #popped do
      scores[k] = "0"
    end
  end
end

-- [input] a queue entry that enqueue.lua did not write (no ENTRY_ID_LEN-digit id: pushed
-- by hand, say) cannot be leased: it is dead-lettered whole, alone, its bytes kept
-- readable (the record format is scrapy_dist/deadletter.py's), and the rest go on.
-- (The digits that start an entry, at least ENTRY_ID_LEN of them: one pattern item,
-- cheaper than ENTRY_ID_LEN of them. The entries kept are copied only from the first
-- malformed one on: most calls have none.)
if source == FROM_QUEUE then
  local kept, kept_scores
  for k, entry in ipairs(entries) do
    local _, digits = string.find(entry, "^%d+")
    if not (digits and digits >= ENTRY_ID_LEN) then
      if not kept then
        kept, kept_scores = {}, {}
        for j = 1, k - 1 do
          kept[j], kept_scores[j] = entries[j], scores[j]
        end
      end
      bury(dead_json("request", entry,
        "malformed queue entry: it does not start with the " .. ENTRY_ID_LEN
        .. "-digit entry id the enqueue script writes (pushed by hand? "
        .. "'scrapy-dist dead requeue' gives it one)",
        now, worker, 0))
    elseif kept then
      kept[#kept + 1], kept_scores[#kept_scores + 1] = entry, scores[k]
    end
  end
  if kept then
    entries, scores = kept, kept_scores
  end
end
-- [/input]

-- 3. the leases: ids first, then one variadic command per key (lua/_batch.lua)
local ids = array_of(#entries)
if source == FROM_QUEUE then
  for k, entry in ipairs(entries) do
    ids[k] = string.sub(entry, 1, ENTRY_ID_LEN)
  end
elseif #entries > 0 then
  -- (the libraries' definitions only this block uses go here)
  -- a seed's id is held by any worker (or by a previous version's lease): one HMGET
  -- per holding, one of the previous leased hash. The seeds are taken already: a key
  -- that is not a hash (written by hand, not set aside yet) holds none, it must not
  -- fail the call
  local held = {}
  for k, entry in ipairs(entries) do
    ids[k] = FROM_SEEDS .. string.sub(redis.sha1hex(entry), 1, 15)
  end
  local function note(key)
    for i = 1, #ids, BATCH_ARGS do
      local records = redis.pcall("HMGET", key, unpack(ids, i, math.min(i + BATCH_ARGS - 1, #ids)))
      if not records.err then
        for j, record in ipairs(records) do
          if record then
            held[ids[i + j - 1]] = true
          end
        end
      end
    end
  end
  for _, holder in ipairs(redis.call("ZRANGE", holders, 0, -1)) do
    note(holding_key(holders, holder))
  end
  note(holding) -- (this worker's, when it is not a holder yet)
  note(previous_records)
  for k, id in ipairs(ids) do
    if held[id] then
      -- a counter written by hand is restarted, not a failure after the pops
      local n, reason = next_ids(seq, 1)
      if reason then
        bury(dead_json("request", "", reason, now, worker, 0))
      end
      ids[k] = id .. ":" .. id_text(n)
    end
    held[id] = true -- leased by this call: a second copy in it gets its own id
  end
end

local result = {}
if #ids > 0 then
  -- deliveries: what HINCRBY id 1 would give each, an id leased twice in this call
  -- (one entry queued twice) counting twice; written only from the second delivery
  -- (a deliveries key of another type, unless a reclaim set it aside already, is set
  -- aside now: the entries are taken, nothing may fail)
  local before = {}
  -- (EXISTS first: cheaper than TYPE, whose reply is made a table, and most often the
  -- hash holds no count)
  local kind = redis.call("EXISTS", deliveries) == 1 and redis.call("TYPE", deliveries)["ok"]
    or "none"
  if kind == "hash" then
    before = batched({"HMGET", deliveries}, ids)
  elseif kind ~= "none" then
    -- (the libraries' definitions only this block uses go here)
    bury(dead_json("request", "", set_aside_deliveries(deliveries), now, worker, 0))
  end
  -- `counts`: each id's deliveries so far in this call, kept only when an id may come
  -- twice; ids in increasing order (one level's entries, oldest first) are all distinct
  -- (a key added to a table costs hundreds of instructions, more as the table grows)
  local counts, times_pairs, record_pairs = nil, {}, array_of(2 * #ids)
  for k = 2, #ids do
    if not (ids[k - 1] < ids[k]) then
      counts = {}
      break
    end
  end
  result = array_of(3 * #ids)
  for k, id in ipairs(ids) do
    local entry = entries[k]
    -- a count written by hand reads as one delivery, as delivered() reads it (failing
    -- here would lose the entries taken)
    local prior = before[k]
    local times = counts and counts[id] or (prior and (count_of(prior) or 1) or 0)
    times = times + 1
    if counts then
      counts[id] = times
    end
    if times > 1 then
      times_pairs[#times_pairs + 1] = id
      times_pairs[#times_pairs + 1] = times
    end
    record_pairs[2 * k - 1], record_pairs[2 * k] = id, holding_record(source, scores[k], entry)
    result[3 * k - 2], result[3 * k - 1], result[3 * k] = id, times, entry
  end
  batched({"HSET", deliveries}, times_pairs, 2)
  batched({"HSET", holding}, record_pairs, 2)
end
if #ids > 0 then
  redis.call("ZADD", holders, now + duration, worker)
  -- work taken: the crawl is busy again, so a completion mark (a worker that closed on
  -- an empty crawl while another, without CLOSE_WHEN_CRAWL_DONE, waits for seeds) and
  -- the idle clock no longer hold, nor the expiry a completion gave the hash (a
  -- progress key of another type has none of them)
  local cleared = redis.pcall("HDEL", stats, "idle_since", "finished_at")
  if type(cleared) == "number" and cleared > 0 then
    redis.call("PERSIST", stats)
  end
end
-- a counter written by hand is restarted, not a failure after the pops (add_counts; a
-- call with nothing to count has nothing to add)
if buried > 0 or returned > 0 then
  -- (the libraries' definitions only this block uses go here)
  add_counts(stats, dead, {"dead", buried, "reclaimed", returned}, worker)
end
-- the expired leases put back, after the leases: the worker logs them (no call of its own)
if returned > 0 then
  result[3 * #ids + 1] = returned
end
-- a queue per slot that gave less than asked: when its first waiting slot is ready, in
-- whole ms from now (the worker asks again then), after that count (0 if none)
if #ids < count and (take == "slots" or string.sub(take, 1, 6) == "slots:") then
  local first = redis.call("ZRANGE", queue .. SLOTS_WAIT_SUFFIX, 0, 0, "WITHSCORES")
  if first[2] then
    result[3 * #ids + 1] = returned
    -- (at most the longest delay or pause: a time written by hand may be anything)
    local ms = tonumber(first[2]) and math.ceil((tonumber(first[2]) - now) * 1000) or 0
    if ms ~= ms then
      ms = 0
    end
    result[3 * #ids + 2] = math.max(0, math.min(ms, 3600000))
  end
end
return result
