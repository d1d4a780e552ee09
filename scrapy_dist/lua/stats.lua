-- Apply one worker's batch of stats operations to the crawl's shared stats hash, then
-- sample the crawl's page and item totals for rates. Every operation is applied here,
-- on the server, so concurrent workers never lose an increment.
--
-- Values (see scrapy_dist/stats.py): numbers are stored as plain text (an int has only
-- digits; a float always has ".", "e", "inf" or "nan"), so HINCRBY still works on
-- counters; other values are tagged: "d:<microseconds> <ISO datetime>", "s:<text>",
-- "j:<JSON>".
--
-- KEYS[1] = stats hash, KEYS[2] = timeline zset (score: second; member:
--           "<second> <pages> <items>")
-- ARGV[1] = stat counting pages, ARGV[2] = stat counting items
-- ARGV[3] = seconds of samples needed (older samples are trimmed, keeping the newest
--           of them, which is the base of a rate over that window)
-- ARGV[4..] = operations, 4 arguments each: kind, field, value, start
--   "inc": add value (a number) to field, or set it to start + value if absent
--   "set": set field to value (encoded)
--   "max" / "min": set field to value if absent, larger / smaller, or not comparable
-- Returns: the number of "inc" operations that found a non-number and replaced it
-- Errors: "WRONGTYPE ..." before writing anything if a key holds another type (so a
--   refused batch was not applied in part, and the worker can resend all of it)

local stats, timeline = KEYS[1], KEYS[2]
local pages_field, items_field, window = ARGV[1], ARGV[2], tonumber(ARGV[3])

local function is_int(text)
  return string.match(text, "^%-?%d+$") ~= nil
end

local function float_text(x)
  if x ~= x then
    return "nan"
  elseif x == math.huge then
    return "inf"
  elseif x == -math.huge then
    return "-inf"
  end
  local text
  for digits = 15, 17 do
    text = string.format("%." .. digits .. "g", x)
    if tonumber(text) == x then
      break
    end
  end
  if not string.find(text, "[%.eEn]") then
    text = text .. ".0"
  end
  return text
end

-- kind ("n" number, "d" datetime, "s" string, "j" other) and order key of a value
local function order(value)
  local tag = string.sub(value, 1, 2)
  if tag == "d:" then
    return "d", tonumber(string.match(value, "^d:(%-?%d+) "))
  elseif tag == "s:" then
    return "s", string.sub(value, 3)
  elseif tag == "j:" then
    return "j", nil
  end
  local n = tonumber(value)
  if n then
    return "n", n
  end
  return "?", nil
end

for _, pair in ipairs({{stats, "hash"}, {timeline, "zset"}}) do
  local kind = redis.call("TYPE", pair[1]).ok
  if kind ~= "none" and kind ~= pair[2] then
    return redis.error_reply("WRONGTYPE " .. pair[1] .. " holds a " .. kind .. ", not a " .. pair[2])
  end
end

local conflicts, sample = 0, false
for i = 4, #ARGV, 4 do
  local kind, field, value, start = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if field == pages_field or field == items_field then
    sample = true
  end
  if kind == "set" then
    redis.call("HSET", stats, field, value)
  elseif kind == "inc" then
    local current = redis.call("HGET", stats, field)
    if not current then
      if is_int(value) and is_int(start) then
        redis.call("HSET", stats, field, start)
        redis.call("HINCRBY", stats, field, value)
      else
        redis.call("HSET", stats, field, float_text(tonumber(start) + tonumber(value)))
      end
    elseif is_int(current) and is_int(value) then
      redis.call("HINCRBY", stats, field, value)
    else
      local kind_now, number = order(current)
      if kind_now == "n" then
        redis.call("HSET", stats, field, float_text(number + tonumber(value)))
      else
        conflicts = conflicts + 1
        if is_int(value) and is_int(start) then
          redis.call("HSET", stats, field, start)
          redis.call("HINCRBY", stats, field, value)
        else
          redis.call("HSET", stats, field, float_text(tonumber(start) + tonumber(value)))
        end
      end
    end
  else -- "max" or "min"
    local current = redis.call("HGET", stats, field)
    if not current then
      redis.call("HSET", stats, field, value)
    else
      local kind_now, now_key = order(current)
      local kind_new, new_key = order(value)
      if kind_now ~= kind_new or now_key == nil or new_key == nil
        or (kind == "max" and new_key > now_key) or (kind == "min" and new_key < now_key) then
        redis.call("HSET", stats, field, value)
      end
    end
  end
end

if sample then
  local t = redis.call("TIME")
  local second = tonumber(t[1])
  local pages = redis.call("HGET", stats, pages_field) or "0"
  local items = redis.call("HGET", stats, items_field) or "0"
  redis.call("ZREMRANGEBYSCORE", timeline, second, second)
  redis.call("ZADD", timeline, second, second .. " " .. pages .. " " .. items)
  local old = redis.call("ZCOUNT", timeline, "-inf", second - window)
  if old > 1 then
    redis.call("ZREMRANGEBYRANK", timeline, 0, old - 2)
  end
end
return conflicts
