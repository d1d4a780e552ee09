-- Write robots.txt Crawl-delays to a queue per download slot's delays hash, which its
-- reserves read (scrapy_dist/worker/crawl_delays.py; lua/_levels.lua take_slots).
--
-- KEYS[1] = the delays hash ("<queue>:delays": escaped slot -> seconds)
-- ARGV[1..] = triples: slot (escaped), delay in seconds, and "h" when the slot is a
--             host's name (that site's own Crawl-delay: written over what the field
--             holds) or "s" when Scrapy's downloader named it otherwise (an address,
--             read from another host name's robots.txt: written only where the field
--             holds no delay, so that it never replaces the delay of a host of that name,
--             http://127.0.0.1/ beside a http://localhost/ resolved to it)
-- Returns: the number of fields written.

local key = KEYS[1]

-- whether a field's text is a delay (a reserve ignores junk, nan and inf: so does this)
local function is_delay(text)
  local d = tonumber(text)
  return d ~= nil and d == d and d >= 0 and d ~= math.huge
end

local written = 0
for i = 1, #ARGV - 2, 3 do
  local slot, delay = ARGV[i], ARGV[i + 1]
  if ARGV[i + 2] == "h" or not is_delay(redis.call("HGET", key, slot)) then
    redis.call("HSET", key, slot, delay)
    written = written + 1
  end
end
return written
