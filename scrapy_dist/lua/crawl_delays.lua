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
-- uses: _levels

local key = KEYS[1]

local written = 0
for i = 1, #ARGV - 2, 3 do
  local slot, delay = ARGV[i], ARGV[i + 1]
  -- (a field a reserve reads as no delay, delay_of: missing, junk, nan, inf)
  if ARGV[i + 2] == "h" or delay_of(redis.call("HGET", key, slot)) == nil then
    redis.call("HSET", key, slot, delay)
    written = written + 1
  end
end
return written
