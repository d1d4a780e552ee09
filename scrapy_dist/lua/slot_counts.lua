-- Add a worker's counts of requests per download slot to the crawl's, and read one
-- count of some slots (scrapy_dist/worker/slot_counts.py).
--
-- KEYS[1] = requests sent per slot, a zset (download slot -> requests sent by every
--           worker), which ranks the slots
-- KEYS[2] = the other counts, a hash ("<count>:<slot>" -> n, written once the count is
--           not 0)
-- KEYS[3] = crawl epoch (see lua/_fence.lua)
-- ARGV[1] = the crawl epoch the caller joined ("" = unfenced)
-- ARGV[2] = N, the slots whose counts follow
-- ARGV[3] = C, the other counts given per slot
-- ARGV[4 .. 3+C] = the names of the other counts (no ":" in them)
-- ARGV[4+C ..] = N groups of 2+C values: slot, requests sent, then the other counts in
--           the order of their names (each a whole number to add)
-- ARGV[4+C+N*(2+C)] = R, the name of the count read (one of the other counts)
-- ARGV[5+C+N*(2+C) ..] = the slots whose count R is read
-- Returns: the count R of each slot read, in their order (0 for a slot that has none,
--          or one that is not an integer); an error "EPOCH ..." (or "TRYAGAIN ...",
--          lua/_fence.lua) if the crawl's epoch is not ARGV[1] (nothing written: the
--          counts of a finished run do not bring its keys back).
-- A key of another type (written by hand) is renamed out of the way
-- ("<key>:wrongtype", lua/_levels.lua set_aside) and its counts start over; a count
-- that is not an integer (written by hand) starts over from this call's.
-- uses: _batch, _levels, _fence

local sent_key, counts_key = KEYS[1], KEYS[2]
local refused = fence(KEYS[3], ARGV[1])
if refused then
  return redis.error_reply(refused)
end
local n, c = tonumber(ARGV[2]), tonumber(ARGV[3])

for key, want in pairs({[sent_key] = "zset", [counts_key] = "hash"}) do
  local kind = redis.call("TYPE", key)["ok"]
  if kind ~= want and kind ~= "none" then
    set_aside(key)
  end
end

local first = 4 + c
for g = 0, n - 1 do
  local at = first + g * (2 + c)
  local slot, sent = ARGV[at], tonumber(ARGV[at + 1])
  if sent and sent ~= 0 then
    redis.call("ZINCRBY", sent_key, ARGV[at + 1], slot)
  end
  for k = 1, c do
    local count = tonumber(ARGV[at + 1 + k])
    if count and count ~= 0 then
      local field = ARGV[3 + k] .. ":" .. slot
      local added = redis.pcall("HINCRBY", counts_key, field, ARGV[at + 1 + k])
      if type(added) == "table" and added.err then
        redis.call("HSET", counts_key, field, ARGV[at + 1 + k])
      end
    end
  end
end

local read = first + n * (2 + c)
local fields = {}
for i = read + 1, #ARGV do
  fields[#fields + 1] = ARGV[read] .. ":" .. ARGV[i]
end
local values = batched({"HMGET", counts_key}, fields)
local reply = {}
for k = 1, #fields do
  local value = tonumber(values[k])
  reply[k] = (value and value == math.floor(value)) and value or 0
end
return reply
