-- Cluster-wide politeness: grant, confirm, renew and release one worker's download
-- tokens, in one call (scrapy_dist/politeness.py). A token lets its holder send one
-- request to a download slot (a host, or request.meta["download_slot"]); a slot never
-- has more tokens outstanding than its concurrency. A slot with a delay is given its
-- tokens one at a time, as *turns*: a turn is granted for a send time at least the delay
-- after the previous send to the slot (as its sender confirmed it, whoever it was), and
-- no other turn of the slot is granted until its holder confirms that it sent (or gives
-- it back): Scrapy's DOWNLOAD_DELAY, between sends, for all workers together. A token
-- not renewed or released by its deadline (its worker died) expires and frees the slot.
-- A worker refused a slot without delay and a concurrency above 1 while it holds less
-- than half its concurrency leaves a mark for a moment: meanwhile the other workers are granted only what leaves
-- it that share, so that a worker giving back its tokens in the same call as it asks
-- for more does not get them straight back while another worker waits for the slot.
--
-- The state heals itself: a key of another type is renamed out of the way
-- (<key>:wrongtype); a lost tokens zset gives the busy index's tokens a short deadline
-- for their holders to renew (the others expire); a lost busy index is rebuilt from the
-- tokens; deadlines and send times no worker could have written are brought back into
-- range; renewals and confirmations add again what a worker holds and Redis lost; a mark
-- that is no mark is removed (marks are hints: losing them costs a moment of sharing,
-- never a limit). Each repair is returned once, for the worker to log.
--
-- uses: _levels
--
-- KEYS[1] = tokens zset (member "<token>|<slot>" -> deadline, server time in ms)
-- KEYS[2] = busy zset, an index of the tokens by slot (every score 0, member
--           "<sha1 of slot>:<u|s>|<token>|<slot>": u a turn not confirmed sent, s any
--           other token), so that ZLEXCOUNT counts a slot's tokens
-- KEYS[3] = next zset (slot -> earliest send time of its next turn, server ms; kept
--           ARGV[2] ms after it passed), the member LIVE_MARK (present while the key
--           was not lost) and, for ARGV[2] ms after the key was found lost, the member
--           LOST_MARK -> when
-- KEYS[4] = slot pauses zset (slot -> server ms its pause ends: a Retry-After, a run of
--           429/503; written by lua/slot_pauses.lua, only read here): a paused slot is
--           granted nothing before its pause ends (a key of another type: no pauses;
--           slot_pauses.lua sets it aside)
-- KEYS[5] = refused hash (slot without delay -> "<server ms>|<n>|<worker>": the worker
--           refused the slot last while holding less than half its concurrency, and
--           the n tokens kept for it, at most half the concurrency of the worker that
--           reads it; a mark older than ARGV[6] ms, or from ahead of the server's clock,
--           is none, and is removed when read; the hash starts over past MARKS_MAX
--           fields)
-- ARGV[1] = token name prefix of this call (unique per worker, no "|"); its part up to
--           and including the first ":" names the worker (the whole prefix without
--           one); a granted token is named "<prefix><n>|<slot>", n counting from 0 over
--           the call's grants
-- ARGV[2] = token timeout in ms: the deadline of a token sent (or of a slot without
--           delay) is the time of its grant, confirmation or renewal plus this
-- ARGV[3] = recovery in ms: the deadline of a turn from its send time, and of a token
--           found without deadline (its holder renews it within this, or it expires)
-- ARGV[4] = idle expiry of KEYS[1], [2], [3] and [5] in ms (renewed by every call); a
--           send time further ahead than this is garbage
-- ARGV[5] = lookahead in ms: a turn is granted at most this long before its send time
-- ARGV[6] = how long a mark of KEYS[5] lasts, in ms (0: no marks)
-- ARGV[7] = number of confirmations C; then C triples: token member sent, ms since it
--           was sent (as the worker measured it when it made the call: the script's
--           now is later, so the send is taken no earlier than it was), the slot's delay
--           in ms (the next turn's send time is at least this after the send)
-- then R = number of releases; R token members given back (sent or not)
-- then T = number of turns held; T members (turns in the engine, not sent yet: deadline
--           renewed to now + recovery; reported lost if Redis no longer has them)
-- then W = number of tokens waiting; W members (granted, not used: deadline renewed to
--           now + timeout; reported lost if Redis no longer has them)
-- then H = number of tokens in flight; H members (sent: deadline renewed to now +
--           timeout, added again if Redis lost them)
-- then groups of 4: slot, requests waiting, concurrency, delay in ms (0: no turns)
-- Returns: { grants, lost, repairs } where grants holds 3 numbers per slot group, in
--          order: tokens granted n (at most 1 for a slot with delay), ms from now to
--          the send time, and (when n == 0) ms after which asking again may succeed;
--          lost = the turns and waiting tokens no longer held (stop using them);
--          repairs = "<key>\n<what was wrong and what was done>", one per repair

local tokens, busy, nextk, pausek, refusedk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix = ARGV[1]
local worker = string.match(prefix, "^[^:]*:") or prefix
local timeout, recover = tonumber(ARGV[2]), tonumber(ARGV[3])
local idle, lookahead = tonumber(ARGV[4]), tonumber(ARGV[5])
local mark_ms = tonumber(ARGV[6])
-- marks kept at most (slots whose refused worker never came back leave theirs behind)
local MARKS_MAX = 10000
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- no slot is longer than 200 characters (politeness.SLOT_MAX): these members are no slot
local LIVE_MARK, LOST_MARK = string.rep("~", 201), string.rep("!", 201)
local repairs, told = {}, {}

local function repaired(key, what)
  repairs[#repairs + 1] = key .. "\n" .. what
  told[key] = true
end

local function slot_of(member)
  return string.match(member, "^[^|]*|(.*)$")
end

local function index_of(slot)
  return redis.sha1hex(slot) .. ":"
end

-- the slot's tokens in the busy index, from "[" .. low to "(" .. high
local function range_of(h)
  return "[" .. h, "(" .. string.sub(h, 1, -2) .. ";"
end

local function turn_range_of(h)
  return "[" .. h .. "u|", "(" .. h .. "u}"
end

local function count_of(h)
  local low, high = range_of(h)
  return redis.call("ZLEXCOUNT", busy, low, high)
end

local function turns_of(h)
  local low, high = turn_range_of(h)
  return redis.call("ZLEXCOUNT", busy, low, high)
end

local function drop(member)
  redis.call("ZREM", tokens, member)
  local slot = slot_of(member)
  if slot then
    local h = index_of(slot)
    redis.call("ZREM", busy, h .. "u|" .. member, h .. "s|" .. member)
  end
end

-- a key of another type (written by hand) is renamed out of the way (the pauses key,
-- KEYS[4], by lua/slot_pauses.lua, which owns it)
local lost_as, aside = {}, {}
for k = 1, 3 do
  local key = KEYS[k]
  local kind = redis.call("TYPE", key)["ok"]
  lost_as[key] = "was lost (deleted or evicted)"
  if kind ~= "zset" and kind ~= "none" then
    aside[#aside + 1] = key
    lost_as[key] = "held a " .. kind .. ", not a zset: renamed to " .. set_aside(key)
      .. " (inspect it, then delete it)"
  end
end
do
  local kind = redis.call("TYPE", refusedk)["ok"]
  if kind ~= "hash" and kind ~= "none" then
    repaired(refusedk, "held a " .. kind .. ", not a hash: renamed to " .. set_aside(refusedk)
      .. " (inspect it, then delete it); politeness goes on with a new one")
  end
end

-- whether `m` is an entry of the busy index: "<sha1 of slot>:<u|s>|<token>|<slot>"; returns
-- its index prefix and its token member
local function entry_of(m)
  local h, rest = string.match(m, "^(%x+:)[us]|(.*)$")
  local slot = rest and slot_of(rest)
  if slot and index_of(slot) == h then
    return h, rest
  end
  return nil
end

-- the index's scores are all 0 (ZLEXCOUNT needs it): an entry scored otherwise is set
-- back to 0, a member that is no entry (written by hand) removed
local indexed = redis.call("ZCARD", busy)
if indexed > 0 and redis.call("ZCOUNT", busy, 0, 0) ~= indexed then
  local odd = redis.call("ZRANGEBYSCORE", busy, "(0", "+inf")
  for _, m in ipairs(redis.call("ZRANGEBYSCORE", busy, "-inf", "(0")) do
    odd[#odd + 1] = m
  end
  local removed = 0
  for _, m in ipairs(odd) do
    if entry_of(m) then
      redis.call("ZADD", busy, 0, m)
    else
      redis.call("ZREM", busy, m)
      removed = removed + 1
    end
  end
  indexed = indexed - removed
  repaired(busy, #odd .. " member(s) had a score other than 0: " .. (#odd - removed)
    .. " set to 0, " .. removed .. " that name no token removed")
end

-- deadlines further ahead than any worker sets them: a token of the index (a worker may
-- hold it) is given the recovery time, one outside it (no worker's) is removed
local far = now + 2 * math.max(timeout, recover) + lookahead
local beyond = redis.call("ZRANGEBYSCORE", tokens, "(" .. far, "+inf", "LIMIT", 0, 1000)
if #beyond > 0 then
  local kept = 0
  for _, m in ipairs(beyond) do
    local slot = slot_of(m)
    local h = slot and index_of(slot)
    if h and (redis.call("ZSCORE", busy, h .. "u|" .. m) or redis.call("ZSCORE", busy, h .. "s|" .. m)) then
      redis.call("ZADD", tokens, now + recover, m)
      kept = kept + 1
    else
      redis.call("ZREM", tokens, m)
    end
  end
  local done = {}
  if kept > 0 then
    done[#done + 1] = kept .. " set to " .. recover / 1000 .. "s from now (renewed by their "
      .. "workers, else they expire)"
  end
  if kept < #beyond then
    done[#done + 1] = (#beyond - kept) .. " of tokens no worker holds removed"
  end
  repaired(tokens, #beyond .. " deadline(s) further ahead than any worker sets them: "
    .. table.concat(done, ", "))
end

local held = redis.call("ZCARD", tokens)
if held == 0 and indexed > 0 then
  -- the tokens were lost (deleted, evicted, set aside): their holders renew them
  local given, dropped = 0, 0
  for _, m in ipairs(redis.call("ZRANGE", busy, 0, -1)) do
    local _, rest = entry_of(m)
    if rest then
      redis.call("ZADD", tokens, now + recover, rest)
      given = given + 1
    else
      redis.call("ZREM", busy, m)
      dropped = dropped + 1
    end
  end
  if given > 0 then
    repaired(tokens, lost_as[tokens] .. " while " .. given .. " token(s) were outstanding: "
      .. "each given " .. recover / 1000 .. "s for its worker to renew it, else it expires")
  end
  if dropped > 0 then
    repaired(busy, dropped .. " malformed entr(y/ies) removed")
  end
elseif indexed == 0 and held > 0 then
  -- the index was lost: rebuilt from the tokens; one due within the recovery time may
  -- be a turn not sent yet (a sent token's deadline is a timeout from its last renewal):
  -- it blocks its slot's next turn until its holder confirms or renews it
  local rebuilt, dropped = 0, 0
  local members = redis.call("ZRANGE", tokens, 0, -1, "WITHSCORES")
  for j = 1, #members, 2 do
    local m, deadline = members[j], tonumber(members[j + 1])
    local slot = slot_of(m)
    if slot then
      local kind = deadline <= now + recover + lookahead and "u|" or "s|"
      redis.call("ZADD", busy, 0, index_of(slot) .. kind .. m)
      rebuilt = rebuilt + 1
    else
      redis.call("ZREM", tokens, m)
      dropped = dropped + 1
    end
  end
  repaired(busy, lost_as[busy] .. ": rebuilt from " .. tokens .. " ("
    .. rebuilt .. " token(s)" .. (dropped > 0 and (", " .. dropped .. " malformed "
    .. "member(s) removed") or "") .. ")")
end

-- tokens of dead workers (or of a worker that lost touch) free their slots
for _, member in ipairs(redis.call("ZRANGEBYSCORE", tokens, "-inf", now, "LIMIT", 0, 200)) do
  drop(member)
end

-- send times: the mark says whether the key was lost while tokens were outstanding;
-- then no slot's next turn is sooner than a delay from now (its last send is not known)
if not redis.call("ZSCORE", nextk, LIVE_MARK) and (held > 0 or indexed > 0) then
  redis.call("ZADD", nextk, now, LOST_MARK)
  repaired(nextk, lost_as[nextk] .. ": each slot's next turn is at least a delay from now")
end
local garbage = redis.call("ZREMRANGEBYSCORE", nextk, "(" .. (now + idle), "+inf")
if garbage > 0 then
  repaired(nextk, garbage .. " send time(s) more than " .. idle / 1000 .. "s ahead: "
    .. "removed (their slots wait one delay)")
end
redis.call("ZREMRANGEBYSCORE", nextk, "-inf", "(" .. (now - timeout))
redis.call("ZADD", nextk, now, LIVE_MARK)
local lost_at = tonumber(redis.call("ZSCORE", nextk, LOST_MARK))

-- tokens a worker confirms or holds in flight that Redis no longer had (added again)
local readded = 0
local i = 7
local confirms = tonumber(ARGV[i])
for j = i + 1, i + 3 * confirms, 3 do
  local member, ago, delay = ARGV[j], tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local slot = slot_of(member)
  if slot then
    local h = index_of(slot)
    redis.call("ZREM", busy, h .. "u|" .. member)
    redis.call("ZADD", busy, 0, h .. "s|" .. member)
    readded = readded + redis.call("ZADD", tokens, "GT", now + timeout, member)
    local sent = now - math.min(math.max(ago, 0), recover)
    local scheduled = tonumber(redis.call("ZSCORE", nextk, slot) or "0")
    if delay > 0 and sent + delay > scheduled then
      redis.call("ZADD", nextk, sent + delay, slot)
    end
  end
end
i = i + 3 * confirms + 1

local releases = tonumber(ARGV[i])
for j = i + 1, i + releases do
  drop(ARGV[j])
end
i = i + releases + 1

local lost = {}
-- renew `count` members from ARGV[i + 1]: a turn (`kind` "u") to now + recovery, a
-- waiting token ("s") to now + timeout; reported lost if Redis no longer has them
local function renew(count, kind, deadline)
  for j = i + 1, i + count do
    local member = ARGV[j]
    local slot = slot_of(member)
    if redis.call("ZADD", tokens, "XX", "GT", "CH", deadline, member) == 0
      and not redis.call("ZSCORE", tokens, member) then
      lost[#lost + 1] = member
    elseif slot then
      local h = index_of(slot)
      if redis.call("ZSCORE", busy, h .. "u|" .. member) == false
        and redis.call("ZSCORE", busy, h .. "s|" .. member) == false then
        redis.call("ZADD", busy, 0, h .. kind .. "|" .. member) -- its entry was lost
      end
    end
  end
  i = i + count + 1
end
renew(tonumber(ARGV[i]), "u", now + recover)
renew(tonumber(ARGV[i]), "s", now + timeout)

local holding = tonumber(ARGV[i])
for j = i + 1, i + holding do
  local member = ARGV[j]
  local slot = slot_of(member)
  if slot then
    local h = index_of(slot)
    readded = readded + redis.call("ZADD", tokens, "GT", now + timeout, member)
    redis.call("ZREM", busy, h .. "u|" .. member)
    redis.call("ZADD", busy, 0, h .. "s|" .. member)
  end
end
i = i + holding + 1
if readded > 0 then
  repaired(tokens, readded .. " token(s) sent by a worker were missing (lost, or expired "
    .. "while their worker stalled): added again from that worker")
end

-- a slot whose tokens limit a grant: give a deadline to those found without one, drop
-- index entries that are not tokens of this slot
local function verify(h, slot)
  local low, high = range_of(h)
  local members = redis.call("ZRANGEBYLEX", busy, low, high)
  local given, dropped = 0, 0
  for _, m in ipairs(members) do
    local rest = string.sub(m, #h + 3)
    local kind = string.sub(m, #h + 1, #h + 2)
    if (kind ~= "u|" and kind ~= "s|") or slot_of(rest) ~= slot then
      redis.call("ZREM", busy, m)
      dropped = dropped + 1
    elseif not redis.call("ZSCORE", tokens, rest) then
      redis.call("ZADD", tokens, now + recover, rest)
      given = given + 1
    end
  end
  if given > 0 then
    repaired(tokens, given .. " token(s) of a slot had no deadline: each given "
      .. recover / 1000 .. "s for its worker to renew it, else it expires")
  end
  if dropped > 0 then
    repaired(busy, dropped .. " malformed entr(y/ies) removed")
  end
  return #members - dropped
end

local grants = {}
local n = 0
local function answer(count, offset, retry)
  grants[#grants + 1] = count
  grants[#grants + 1] = tostring(offset)
  grants[#grants + 1] = tostring(retry)
end

-- the end of a slot's pause, or nil (not paused, or no readable pauses key)
local pauses_readable = redis.call("TYPE", pausek)["ok"] == "zset"
local function paused_until(slot)
  if not pauses_readable then
    return nil
  end
  local ends = tonumber(redis.call("ZSCORE", pausek, slot))
  if ends and ends > now then
    return ends
  end
  return nil
end

-- the marks of slots refused (KEYS[5]; see the header): hints, read only when any
local marks = mark_ms > 0 and redis.call("EXISTS", refusedk) == 1
local bad_marks = 0

-- the worker of the mark in force on `slot` and the tokens kept for it, or nil (no
-- mark; one too old or that is no mark is removed)
local function mark_of(slot)
  local value = marks and redis.call("HGET", refusedk, slot)
  if not value then
    return nil
  end
  local at, kept, who = string.match(value, "^(%d+)|(%d+)|(.+)$")
  at, kept = tonumber(at), tonumber(kept)
  -- (past 2^53 a count is no integer: no worker wrote it)
  if not at or kept < 1 or kept > 2 ^ 53 or at > now + mark_ms then
    redis.call("HDEL", refusedk, slot)
    bad_marks = bad_marks + 1
    return nil
  end
  -- one from ahead (the server's clock stepped back) would last longer than mark_ms
  if now - at >= mark_ms or at > now then
    redis.call("HDEL", refusedk, slot)
    return nil
  end
  return who, kept
end

-- the tokens a mark keeps for its worker at most, of a slot of `concurrency`: half
local function share_of(concurrency)
  return math.ceil(concurrency / 2)
end

-- the tokens this call's worker holds of the slot indexed `h`
local function held_by(h)
  local low, high = range_of(h)
  local n = 0
  for _, m in ipairs(redis.call("ZRANGEBYLEX", busy, low, high)) do
    if string.sub(m, #h + 3, #h + 2 + #worker) == worker then
      n = n + 1
    end
  end
  return n
end

-- this call's worker was refused `slot` (no delay), `who` the worker of the mark in
-- force: the worker marks it, unless another's mark is in force (the first refused
-- keeps its place) or it holds half the concurrency already; a slot of concurrency 1 is
-- not marked (handing its one token from worker to worker only idles it in between)
local function refused(slot, h, want, concurrency, who)
  if mark_ms <= 0 or concurrency < 2 or (who and who ~= worker) then
    return
  end
  local share = share_of(concurrency)
  local held = held_by(h)
  if held >= share then
    if who then
      redis.call("HDEL", refusedk, slot)
    end
    return
  end
  if not who and redis.call("HLEN", refusedk) >= MARKS_MAX then
    redis.call("UNLINK", refusedk)
  end
  redis.call("HSET", refusedk, slot, now .. "|" .. math.min(want, share - held) .. "|" .. worker)
  marks = true
end

while i + 3 <= #ARGV do
  local slot, want = ARGV[i], tonumber(ARGV[i + 1])
  local concurrency, delay = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  i = i + 4
  local pause_ends = paused_until(slot)
  if pause_ends then
    answer(0, 0, pause_ends - now) -- asked to slow down: nothing before the pause ends
  else
    local h = index_of(slot)
    local count = count_of(h)
    local turns = delay > 0 and turns_of(h) or 0
    local need = delay > 0 and 1 or want -- a slot with delay is given one turn at a time
    if count > 0 and (count + need > concurrency or turns > 0) then
      count = verify(h, slot)
      turns = delay > 0 and turns_of(h) or 0
    end
    local free = concurrency - count
    if delay > 0 then
      local scheduled = tonumber(redis.call("ZSCORE", nextk, slot))
      if not scheduled and (count > turns or (lost_at and now - lost_at < delay)) then
        -- sent, or maybe sent before the key was lost, at a time not known: as if now
        scheduled = count > turns and now + delay or lost_at + delay
        redis.call("ZADD", nextk, scheduled, slot)
      end
      local at = math.max(now, scheduled or now)
      if turns > 0 or free <= 0 then
        answer(0, 0, 0) -- a turn not confirmed yet, or the slot full: ask again soon
      elseif at - now > lookahead then
        answer(0, 0, at - now - lookahead)
      else
        local member = prefix .. n .. "|" .. slot
        n = n + 1
        redis.call("ZADD", tokens, at + recover, member)
        redis.call("ZADD", busy, 0, h .. "u|" .. member)
        answer(1, at - now, 0)
      end
    else
      -- tokens kept for another worker refused the slot a moment ago are not granted
      local who, kept = mark_of(slot)
      -- (a mark keeps at most half the concurrency, whoever wrote it: a worker with
      -- another concurrency for the slot, or by hand)
      local others = (who and who ~= worker) and math.min(kept, share_of(concurrency)) or 0
      local count_granted = math.min(want, free - others)
      if count_granted <= 0 then
        answer(0, 0, 0)
        refused(slot, h, want, concurrency, who)
      else
        for _ = 1, count_granted do
          local member = prefix .. n .. "|" .. slot
          n = n + 1
          redis.call("ZADD", tokens, now + timeout, member)
          redis.call("ZADD", busy, 0, h .. "s|" .. member)
        end
        if who == worker then
          redis.call("HDEL", refusedk, slot)
        end
        answer(count_granted, 0, 0)
      end
    end
  end
end
if bad_marks > 0 then
  repaired(refusedk, bad_marks .. " mark(s) that are no marks (written by hand): removed")
end
for _, key in ipairs(aside) do
  if not told[key] then
    repaired(key, lost_as[key] .. "; politeness goes on with a new one")
  end
end
for _, key in ipairs({ tokens, busy, nextk, refusedk }) do -- (the pauses key keeps its own)
  redis.call("PEXPIRE", key, idle)
end
return { grants, lost, repairs }
