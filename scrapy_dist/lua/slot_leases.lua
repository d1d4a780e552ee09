-- Give the leases a worker took from a priority queue, before its crawl moved into a
-- queue per download slot, the slot their put-back needs: "q|<score>|<payload>" becomes
-- "q|<score>@<slot>|<payload>" (lua/_leases.lua, lua/_levels.lua put_back_slot), so that
-- an expired or failed one goes back to its own slot and waits for its delay, not to the
-- slot "" (scrapy_dist/slot_queue.py SlotQueue.migrate reads the slot from the payload).
-- A record is rewritten only if it is still the one read: a worker that settled it
-- meanwhile keeps what it wrote.
--
-- KEYS[1] = a worker's holding hash (lease id -> record)
-- ARGV = triples: lease id, its record as read, the record with its slot
-- Returns: how many records were rewritten
-- uses: _fence

local moving = slot_moving(KEYS[1])
if moving then
  return redis.error_reply(moving)
end
local n = 0
for i = 1, #ARGV - 2, 3 do
  if redis.call("HGET", KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call("HSET", KEYS[1], ARGV[i], ARGV[i + 2])
    n = n + 1
  end
end
return n
