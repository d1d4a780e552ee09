-- Pause download slots for every worker of a crawl (a Retry-After, a run of 429 or 503
-- responses: scrapy_dist/worker/pauses.py), and read the pauses in force.
--
-- KEYS[1] = pauses zset (download slot -> server time in ms its pause ends)
-- ARGV[1] = most milliseconds a pause may last (a longer one is cut to it)
-- ARGV[2..] = pairs: slot, milliseconds to pause it from now (a slot already paused
--             longer keeps its end: ZADD GT)
-- Returns: {server time in ms, slot1, ms left1, slot2, ms left2, ...}: every pause in
--          force after the call. Pauses that ended are removed. A pauses key of another
--          type (written by hand) is renamed out of the way ("<key>:wrongtype",
--          lua/_levels.lua set_aside), and the pauses start over. The key expires a
--          longest pause after its last write.
-- uses: _levels

local key, longest = KEYS[1], tonumber(ARGV[1])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local kind = redis.call("TYPE", key)["ok"]
if kind ~= "zset" and kind ~= "none" then
  set_aside(key)
end

local wrote = false
for i = 2, #ARGV - 1, 2 do
  local ms = tonumber(ARGV[i + 1])
  if ms and ms > 0 then
    if ms > longest then
      ms = longest
    end
    redis.call("ZADD", key, "GT", now + ms, ARGV[i])
    wrote = true
  end
end
redis.call("ZREMRANGEBYSCORE", key, "-inf", now)
if wrote then
  redis.call("PEXPIRE", key, longest + 1000)
end

local reply = {now}
local found = redis.call("ZRANGE", key, 0, -1, "WITHSCORES")
for i = 1, #found, 2 do
  local left = tonumber(found[i + 1]) - now
  if left ~= left or left > longest then -- a score written by hand: NaN or too far
    left = longest
  end
  reply[#reply + 1] = found[i]
  reply[#reply + 1] = math.floor(left)
end
return reply
