-- Cluster-wide politeness: grant, renew and release one worker's download tokens, in one
-- call (scrapy_dist/politeness.py). A token lets its holder send one request to a
-- download slot (a host, or request.meta["download_slot"]) no earlier than its send
-- time; a slot never has more than its concurrency in tokens outstanding, and its send
-- times are spaced by its delay. A token not renewed or released by its deadline (its
-- worker died) expires and frees the slot.
--
-- KEYS[1] = tokens zset (member "<token>|<slot>" -> deadline, server time in ms)
-- KEYS[2] = busy hash (slot -> tokens outstanding)
-- KEYS[3] = next zset (slot -> earliest next send time, server ms; past times removed)
-- ARGV[1] = token name prefix of this call (unique per worker, no "|"); a granted token
--           is named "<prefix><n>|<slot>", n counting from 0 over the call's grants
-- ARGV[2] = token timeout in ms: a token's deadline is its send time plus this
-- ARGV[3] = idle expiry of the three keys in ms (renewed by every call)
-- ARGV[4] = number of releases R; ARGV[5 .. 4+R] = token members released
-- ARGV[5+R] = number of renewals W; the next W = token members this worker still holds
-- then groups of 4: slot, requests waiting, concurrency, delay in ms (may be fractional)
-- Returns: { grants, lost } where grants holds 3 numbers per slot group, in order:
--          tokens granted n, ms from now to the first one's send time (the k-th is
--          delay * k later), and (when n == 0) ms after which asking again may succeed;
--          lost = the renewed members no longer held (expired: stop using them)

local tokens, busy, nextk = KEYS[1], KEYS[2], KEYS[3]
local prefix, timeout, idle = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function slot_of(member)
  return string.match(member, "^[^|]*|(.*)$")
end

local function drop(member)
  if redis.call("ZREM", tokens, member) == 1 then
    local slot = slot_of(member)
    if slot and redis.call("HINCRBY", busy, slot, -1) <= 0 then
      redis.call("HDEL", busy, slot)
    end
  end
end

-- tokens of dead workers (or of a worker that lost touch) free their slots
local expired = redis.call("ZRANGEBYSCORE", tokens, "-inf", now, "LIMIT", 0, 200)
for _, member in ipairs(expired) do
  drop(member)
end
redis.call("ZREMRANGEBYSCORE", nextk, "-inf", now)

local i = 4
local releases = tonumber(ARGV[i])
for j = i + 1, i + releases do
  drop(ARGV[j])
end
i = i + releases + 1
local renewals = tonumber(ARGV[i])
local lost = {}
for j = i + 1, i + renewals do
  if redis.call("ZADD", tokens, "XX", "GT", "CH", now + timeout, ARGV[j]) == 0 then
    if not redis.call("ZSCORE", tokens, ARGV[j]) then
      lost[#lost + 1] = ARGV[j]
    end
  end
end
i = i + renewals + 1

local grants = {}
local n = 0
while i + 3 <= #ARGV do
  local slot, want = ARGV[i], tonumber(ARGV[i + 1])
  local concurrency, delay = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  i = i + 4
  local outstanding = tonumber(redis.call("HGET", busy, slot) or "0")
  local count = math.min(want, concurrency - outstanding)
  local at = now
  local scheduled = tonumber(redis.call("ZSCORE", nextk, slot) or "0")
  if delay > 0 and scheduled > now then
    at = scheduled
  end
  if count <= 0 then
    -- the oldest outstanding token was granted for about this time: ask after it
    local retry = 0
    if delay > 0 and scheduled > now then
      retry = math.max(0, scheduled - concurrency * delay - now)
    end
    grants[#grants + 1] = 0
    grants[#grants + 1] = 0
    grants[#grants + 1] = retry
  else
    for k = 0, count - 1 do
      redis.call("ZADD", tokens, at + k * delay + timeout, prefix .. n .. "|" .. slot)
      n = n + 1
    end
    redis.call("HINCRBY", busy, slot, count)
    if delay > 0 then
      redis.call("ZADD", nextk, at + count * delay, slot)
    end
    grants[#grants + 1] = count
    grants[#grants + 1] = tostring(at - now)
    grants[#grants + 1] = 0
  end
end
for _, key in ipairs(KEYS) do
  redis.call("PEXPIRE", key, idle)
end
return { grants, lost }
