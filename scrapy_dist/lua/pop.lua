-- Pop up to COUNT entries of a priority queue without leasing them (scrapy-redis's
-- queue.pop(), for scripts; workers lease, lua/reserve.lua): highest priority first,
-- first in first out within a level (lua/_levels.lua).
--
-- KEYS[1] = request queue (a priority queue's marker)
-- ARGV[1] = COUNT
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
local entries = take_levels(queue, count, function(name, key, kind)
  broken = "WRONGTYPE priority level " .. key .. " holds a " .. kind .. ", not a list"
  return false
end)
if broken and #entries == 0 then
  return redis.error_reply(broken)
end
return entries
