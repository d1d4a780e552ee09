-- Move an item between the items stream and its dead-letter stream atomically
-- (scrapy_dist/streams.py): an entry is never both pending in a group and dead, nor
-- neither.
--
-- KEYS[1] = the items stream
-- KEYS[2] = its dead-letter stream (<stream>:dead-letters)
-- ARGV[1] = the operation: "dead", "reject" or "requeue"
-- "dead" (dead-letter now) and "reject" (dead-letter if delivered often enough, else
-- make it reclaimable at once):
--   ARGV[2] = the consumer group
--   ARGV[3] = the entry id (as validated by Python)
--   ARGV[4] = the reason (text)
--   ARGV[5] = the consumer
--   ARGV[6] = "reject": deliveries from which the entry goes to the dead stream
-- "requeue" (a dead entry back to the stream, as a new entry):
--   ARGV[2] = the dead entry's id
--   ARGV[3] = cap of the items stream (MAXLEN ~; 0: none)
-- Returns: {"dead", <dead entry id>, deliveries}; {"retry", deliveries} (rejected,
-- reclaimable now); {"gone"} (not pending in the group: acknowledged or claimed by
-- another consumer meanwhile, nothing done); {"trimmed"} (pending, but the stream no
-- longer has it: acknowledged); for "requeue" {"requeued", <new id>} or {"gone"}.
-- A dead-letter stream of another type (written by hand) is renamed out of the way
-- (<key>:wrongtype) before an entry goes to a new one: "dead" then has a fourth element,
-- the new name of the key set aside.
-- uses: _levels

local op = ARGV[1]
-- fields of an entry copied as they are to the dead stream (names and values)
local MAX_FIELDS = 1000

if op == "requeue" then
  local found = redis.call("XRANGE", KEYS[2], ARGV[2], ARGV[2])
  if #found == 0 then
    return {"gone"}
  end
  local fields = found[1][2]
  if #fields > MAX_FIELDS + 12 then
    return {"gone"}  -- written by the guard below: never that many
  end
  local kept = {}
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 5) ~= "dead_" then
      kept[#kept + 1] = fields[i]
      kept[#kept + 1] = fields[i + 1]
    end
  end
  kept[#kept + 1] = "requeued_from"
  kept[#kept + 1] = ARGV[2]
  local new_id
  local maxlen = tonumber(ARGV[3])
  if maxlen > 0 then
    new_id = redis.call("XADD", KEYS[1], "MAXLEN", "~", maxlen, "*", unpack(kept))
  else
    new_id = redis.call("XADD", KEYS[1], "*", unpack(kept))
  end
  redis.call("XDEL", KEYS[2], ARGV[2])
  return {"requeued", new_id}
end

local group, id, reason, consumer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local pending = redis.call("XPENDING", KEYS[1], group, id, id, 1)
if #pending == 0 or pending[1][2] ~= consumer then
  -- acknowledged, or taken over by another consumer (XAUTOCLAIM): it is theirs now
  return {"gone"}
end
local deliveries = tonumber(pending[1][4])
if op == "reject" and deliveries < tonumber(ARGV[6]) then
  -- idle for "ever": the next XAUTOCLAIM of any consumer takes it (and counts a delivery)
  redis.call("XCLAIM", KEYS[1], group, consumer, 0, id, "IDLE", 1000000000000, "JUSTID")
  return {"retry", deliveries}
end
local found = redis.call("XRANGE", KEYS[1], id, id)
if #found == 0 then
  redis.call("XACK", KEYS[1], group, id)
  return {"trimmed"}
end
local record = found[1][2]
if #record > MAX_FIELDS then
  -- a hostile entry: unpack() has a limit, keep its item alone and say what was dropped
  local kept = {"dead_fields_dropped", tostring(#record / 2)}
  for i = 1, #record, 2 do
    if record[i] == "item" then
      kept = {"item", record[i + 1], "dead_fields_dropped", tostring(#record / 2 - 1)}
      break
    end
  end
  record = kept
end
local t = redis.call("TIME")
for _, pair in ipairs({
  {"dead_reason", reason},
  {"dead_id", id},
  {"dead_group", group},
  {"dead_consumer", consumer},
  {"dead_deliveries", tostring(deliveries)},
  {"dead_time", tostring(tonumber(t[1]) + tonumber(t[2]) / 1e6)},
}) do
  record[#record + 1] = pair[1]
  record[#record + 1] = pair[2]
end
local kind = redis.call("TYPE", KEYS[2])["ok"]
local aside = nil
if kind ~= "stream" and kind ~= "none" then
  aside = set_aside(KEYS[2])
end
local dead_id = redis.call("XADD", KEYS[2], "*", unpack(record))
redis.call("XACK", KEYS[1], group, id)
if aside then
  return {"dead", dead_id, deliveries, aside, kind}
end
return {"dead", dead_id, deliveries}
