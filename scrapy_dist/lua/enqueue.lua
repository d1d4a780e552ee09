-- Dedupe and enqueue a batch of requests in one atomic step: a fingerprint is
-- recorded only for a request that is queued in the same call ("seen implies queued").
--
-- KEYS[1] = request queue (list or zset)
-- KEYS[2] = sequence counter (string) giving each entry a unique, increasing id
-- KEYS[3..] = the dupefilter backend's keys (none when ARGV[2] == "none")
-- ARGV[1] = queue kind: "list" (LPUSH) or "zset" (ZADD with the given score)
-- ARGV[2] = filter kind: "none" or "set"
-- ARGV[3] = F, the number of filter arguments that follow
-- ARGV[4 .. 3+F] = filter arguments (backend-specific; none for "set")
-- ARGV[4+F ..] = one triple per request: token ("" = dont_filter), score, payload;
--                the token is what the backend tests and sets (the raw fingerprint
--                for "set")
--
-- Entries are "<16-digit id><payload>": ids keep identical payloads distinct, and in
-- the zset they order equal scores first-in first-out.
-- Returns: one integer per request, 1 if queued, 0 if its token was seen.

local queue, seq = KEYS[1], KEYS[2]
local queue_kind, filter_kind = ARGV[1], ARGV[2]
local nfilter = tonumber(ARGV[3])
local first = 4 + nfilter
local n = (#ARGV - first + 1) / 3

-- Test-and-set one token; return 1 if it was new. One function per filter kind.
local filters = {}
filters["set"] = function(token)
  return redis.call("SADD", KEYS[3], token)
end

local test_and_set = filters[filter_kind]
if filter_kind ~= "none" and test_and_set == nil then
  return redis.error_reply("unknown filter kind " .. filter_kind)
end

local result = {}
local accepted = {}
for i = 0, n - 1 do
  local token = ARGV[first + 3 * i]
  local new = 1
  if test_and_set ~= nil and token ~= "" then
    new = test_and_set(token)
  end
  result[i + 1] = new
  if new == 1 then
    accepted[#accepted + 1] = i
  end
end

if #accepted > 0 then
  local last = redis.call("INCRBY", seq, #accepted)
  local id = last - #accepted
  for _, i in ipairs(accepted) do
    id = id + 1
    local digits = tostring(id)
    local entry = string.rep("0", 16 - #digits) .. digits .. ARGV[first + 3 * i + 2]
    if queue_kind == "zset" then
      redis.call("ZADD", queue, ARGV[first + 3 * i + 1], entry)
    else
      redis.call("LPUSH", queue, entry)
    end
  end
end
return result
