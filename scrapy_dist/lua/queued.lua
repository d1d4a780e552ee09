-- Count the entries of a request queue (a priority queue's levels together), in one
-- call: what len() of a queue object answers.
--
-- KEYS[1] = request queue (a list, or a priority queue's marker, lua/_levels.lua)
-- ARGV[1] = queue kind ("list" or "levels")
-- Returns: the number of entries; an error "WRONGTYPE ..." if the queue cannot be
--          counted
-- uses: _levels

local queued, refusal = queued_count(KEYS[1], ARGV[1])
if refusal then
  return redis.error_reply(refusal)
end
return queued
