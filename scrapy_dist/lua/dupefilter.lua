-- Test-and-set (or only test) fingerprint tokens in a dupefilter backend, without
-- queueing anything. Used by a backend's own add/contains (RFPDupeFilter.request_seen
-- under Scrapy's scheduler) and by its open step (an "add" with no tokens, which
-- creates and checks the filter). The filters are lua/enqueue.lua's (lua/_filters.lua).
--
-- KEYS[1..] = the backend's keys (backend.script_keys())
-- ARGV[1] = op: "add" (record the new tokens), "check" (read only), or "prepare"
-- "prepare" (bitmap Bloom only) has its own KEYS and ARGV: KEYS[1] = the chain's hash,
-- KEYS[2] = one segment; ARGV[2] = the segment's size in bits. It creates the segment
-- at full size if missing, with the hash's expiry, outside any enqueue (see
-- lua/_filters.lua). ARGV[3], when given, is the server time (ms) the segment expires
-- at (a windowed generation's; PEXPIREAT) instead of the hash's expiry. Returns 1 if
-- it created the segment, else 0.
-- ARGV[2] = filter kind: "set", "zset" (set with a recrawl window), "bloom" (bitmap),
--           "bf" (RedisBloom) or "buckets"
-- ARGV[3] = F, the number of filter arguments that follow
-- ARGV[4 .. 3+F] = filter arguments (backend.script_args())
-- ARGV[4+F ..] = one token per fingerprint (backend.token())
-- Returns: one integer per token: for "add", 1 if it was new (it is now recorded) and
-- 0 if it was seen, a token repeated in the call being new at most once; for
-- "check", 1 if it is present and 0 if not; an error "TRYAGAIN ..." while the
-- filter's hash slot is being moved to another cluster node (lua/_fence.lua; nothing
-- written).
-- uses: _filters, _fence

local op, filter_kind = ARGV[1], ARGV[2]
local moving = slot_moving(KEYS[1])
if moving then
  return redis.error_reply(moving)
end
if op == "prepare" then
  if redis.call("EXISTS", KEYS[2]) == 1 then
    return 0
  end
  redis.call("SETBIT", KEYS[2], tonumber(ARGV[2]) - 1, 0)
  if ARGV[3] then
    redis.call("PEXPIREAT", KEYS[2], tonumber(ARGV[3]))
    return 1
  end
  local pttl = redis.call("PTTL", KEYS[1])
  if pttl > 0 then
    redis.call("PEXPIRE", KEYS[2], pttl)
  end
  return 1
end
local nfilter = tonumber(ARGV[3])
local first = 4 + nfilter
local n = #ARGV - first + 1

if op ~= "add" and op ~= "check" then
  return redis.error_reply("unknown op " .. op)
end
local filter, refusal = filter_for(filter_kind, nfilter, n, 1, op == "add")
if refusal then
  return redis.error_reply(refusal)
end
if filter == nil then
  return redis.error_reply("unknown filter kind " .. filter_kind)
end

-- 1. decide (reads only)
local result, tokens, pending = {}, {}, {}
for i = 1, n do
  local token = ARGV[first + i - 1]
  if op == "check" then
    result[i] = filter.test(token) and 0 or 1
  else
    local new = not pending[token] and filter.test(token)
    if new then
      pending[token] = true
      tokens[#tokens + 1] = token
    end
    result[i] = new and 1 or 0
  end
end

-- 2. record the new tokens
for _, token in ipairs(tokens) do
  filter.record(token)
end
return result
