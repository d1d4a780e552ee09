-- Pop up to COUNT entries of a priority queue without leasing them (scrapy-redis's
-- queue.pop(), for scripts; workers lease, lua/reserve.lua): highest priority first,
-- first in first out within a level (lua/_levels.lua).
--
-- KEYS[1] = request queue (a priority queue's marker, or a queue per slot's)
-- ARGV[1] = COUNT
-- ARGV[2..] = for a queue per download slot only: as lua/reserve.lua's ARGV[11..]
--          (what a worker could lease now is popped: a slot waiting for its delay is
--          not, and one popped from waits as after a reserve)
-- Returns: the entries taken, in order; an error "WRONGTYPE ..." if the first level
--          to read holds another type than a list (nothing taken), "TRYAGAIN ..." while
--          the queue's hash slot is being moved to another cluster node (lua/_fence.lua)
-- uses: _levels, _fence

local queue, count = KEYS[1], tonumber(ARGV[1])
local moving = slot_moving(queue)
if moving then
  return redis.error_reply(moving)
end
local broken
local function on_broken(_, key, kind)
  broken = "WRONGTYPE priority level " .. key .. " holds a " .. kind .. ", not a list"
  return false
end
local entries
if #ARGV > 1 then
  local t = redis.call("TIME")
  local refusal = wrong_slot_index_refusal(queue)
  if refusal then
    return redis.error_reply(refusal)
  end
  entries = take_slots(queue, count, tonumber(t[1]) + tonumber(t[2]) / 1e6, slot_rules(ARGV, 2),
    on_broken)
else
  entries = take_levels(queue, count, on_broken)
end
if broken and #entries == 0 then
  return redis.error_reply(broken)
end
return entries
