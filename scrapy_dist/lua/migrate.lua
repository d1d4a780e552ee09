-- Move a priority queue written by a previous version of scrapy_dist (one zset of
-- "<id><payload>" entries, score = -priority, at the queue key) into levels
-- (lua/_levels.lua), at most COUNT entries per call, each call atomic: a worker killed
-- between two calls leaves every entry either in the zset or in its level, and two
-- workers moving the same queue at once each move different entries. Entries keep
-- their order: lowest score (highest priority) and oldest id first, each pushed at the
-- tail of its level. The call that empties the zset writes the marker in its place.
--
-- KEYS[1] = request queue
-- ARGV[1] = COUNT, entries to move in this call
-- Returns: {entries moved, entries left in the zset}; an error "WRONGTYPE ..." if the
--          key holds neither a zset nor the marker (nothing moved), "TRYAGAIN ..." while
--          the queue's hash slot is being moved to another cluster node (lua/_fence.lua)
-- uses: _levels, _fence

local queue, count = KEYS[1], tonumber(ARGV[1])
local moving = slot_moving(queue)
if moving then
  return redis.error_reply(moving)
end
local state = marker_state(queue)
if state == "ok" then
  return {0, 0}
elseif state == "none" then
  redis.call("SET", queue, LEVELS_MARKER)
  return {0, 0}
elseif state ~= "zset" then
  return redis.error_reply(state)
end
local moved, left, refusal = move_previous(queue, count)
if refusal then
  return redis.error_reply(refusal)
end
return {moved, left}
