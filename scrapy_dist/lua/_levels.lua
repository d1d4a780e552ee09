-- Library of the priority queue's levels (prepended by scrapy_dist/scripts.py to every
-- script whose header says "-- uses: _levels"). No KEYS or ARGV of its own.
--
-- A priority queue (queue kind "levels") keeps its entries in one list per priority
-- level, "<queue>:level:<name>" (LPUSH at the tail; taken with RPOP from the head, first
-- in first out, or with LPOP from the tail, last in first out, as the reserve asks), and
-- an index of the levels that hold entries, the zset "<queue>:levels" (member <name>,
-- score = the level's score, -priority: ZRANGE gives the highest priority first). Start
-- requests kept apart (scrapy_dist/queue.py) have a level of their own, scored half a
-- point after the others of their priority, and taken in their own order. The queue key itself holds the string LEVELS_MARKER: a previous version of
-- scrapy_dist, which kept the queue as one zset there, meets a string and fails with
-- WRONGTYPE instead of reading an empty queue. <name> is the score written with
-- LEVEL_FORMAT (exact for every integer priority). The key names are
-- scrapy_dist/keys.py's (LEVEL_INFIX, LEVELS_SUFFIX): level keys are built here
-- because which levels exist is only known inside a script; they carry the queue
-- key's hash tag, so they share its slot.
--
-- Invariant: a level list that holds entries is in the index (every push also ZADDs
-- its level); a level found empty is removed from the index by the script that finds
-- it so.
-- uses: _batch

-- The level name of a score (a number or its text).
local function level_name(score)
  local n = tonumber(score)
  if n == nil then
    error("not a priority queue score: " .. tostring(score))
  end
  if n == 0 then
    n = 0 -- no "-0" level
  end
  return string.format(LEVEL_FORMAT, n)
end

local function levels_key(queue)
  return queue .. LEVELS_SUFFIX
end

local function level_key(queue, name)
  return queue .. LEVEL_INFIX .. name
end

-- The queue key's state for a levels queue: "ok" (holds the marker), "none" (absent),
-- "zset" (a previous version's queue, not moved into levels yet) or the error text
-- (WRONGTYPE ...) for anything else. One GET in the usual case.
local function marker_state(queue)
  local value = redis.pcall("GET", queue)
  if type(value) == "table" and value.err then
    local kind = redis.call("TYPE", queue)["ok"]
    if kind == "zset" then
      return "zset"
    end
    return "WRONGTYPE " .. queue .. " holds a " .. kind .. ", not the priority queue's marker"
  end
  if value == false then
    return "none"
  end
  if value ~= LEVELS_MARKER then
    return "WRONGTYPE " .. queue .. " holds a string that is not the priority queue's "
      .. "marker (" .. string.sub(value, 1, 40) .. ")"
  end
  return "ok"
end

-- The refusal of a script that writes to a levels queue whose key is not ready, or nil
-- (the marker is written when absent).
local function levels_refusal(queue)
  local state = marker_state(queue)
  if state == "none" then
    redis.call("SET", queue, LEVELS_MARKER)
  elseif state == "zset" then
    return "WRONGTYPE " .. queue .. " holds a zset: a priority queue written by a previous "
      .. "version of scrapy_dist, not moved into levels yet (a worker of this version "
      .. "moves it when it opens, and so does 'scrapy-dist dead requeue')"
  elseif state ~= "ok" then
    return state
  end
  return nil
end

-- Add `entry` to level `name` of a batch for push_levels(): `by_level` maps a level name
-- to its entries, `order` lists the names in the order they first came. `size`, if
-- given, is at most how many entries the batch holds: the first level's array is
-- allocated for them at once (lua/_batch.lua array_of; a batch most often has one
-- level).
local function add_to_level(by_level, order, name, entry, size)
  local level = by_level[name]
  if level == nil then
    level = (size and #order == 0) and array_of(size) or {}
    by_level[name] = level
    order[#order + 1] = name
  end
  level[#level + 1] = entry
end

-- Push entries (oldest first) at the tail of their levels: `by_level` maps a level name
-- to its entries; `order` lists the names. One LPUSH per level, one ZADD of the
-- index. Returns nil, or the refusal (WRONGTYPE ...) when a level holds another type
-- (checked first when there are several levels, so that nothing is pushed; one level's
-- own LPUSH fails before anything is pushed).
local function push_levels(queue, by_level, order)
  if #order > 1 then
    for _, name in ipairs(order) do
      local kind = redis.call("TYPE", level_key(queue, name))["ok"]
      if kind ~= "none" and kind ~= "list" then
        return "WRONGTYPE " .. level_key(queue, name) .. " holds a " .. kind
      end
    end
  end
  local index = {}
  for _, name in ipairs(order) do
    batched({"LPUSH", level_key(queue, name)}, by_level[name])
    -- the name is the score's text (LEVEL_FORMAT, Redis's own for a score): given as
    -- the score too, it is not formatted again
    index[#index + 1] = name
    index[#index + 1] = name
  end
  batched({"ZADD", levels_key(queue)}, index, 2)
  return nil
end

-- Levels this call has put in the index (one ZADD per level, however many entries go
-- back to it); a level the call takes out of the index leaves it.
local indexed = {}
-- Entries put back by this call and not pushed yet, by level: {queue, name, entries}.
local returning, returning_order = {}, {}
-- Run by push_returned() once the levels are pushed: the slots section below sets it to
-- index the slots of a queue per download slot that entries went back to.
local after_returned = nil

-- Put one entry back at the head of its level, so that it comes out next among its
-- equals; several put back by one call come out oldest (lowest id) first. Pushed by
-- push_returned(), which the script calls once it has put back what it puts back.
local function put_back_level(queue, score, entry)
  local name = level_name(score)
  local key = level_key(queue, name)
  local level = returning[key]
  if level == nil then
    level = {queue, name, {}}
    returning[key] = level
    returning_order[#returning_order + 1] = key
  end
  level[3][#level[3] + 1] = entry
end

-- Rename level `key`, which holds another type than a list, out of the way (to
-- "<key>:wrongtype", or "<key>:wrongtype:<n>" if taken), so that entries can go back to
-- its level; returns the new name.
local function set_aside(key)
  local aside = key .. ":wrongtype"
  local n = 1
  while redis.call("RENAMENX", key, aside) == 0 do
    n = n + 1
    aside = key .. ":wrongtype:" .. n
  end
  return aside
end

-- The dead-letter reason of level `key`, which held a `kind` and was renamed to `aside`
-- (set_aside): what the scripts that set a level aside record.
local function set_aside_reason(key, kind, aside)
  return "priority level " .. key .. " held a " .. kind .. ", not a list of queue entries: "
    .. "renamed to " .. aside .. " and taken out of the queue (inspect it, push its "
    .. "requests again if it has any, then delete it)"
end

-- Push what put_back_level() collected: one RPUSH per level (newest first, so that the
-- oldest ends at the head) and one ZADD of the level into the index. A level that holds
-- another type than a list is renamed out of the way first (set_aside) and handed to
-- on_aside(key, kind, new name) if given (nothing put back is ever dropped).
local function push_returned(on_aside)
  for _, key in ipairs(returning_order) do
    local queue, name, entries = unpack(returning[key])
    table.sort(entries, function(a, b)
      return a > b
    end)
    local kind = redis.call("TYPE", key)["ok"]
    if kind ~= "none" and kind ~= "list" then
      local aside = set_aside(key)
      if on_aside then
        on_aside(key, kind, aside)
      end
    end
    -- indexed before the push: should the index refuse (another type, written by
    -- hand), nothing is pushed, and a call that retries does not push the entries twice
    local seen = levels_key(queue) .. "\0" .. name
    if not indexed[seen] then
      redis.call("ZADD", levels_key(queue), name, name) -- (the name is the score's text)
      indexed[seen] = true
    end
    batched({"RPUSH", key}, entries)
  end
  returning, returning_order = {}, {}
  if after_returned then
    after_returned()
  end
end

-- Take level `name` out of the index of `queue`.
local function unindex_level(queue, name)
  redis.call("ZREM", levels_key(queue), name)
  indexed[levels_key(queue) .. "\0" .. name] = nil
end

-- Take up to `count` entries, highest priority first, within a level in the order
-- `order` gives: nil or "ff" first in first out; two letters, "f" (first in first out)
-- or "l" (last in first out), for levels of whole scores and for start levels (a score
-- with a fraction) in turn. Returns two arrays: the entries, and each one's level score, the score as the
-- index holds it (always a number, so that a put-back finds its level even when the
-- level was named by hand with something else than a number). (Two arrays rather than a
-- pair per entry: a table costs ~1k instructions, bench_instructions.py --ops.) A level
-- found empty leaves the index. A level key of another type is handed to
-- on_broken(name, key, kind): it returns true to go on with the next levels (the level
-- then leaves the index; lua/reserve.lua has set it aside), false to stop.
-- Other errors (OOM, READONLY...) fail the call. `count_text`, if given, is `count`
-- as Redis reads a count, digits with no sign, point or leading zero (the caller
-- checks): a pop that asks for `count` takes it as it is (a number given to a command
-- is formatted with snprintf, which costs more than the command's own work on it).
-- `one_level`: stop after the first level that gave entries. A third value: the score
-- of the last level taken from when it still holds entries (it is then the best level
-- left), else nil (not known without a read).
local function take_levels(queue, count, on_broken, count_text, order, one_level)
  local entries, scores, index = {}, {}, levels_key(queue)
  local kept = nil -- the score of the last level taken from, while it holds entries
  local function arg_of(n)
    return n == count and count_text or n
  end
  local whole_pop = (order and string.sub(order, 1, 1) == "l") and "LPOP" or "RPOP"
  local start_pop = (order and string.sub(order, 2, 2) == "l") and "LPOP" or "RPOP"
  local function pop_of(score)
    local n = tonumber(score)
    return (n and n ~= math.floor(n)) and start_pop or whole_pop
  end
  while #entries < count do
    local ranked = redis.call("ZRANGE", index, "0", count - #entries - 1, "WITHSCORES")
    if #ranked == 0 then
      break
    end
    local removed = false
    for i = 1, #ranked, 2 do
      local name, score = ranked[i], ranked[i + 1]
      local want = count - #entries
      if want <= 0 then
        break
      end
      local key = level_key(queue, name)
      local pop = pop_of(score)
      local popped = redis.pcall(pop, key, arg_of(want))
      if type(popped) == "table" and popped.err then
        if string.sub(popped.err, 1, 9) ~= "WRONGTYPE" then
          -- fails the call with Redis's own error (the same arguments: the same refusal,
          -- nothing popped)
          redis.call(pop, key, arg_of(want))
        end
        if not on_broken(name, key, redis.call("TYPE", key)["ok"]) then
          return entries, scores, nil
        end
        unindex_level(queue, name)
        removed = true
      elseif not popped then
        unindex_level(queue, name)
        removed = true
      else
        if #entries == 0 then
          entries, scores = popped, array_of(#popped)
          for k = 1, #popped do
            scores[k] = score
          end
        else
          for _, entry in ipairs(popped) do
            entries[#entries + 1] = entry
            scores[#scores + 1] = score
          end
        end
        if #popped < want or redis.call("EXISTS", key) == 0 then
          unindex_level(queue, name)
          removed = true
          kept = nil
        else
          kept = score
        end
        if one_level then
          return entries, scores, kept
        end
      end
    end
    if not removed then
      break
    end
  end
  return entries, scores, kept
end

-- UNLINK a levels queue's lists and index (not the queue key itself).
local function unlink_levels(queue)
  local lists = {}
  for _, name in ipairs(redis.call("ZRANGE", levels_key(queue), 0, -1)) do
    lists[#lists + 1] = level_key(queue, name)
  end
  lists[#lists + 1] = levels_key(queue)
  batched({"UNLINK"}, lists)
end

-- Queues per download slot (queue kind "slots", scrapy_dist/slot_queue.py) ----------
--
-- The queue key holds SLOTS_MARKER. Each download slot has a levels queue of its own,
-- "<queue>:slot:<slot>" (its ":levels" index and ":level:<name>" lists, as above, with
-- no marker). A slot that holds entries is in one of two indexes (invariant):
-- "<queue>:ready" (slot -> the score of its best level: ZRANGE gives the highest
-- priority first) or "<queue>:wait" (slot -> the server time at which its delay lets
-- its next request go). A slot with a delay that a reserve emptied rests in
-- "<queue>:resting" (slot -> the same time) until then, so that a request queued for
-- it meanwhile waits too. "<queue>:queued" counts the entries of every slot
-- (slots_queued: a count that disagrees with the indexes is never read as an empty
-- queue; a slot's own are counted from its levels when asked, scrapy_dist/status.py).
-- "<queue>:delays" holds the robots.txt Crawl-delay (seconds) of a slot where it is
-- longer than the slot's own delay (the reserve carries those). Slot names come escaped
-- (scrapy_dist/keys.py slot_id: no "|"); a level score and its slot travel together as
-- "<score>@<slot>" (an entry's enqueue argument, a lease record's score: the score
-- never holds an "@").

local function slots_key(queue, suffix)
  return queue .. suffix
end

local function slot_queue(queue, slot)
  return queue .. SLOT_INFIX .. slot
end

-- "<score>@<slot>" split into score and slot; the slot is "" when the text has none
-- (a lease taken from another kind of queue before the crawl switched).
local function split_slot(text)
  local at = string.find(text, "@", 1, true)
  if not at then
    return text, ""
  end
  return string.sub(text, 1, at - 1), string.sub(text, at + 1)
end

-- The score of a slot's best level (text), or nil when it holds nothing.
local function slot_best(queue, slot)
  return redis.call("ZRANGE", slot_queue(queue, slot) .. LEVELS_SUFFIX, 0, 0, "WITHSCORES")[2]
end

-- The indexes of a queue per slot, the type each holds, and a command that reads that
-- type only (it fails on another).
local SLOT_INDEXES = {{SLOTS_READY_SUFFIX, "zset", "ZCARD"}, {SLOTS_WAIT_SUFFIX, "zset", "ZCARD"},
  {SLOTS_REST_SUFFIX, "zset", "ZCARD"}, {SLOTS_DELAYS_SUFFIX, "hash", "HLEN"}}

-- Each index of `queue` that holds another type than its own (written by hand): a
-- list of {key, type held, type wanted}. (Its reading command first: cheaper than TYPE,
-- whose reply is made a Lua table, and it answers for a key of its type or none.)
local function wrong_slot_indexes(queue)
  local wrong = {}
  for _, index in ipairs(SLOT_INDEXES) do
    local key = slots_key(queue, index[1])
    if type(redis.pcall(index[3], key)) ~= "number" then
      local kind = redis.call("TYPE", key)["ok"]
      if kind ~= "none" and kind ~= index[2] then
        wrong[#wrong + 1] = {key, kind, index[2]}
      end
    end
  end
  return wrong
end

-- The refusal (WRONGTYPE ...) naming the first index of `queue` that holds another type,
-- or nil.
local function wrong_slot_index_refusal(queue)
  local wrong = wrong_slot_indexes(queue)[1]
  if wrong then
    return "WRONGTYPE " .. wrong[1] .. " holds a " .. wrong[2] .. ", not the " .. wrong[3]
      .. " of a queue per download slot"
  end
  return nil
end

-- The refusal of a write to a queue per slot whose marker or indexes are not what they
-- should be (nothing written yet), or nil (the marker written when absent).
local function slots_refusal(queue)
  local value = redis.pcall("GET", queue)
  if type(value) == "table" and value.err then
    return "WRONGTYPE " .. queue .. " holds a " .. redis.call("TYPE", queue)["ok"]
      .. ", not the marker of a queue per download slot"
  end
  if value ~= false and value ~= SLOTS_MARKER then
    return "WRONGTYPE " .. queue .. " holds a string that is not the marker of a queue "
      .. "per download slot (" .. string.sub(value, 1, 40) .. ")"
  end
  local refusal = wrong_slot_index_refusal(queue)
  if refusal then
    return refusal
  end
  if value == false then
    redis.call("SET", queue, SLOTS_MARKER)
  end
  return nil
end

-- Before entries go back to a queue per slot after leaving a holding (they must not
-- fail): each index that holds another type is renamed out of the way (set_aside).
-- Returns the dead-letter reason naming them, or nil.
local function slot_keys_aside(queue)
  local said = {}
  for _, wrong in ipairs(wrong_slot_indexes(queue)) do
    said[#said + 1] = wrong[1] .. " held a " .. wrong[2] .. ", not the " .. wrong[3]
      .. " of a queue per download slot: renamed to " .. set_aside(wrong[1])
  end
  if #said == 0 then
    return nil
  end
  return table.concat(said, "; ") .. " (its slots are indexed again as entries come and "
    .. "go; inspect it, then delete it)"
end

-- Add `n` to the count of entries queued in `queue`'s slots; a count that is not one
-- (written by hand) starts again from `n` (slots_queued never trusts it alone: never a
-- reason to fail a call).
local function add_to_queued(queue, n)
  local key = slots_key(queue, SLOTS_QUEUED_SUFFIX)
  local done = redis.pcall("INCRBY", key, n)
  if type(done) == "table" then
    redis.call("SET", key, math.max(n, 0))
  end
end

-- Index the slots `slots` that were just given entries: `added[slot]` of them, the best
-- at score `best[slot]`. A slot that waits stays waiting, one that rests until later
-- waits until then, the others are ready at their best score (ZADD LT: a ready slot
-- keeps a better score it has); then they are counted (queued).
local function index_slots(queue, slots, best, added)
  if #slots == 0 then
    return
  end
  local wait, resting = slots_key(queue, SLOTS_WAIT_SUFFIX), slots_key(queue, SLOTS_REST_SUFFIX)
  local waiting = batched({"ZMSCORE", wait}, slots)
  local rest_until = batched({"ZMSCORE", resting}, slots)
  local now
  local ready_pairs, wait_pairs, woken = {}, {}, {}
  for k, slot in ipairs(slots) do
    if not waiting[k] then
      local until_ = tonumber(rest_until[k] or nil)
      if until_ then
        woken[#woken + 1] = slot
        if not now then
          local t = redis.call("TIME")
          now = tonumber(t[1]) + tonumber(t[2]) / 1e6
        end
      end
      -- (a rest further ahead than any reserve sets one is garbage: the slot is ready)
      if until_ and until_ > now and until_ <= now + SLOT_WAIT_MAX then
        wait_pairs[#wait_pairs + 1] = rest_until[k]
        wait_pairs[#wait_pairs + 1] = slot
      else
        ready_pairs[#ready_pairs + 1] = best[slot]
        ready_pairs[#ready_pairs + 1] = slot
      end
    end
  end
  batched({"ZADD", wait}, wait_pairs, 2) -- (before they leave the resting ones)
  batched({"ZREM", resting}, woken)
  batched({"ZADD", slots_key(queue, SLOTS_READY_SUFFIX), "LT"}, ready_pairs, 2)
  local total = 0
  for _, slot in ipairs(slots) do
    total = total + added[slot]
  end
  add_to_queued(queue, total)
end

-- Add `entry` at `score` (text) to slot `slot` of a batch for push_slots(): `by_slot`
-- maps a slot to {by_level, order, entries, best score}; `slots` lists the slots in the
-- order they first came. `name`, if given, is level_name(score), known already.
local function add_to_slot(by_slot, slots, slot, score, entry, name)
  local s = by_slot[slot]
  if s == nil then
    s = {{}, {}, 0, score}
    by_slot[slot] = s
    slots[#slots + 1] = slot
  end
  add_to_level(s[1], s[2], name or level_name(score), entry)
  s[3] = s[3] + 1
  if score ~= s[4] and tonumber(score) < tonumber(s[4]) then
    s[4] = score
  end
end

-- Push a batch (add_to_slot) at the tail of its slots' levels and index the slots.
-- Returns nil, or the refusal (WRONGTYPE ...) when a level holds another type (nothing
-- pushed: with several slots, every level is checked first; one slot's push_levels
-- fails before it pushes).
local function push_slots(queue, by_slot, slots)
  if #slots > 1 then
    for _, slot in ipairs(slots) do
      for _, name in ipairs(by_slot[slot][2]) do
        local key = level_key(slot_queue(queue, slot), name)
        local kind = redis.call("TYPE", key)["ok"]
        if kind ~= "none" and kind ~= "list" then
          return "WRONGTYPE " .. key .. " holds a " .. kind
        end
      end
    end
  end
  local done, best, added = {}, {}, {}
  local refusal
  for _, slot in ipairs(slots) do
    local s = by_slot[slot]
    refusal = push_levels(slot_queue(queue, slot), s[1], s[2])
    if refusal then
      break
    end
    done[#done + 1] = slot
    best[slot], added[slot] = s[4], s[3]
  end
  index_slots(queue, done, best, added)
  return refusal
end

-- Entries put back to a queue per slot by this call, not indexed yet: queue -> {slots,
-- best, added}, and the queues in the order first met.
local returned_slots, returned_queues = {}, {}

-- Put one entry back at the head of its level in its slot (`score`: "<score>@<slot>",
-- as a lease record holds it); pushed and indexed by push_returned().
local function put_back_slot(queue, score, entry)
  local level, slot = split_slot(score)
  put_back_level(slot_queue(queue, slot), level, entry)
  local q = returned_slots[queue]
  if q == nil then
    q = {{}, {}, {}}
    returned_slots[queue] = q
    returned_queues[#returned_queues + 1] = queue
  end
  if q[3][slot] == nil then
    q[1][#q[1] + 1] = slot
    q[2][slot], q[3][slot] = level, 0
  elseif tonumber(level) < tonumber(q[2][slot]) then
    q[2][slot] = level
  end
  q[3][slot] = q[3][slot] + 1
end

after_returned = function()
  for _, queue in ipairs(returned_queues) do
    local q = returned_slots[queue]
    index_slots(queue, q[1], q[2], q[3])
  end
  returned_slots, returned_queues = {}, {}
end

-- The slots of `ranked` (ready slots of `queue`) that are not paused in `paused` (see
-- take_slots); the paused ones leave the ready slots to wait until their pause ends.
local function unpaused(queue, ranked, paused, now)
  local names = {}
  for k, slot in ipairs(ranked) do
    -- a pause names the slot as Scrapy does: unescaped (scrapy_dist/keys.py slot_id)
    names[k] = string.gsub(string.gsub(slot, "%%7C", "|"), "%%25", "%%")
  end
  local ends = batched({"ZMSCORE", paused}, names)
  local kept, waits, gone = {}, {}, {}
  for k, slot in ipairs(ranked) do
    local until_ = tonumber(ends[k] or nil)
    if until_ and until_ == until_ and until_ ~= math.huge and until_ / 1000 > now then
      gone[#gone + 1] = slot
      -- (a longer pause is looked at again then: a wait beyond it is garbage)
      waits[#waits + 1] = math.min(until_ / 1000, now + SLOT_WAIT_MAX)
      waits[#waits + 1] = slot
    else
      kept[#kept + 1] = slot
    end
  end
  batched({"ZREM", queue .. SLOTS_READY_SUFFIX}, gone)
  batched({"ZADD", queue .. SLOTS_WAIT_SUFFIX}, waits, 2)
  return kept
end

-- Slots whose wait ended that one call moves back to the ready ones, at most.
local DUE_MAX = 1000

-- (SLOT_DELAY_MAX, scrapy_dist/frontier/wire.py: the longest delay a slot is given; a
-- robots.txt Crawl-delay, or a delay written by hand, asking for more is cut to it)

-- A delay as a number of seconds from 0 to SLOT_DELAY_MAX, or nil for anything else
-- (junk, nan, inf written by hand).
local function delay_of(value)
  local d = tonumber(value)
  if d == nil or d ~= d or d < 0 or d == math.huge then
    return nil
  end
  return math.min(d, SLOT_DELAY_MAX)
end

-- How a reserve takes from a queue per slot, from the arguments at `argv[first..]`
-- (lua/reserve.lua ARGV[11..]): the default delay (seconds), the jitter (0 to 1), the
-- most taken from a slot without delay per round, a seed for the jitter's draws, then
-- pairs of a slot (escaped) and its own delay (DOWNLOAD_SLOTS).
local function slot_rules(argv, first)
  local rules = {
    delay = delay_of(argv[first]) or 0,
    jitter = math.max(0, math.min(1, tonumber(argv[first + 1]) or 0)),
    cap = math.max(1, tonumber(argv[first + 2]) or 1),
    seed = tonumber(argv[first + 3]) or 1,
    own = {},
  }
  for i = first + 4, #argv - 1, 2 do
    rules.own[argv[i]] = delay_of(argv[i + 1])
  end
  return rules
end

-- Take up to `count` entries from the ready slots, highest priority first (the order
-- within a slot as take_levels has it): one from a slot with a delay (`rules.own`'s, or
-- `rules.delay`, raised to a robots.txt Crawl-delay the delays hash holds), which then
-- waits until `now` plus its delay lengthened by up to `rules.jitter` times it at random
-- (`rules.seed`, a number from 1 to 2^31 - 2, seeds the draws); at most `rules.cap`
-- from a slot without one in each round over the ready slots (all that are asked when
-- one slot is ready). First, the slots whose wait ended are ready again (those emptied
-- meanwhile leave the indexes). Returns the entries and each one's "<level
-- score>@<slot>" (what put_back_slot reads back). `on_broken` as take_levels's.
-- `rules.on_junk`, if set, is called with the delays hash, a slot and the field's value
-- when the field holds no delay (junk, nan, inf written by hand), after deleting it.
-- `paused`, if given, is the crawl's zset of slot pauses (slot as Scrapy names it ->
-- server time in ms the pause ends, scrapy_dist/worker/pauses.py): a ready slot paused
-- beyond now waits until its pause ends instead (a key of another type: no pauses).
-- The caller has made sure the indexes are of their types (slot_keys_aside): a write
-- that failed after entries were taken would lose them.
local function take_slots(queue, count, now, rules, on_broken, order, paused)
  local ready = slots_key(queue, SLOTS_READY_SUFFIX)
  local wait = slots_key(queue, SLOTS_WAIT_SUFFIX)
  local resting = slots_key(queue, SLOTS_REST_SUFFIX)
  local due = redis.call("ZRANGEBYSCORE", wait, "-inf", now, "LIMIT", 0, DUE_MAX)
  -- a wait further ahead than any reserve sets one (written by hand, garbage) ends now
  local far = redis.call("ZRANGEBYSCORE", wait, "(" .. (now + SLOT_WAIT_MAX), "+inf",
    "LIMIT", 0, DUE_MAX)
  for _, slot in ipairs(far) do
    due[#due + 1] = slot
  end
  if #due > 0 then
    local back = {}
    for _, slot in ipairs(due) do
      local best = slot_best(queue, slot)
      if best then
        back[#back + 1] = best
        back[#back + 1] = slot
      end
    end
    batched({"ZADD", ready}, back, 2) -- (before they leave the waiting ones)
    batched({"ZREM", wait}, due)
  end
  redis.call("ZREMRANGEBYSCORE", resting, "-inf", now)
  redis.call("ZREMRANGEBYSCORE", resting, "(" .. (now + SLOT_WAIT_MAX), "+inf")
  local entries, scores = {}, {}
  local delays_key = slots_key(queue, SLOTS_DELAYS_SUFFIX)
  local own_delays = redis.call("EXISTS", delays_key) == 1
  local taken, draw = 0, rules.seed
  -- (a zset of pauses holds some: ZCARD fails on another type, gives 0 for none, and
  -- costs less than TYPE, whose reply is made a Lua table)
  local pauses = paused and redis.pcall("ZCARD", paused)
  paused = type(pauses) == "number" and pauses > 0 and paused or nil
  while #entries < count do
    local ranked = redis.call("ZRANGE", ready, 0, count - #entries - 1)
    if #ranked == 0 then
      break
    end
    if paused then
      ranked = unpaused(queue, ranked, paused, now)
    end
    local delays = own_delays and batched({"HMGET", delays_key}, ranked) or {}
    local per = #ranked == 1 and count or rules.cap
    local moved, unready, waits, rests = false, {}, {}, {}
    for k, slot in ipairs(ranked) do
      local want = count - #entries
      if want <= 0 then
        break
      end
      local d = rules.own[slot] or rules.delay
      local crawl_delay = delay_of(delays[k] or nil)
      if crawl_delay and crawl_delay > d then
        d = crawl_delay
      elseif delays[k] and not crawl_delay and rules.on_junk then
        -- a field that holds no delay (written by hand): deleted and said (the workers
        -- that know the site's Crawl-delay write it again)
        redis.call("HDEL", delays_key, slot)
        rules.on_junk(delays_key, slot, delays[k])
      end
      -- several slots: one level per visit, so that a slot's lower priorities wait for
      -- the other slots' higher ones (the slots are ranked again after each round)
      local got, levels, best = take_levels(slot_queue(queue, slot),
        d > 0 and 1 or math.min(want, per), on_broken, nil, order, #ranked > 1)
      local level, at -- (one text per level: a slot's entries most often share it)
      for j, entry in ipairs(got) do
        if levels[j] ~= level then
          level, at = levels[j], levels[j] .. "@" .. slot
        end
        entries[#entries + 1] = entry
        scores[#scores + 1] = at
      end
      if #got > 0 then
        moved = true
        taken = taken + #got
      end
      if d > 0 and #got > 0 then
        unready[#unready + 1] = slot
        draw = (draw * 16807) % 2147483647
        local next_at = now + d * (1 + rules.jitter * draw / 2147483647)
        if best or redis.call("EXISTS", slot_queue(queue, slot) .. LEVELS_SUFFIX) == 1 then
          waits[#waits + 1] = next_at
          waits[#waits + 1] = slot
        else
          rests[#rests + 1] = next_at
          rests[#rests + 1] = slot
        end
      else
        -- its best level: the one taken from if it holds more (the ready score stays
        -- when that was the best already), else read
        if best == nil or #got == 0 then
          best = slot_best(queue, slot)
        elseif best == levels[1] then
          best = false
        end
        if best then
          redis.call("ZADD", ready, "XX", best, slot)
        elseif best == nil then
          -- emptied (or found empty: indexed by hand, say)
          unready[#unready + 1] = slot
          moved = true
        end
      end
    end
    batched({"ZREM", ready}, unready)
    batched({"ZADD", wait}, waits, 2)
    batched({"ZADD", resting}, rests, 2)
    if not moved then
      break
    end
  end
  if taken > 0 then
    add_to_queued(queue, -taken)
  end
  return entries, scores
end

-- Entries queued in a queue per slot: its count, or, when the count says none (or is
-- not a count), how many slots its indexes hold (a queue whose indexes hold a slot is
-- never read as empty; one whose indexes are empty is, whatever its count says).
local function slots_queued(queue)
  local indexed = redis.call("ZCARD", slots_key(queue, SLOTS_READY_SUFFIX))
    + redis.call("ZCARD", slots_key(queue, SLOTS_WAIT_SUFFIX))
  if indexed == 0 then
    return 0
  end
  local count = redis.pcall("GET", slots_key(queue, SLOTS_QUEUED_SUFFIX))
  local n = type(count) == "string" and tonumber(count) or nil
  if n and n >= indexed then
    return n
  end
  return indexed
end

-- UNLINK a queue per slot's slots (their levels) and indexes (not the queue key).
local function unlink_slots(queue)
  local slots = {}
  for _, suffix in ipairs({SLOTS_READY_SUFFIX, SLOTS_WAIT_SUFFIX, SLOTS_REST_SUFFIX}) do
    local members = redis.pcall("ZRANGE", slots_key(queue, suffix), 0, -1)
    for _, slot in ipairs(members.err and {} or members) do -- (another type: no slots)
      slots[slot] = true
    end
  end
  for slot in pairs(slots) do
    unlink_levels(slot_queue(queue, slot))
  end
  local keys = {}
  for _, suffix in ipairs({SLOTS_READY_SUFFIX, SLOTS_WAIT_SUFFIX, SLOTS_REST_SUFFIX,
    SLOTS_QUEUED_SUFFIX, SLOTS_DELAYS_SUFFIX}) do
    keys[#keys + 1] = slots_key(queue, suffix)
  end
  redis.call("UNLINK", unpack(keys))
end

-- Move up to `count` entries of a previous version's queue (a zset of "<id><payload>"
-- entries, score = -priority, at the queue key) to the tail of their levels, lowest
-- score and oldest id first, and write the marker when the zset is empty. Returns the
-- entries moved and those left, or nil, nil and the refusal (WRONGTYPE ...) when a level
-- holds another type (nothing moved). The caller has checked that the key is a zset.
local function move_previous(queue, count)
  local popped = redis.call("ZRANGE", queue, 0, count - 1, "WITHSCORES")
  local by_level, order, members = {}, {}, {}
  for i = 1, #popped, 2 do
    local entry, name = popped[i], level_name(popped[i + 1])
    add_to_level(by_level, order, name, entry)
    members[#members + 1] = entry
  end
  local refusal = push_levels(queue, by_level, order)
  if refusal then
    return nil, nil, refusal
  end
  batched({"ZREM", queue}, members)
  local left = redis.call("ZCARD", queue)
  if left == 0 then
    redis.call("SET", queue, LEVELS_MARKER)
  end
  return #members, left, nil
end

-- Entries queued in a queue of kind `kind` ("list" or "levels"), and nil; or nil and
-- the refusal (WRONGTYPE ...) when the queue key holds another type. A levels queue
-- counts its levels (one LLEN each: a level of another type fails the call) and, while
-- a previous version's zset is still at the queue key, that zset's entries too. A
-- queue that cannot be read is never counted as empty.
local function queued_count(queue, kind)
  if kind == "slots" then
    local value = redis.pcall("GET", queue)
    if type(value) == "table" and value.err then
      return nil, "WRONGTYPE " .. queue .. " holds a " .. redis.call("TYPE", queue)["ok"]
        .. ", not the marker of a queue per download slot"
    end
    return slots_queued(queue), nil
  end
  if kind ~= "levels" then
    if kind == "zset" then
      return redis.call("ZCARD", queue), nil
    end
    return redis.call("LLEN", queue), nil
  end
  local state, n = marker_state(queue), 0
  if state == "zset" then
    n = redis.call("ZCARD", queue)
  elseif state ~= "ok" and state ~= "none" then
    return nil, state
  end
  for _, name in ipairs(redis.call("ZRANGE", levels_key(queue), 0, -1)) do
    n = n + redis.call("LLEN", level_key(queue, name))
  end
  return n, nil
end

-- UNLINK keys[from..]; a key that holds LEVELS_MARKER takes its levels with it, and so
-- does an absent key whose index of levels exists (the marker deleted alone, by hand or
-- by an eviction: its levels are still the queue's); the holders zset (HOLDERS_SUFFIX)
-- takes its workers' holdings.
local function unlink_frontier(keys, from)
  for i = from, #keys do
    local key = keys[i]
    local kind = redis.call("TYPE", key)["ok"]
    if (kind == "string" and redis.call("GET", key) == LEVELS_MARKER)
      or (kind == "none" and redis.call("TYPE", levels_key(key))["ok"] == "zset") then
      unlink_levels(key)
    elseif kind == "string" and redis.call("GET", key) == SLOTS_MARKER then
      unlink_slots(key)
    elseif kind == "zset" and string.sub(key, -#HOLDERS_SUFFIX) == HOLDERS_SUFFIX then
      -- the holders zset takes its workers' holdings (lua/_leases.lua holding_key)
      for _, worker in ipairs(redis.call("ZRANGE", key, 0, -1)) do
        redis.call("UNLINK", key .. ":" .. worker)
      end
    end
    redis.call("UNLINK", key)
  end
end
