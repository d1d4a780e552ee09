-- Library of variadic calls (prepended by scrapy_dist/scripts.py to every script whose
-- header says "-- uses: _batch"). No KEYS or ARGV of its own.
--
-- Each redis.call from Lua has a fixed price (argument objects, checks, the reply
-- turned into Lua values) that is often more than the command's own work: a script
-- that runs one variadic command per call instead of one command per lease or per
-- request pays it once. A batch is sent in chunks of at most BATCH_ARGS arguments, so
-- that no call, however large, exceeds Lua's C stack (unpack) or makes one command
-- block the server for long.

local BATCH_ARGS = 1000

-- redis.call(head..., args[i..j]) for a head of one to three arguments.
local function batch_call(head, args, i, j)
  local h = #head
  if h == 2 then
    return redis.call(head[1], head[2], unpack(args, i, j))
  elseif h == 3 then
    return redis.call(head[1], head[2], head[3], unpack(args, i, j))
  end
  return redis.call(head[1], unpack(args, i, j))
end

-- Run the command `head` (a table: name, key, options) over the arguments `args`, in
-- chunks of at most BATCH_ARGS arguments that keep groups of `per` together (a ZADD's
-- score and member, an HSET's field and value). Nothing is sent when `args` is empty.
-- Returns the replies of an array-replying command (HMGET, SMISMEMBER, ZMSCORE)
-- concatenated, in order.
local function batched(head, args, per)
  local n = #args
  local replies = {}
  if n == 0 then
    return replies
  end
  local step = BATCH_ARGS - BATCH_ARGS % (per or 1)
  for i = 1, n, step do
    local reply = batch_call(head, args, i, math.min(i + step - 1, n))
    if type(reply) == "table" then
      if i == 1 and n <= step then
        return reply
      end
      for _, value in ipairs(reply) do
        replies[#replies + 1] = value
      end
    end
  end
  return replies
end

-- An array for `n` values whose slots are allocated at once. A table filled one value at
-- a time is reallocated at 1, 2, 4, 8... values, each time recounting what it holds:
-- about four times the cost per value (benchmarks/bench_instructions.py --ops). (Lua 5.1
-- has no table.new; a constructor of a call's results is sized to them, here `n` nils.)
-- Fill it from 1 without gaps, and its length (#) is the number of values in it (with a
-- gap, # may stop at any nil). Past BATCH_ARGS values, an empty table (unpack's stack
-- limit).
local NO_VALUES = {}
local function array_of(n)
  if n > BATCH_ARGS then
    return {}
  end
  return {unpack(NO_VALUES, 1, n)}
end
