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
    batched({"RPUSH", key}, entries)
    local seen = levels_key(queue) .. "\0" .. name
    if not indexed[seen] then
      redis.call("ZADD", levels_key(queue), name, name) -- (the name is the score's text)
      indexed[seen] = true
    end
  end
  returning, returning_order = {}, {}
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
local function take_levels(queue, count, on_broken, count_text, order)
  local entries, scores, index = {}, {}, levels_key(queue)
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
          return entries, scores
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
        end
      end
    end
    if not removed then
      break
    end
  end
  return entries, scores
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

-- UNLINK a levels queue's lists and index (not the queue key itself).
local function unlink_levels(queue)
  local lists = {}
  for _, name in ipairs(redis.call("ZRANGE", levels_key(queue), 0, -1)) do
    lists[#lists + 1] = level_key(queue, name)
  end
  lists[#lists + 1] = levels_key(queue)
  batched({"UNLINK"}, lists)
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
    elseif kind == "zset" and string.sub(key, -#HOLDERS_SUFFIX) == HOLDERS_SUFFIX then
      -- the holders zset takes its workers' holdings (lua/_leases.lua holding_key)
      for _, worker in ipairs(redis.call("ZRANGE", key, 0, -1)) do
        redis.call("UNLINK", key .. ":" .. worker)
      end
    end
    redis.call("UNLINK", key)
  end
end
