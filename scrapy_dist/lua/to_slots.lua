-- Move the oldest entries of one level of a priority queue (lua/_levels.lua) into the
-- queue per download slot at the same key (lua/_levels.lua's slots section): what a
-- crawl needs when its SCHEDULER_QUEUE_CLASS changes from PriorityQueue to SlotQueue
-- (scrapy_dist/slot_queue.py SlotQueue.migrate). Each call is atomic and checks that
-- the entries it is given are still the oldest of their level, so a worker killed
-- between two calls leaves every entry either in its level or in its slot, and two
-- workers moving at once never move one entry twice. The entries keep their ids (and
-- so their delivery counts), their priority and, within a slot, their order. The call
-- that empties the last level writes the queue per slot's marker in place of the
-- priority queue's.
--
-- KEYS[1] = request queue
-- ARGV[1] = the level's name (lua/_levels.lua level_name)
-- ARGV[2..] = pairs, oldest first: an entry (as the level holds it), and its
--             "<score>@<slot>" (the level's score; its slot as scrapy_dist/keys.py
--             slot_id writes it); none: the level is empty (it leaves the index)
-- Returns: {entries moved (-1: the level's oldest entries are not those given, nothing
--          moved: read them again), levels left}; an error "WRONGTYPE ..." if the key
--          holds neither marker, or a level or slot key another type (nothing moved),
--          "TRYAGAIN ..." while the queue's hash slot is being moved (lua/_fence.lua)
-- uses: _levels, _fence

local queue, name = KEYS[1], ARGV[1]
local moving = slot_moving(queue)
if moving then
  return redis.error_reply(moving)
end
local state = marker_state(queue)
if state == "none" or (state ~= "ok" and redis.pcall("GET", queue) == SLOTS_MARKER) then
  return {0, 0}
elseif state == "zset" then
  return redis.error_reply("WRONGTYPE " .. queue .. " holds a priority queue of a previous "
    .. "version (a zset): open the crawl with PriorityQueue once, which moves it into levels")
elseif state ~= "ok" then
  return redis.error_reply(state)
end
local level = level_key(queue, name)
local n = math.floor((#ARGV - 1) / 2)
-- The reply once `moved` entries left the level: a level found empty leaves the index
-- (lua/_levels.lua's invariant allows one until a script finds it so), and the call that
-- empties the last level writes the queue per slot's marker.
local function done(moved)
  if redis.call("LLEN", level) == 0 then
    unindex_level(queue, name)
    redis.call("UNLINK", level)
  end
  local left = redis.call("ZCARD", levels_key(queue))
  if left == 0 then
    redis.call("UNLINK", levels_key(queue))
    redis.call("SET", queue, SLOTS_MARKER)
  end
  return {moved, left}
end
if n == 0 then
  return done(0)
end
local tail = redis.call("LRANGE", level, -n, -1) -- (newest first: the oldest is last)
if #tail ~= n then
  return {-1, redis.call("ZCARD", levels_key(queue))}
end
for i = 1, n do
  if tail[n + 1 - i] ~= ARGV[2 * i] then
    return {-1, redis.call("ZCARD", levels_key(queue))}
  end
end
local refusal = wrong_slot_index_refusal(queue)
if refusal then
  return redis.error_reply(refusal)
end
local by_slot, slots = {}, {}
for i = 1, n do
  local score, slot = split_slot(ARGV[2 * i + 1])
  add_to_slot(by_slot, slots, slot, score, ARGV[2 * i])
end
-- (a level of another type refuses the push before anything is pushed, push_slots:
-- a push that failed half-way would leave entries both in their slot and in the level)
refusal = push_slots(queue, by_slot, slots)
if refusal then
  return redis.error_reply(refusal)
end
redis.call("LTRIM", level, 0, -(n + 1))
return done(n)
