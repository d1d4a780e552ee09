-- Record that a worker is alive, stamped with the server's clock (so workers on
-- machines with skewed clocks agree on who is alive); with the history keys, also the
-- worker's own figures and, at most once per step for the whole crawl, a sample of the
-- crawl's figures in its history (what `scrapy-dist web` charts, kept even when nobody
-- watches).
--
-- KEYS[1] = worker registry hash (worker id -> last heartbeat, server time in seconds)
-- KEYS[2] = worker figures hash (worker id -> "<s> <pages> <items> <buffered>")
-- KEYS[3] = history list ("<s> <pages> <items> <done> <queued> <leased> <dead>",
--           newest first)
-- KEYS[4] = stats hash, KEYS[5] = progress hash, KEYS[6] = request queue,
-- KEYS[7] = holders zset, KEYS[8] = the previous version's leases zset,
-- KEYS[9] = dead-letter list
-- ARGV[1] = this worker's id
-- ARGV[2] = "<pages> <items> <buffered>" of this worker
-- ARGV[3] = queue kind ("list" or "levels"), ARGV[4] = seconds between samples,
-- ARGV[5] = samples kept
-- KEYS[2..9] and ARGV[2..5] are optional (all or none). The history is best effort: a
-- key of another type there skips it, never the heartbeat; a crawl marked finished
-- (KEYS[5]'s finished_at) takes no more samples (a crawl that does not persist deletes
-- its history with its frontier when it finishes, lua/progress.lua).
-- A KEYS[1] of another type (written by hand) is renamed to "<KEYS[1]>:wrongtype" (named in
-- the server log, lua/_registry.lua) and the heartbeat written to a fresh hash, so that
-- the worker is known alive again within one heartbeat.
-- Returns: the server time written, as a string
-- uses: _registry, _leases

local t = redis.call("TIME")
local now = tostring(tonumber(t[1]) + tonumber(t[2]) / 1e6)
registry_write({"HSET", KEYS[1], ARGV[1], now})
if #KEYS < 9 then
  return now
end

local second = tonumber(t[1])
local function number_of(value)
  return tonumber(value) or 0
end

local function sample()
  redis.call("HSET", KEYS[2], ARGV[1], second .. " " .. ARGV[2])
  if redis.call("HEXISTS", KEYS[5], "finished_at") == 1 then
    return -- a finished crawl's history is closed (deleted with its frontier, unless kept)
  end
  local newest = redis.call("LINDEX", KEYS[3], 0)
  local last = newest and tonumber(string.match(newest, "^(%d+)")) or 0
  if second - last < tonumber(ARGV[4]) then
    return
  end
  local stats = redis.call("HMGET", KEYS[4], "response_received_count", "item_scraped_count")
  local done = redis.call("HGET", KEYS[5], "done")
  local queued = queued_count(KEYS[6], ARGV[3]) or 0
  local leased = leased_count(KEYS[7], KEYS[8])
  local dead = redis.call("LLEN", KEYS[9])
  redis.call("LPUSH", KEYS[3], table.concat({second, number_of(stats[1]), number_of(stats[2]),
    number_of(done), queued, leased, dead}, " "))
  redis.call("LTRIM", KEYS[3], 0, tonumber(ARGV[5]) - 1)
  -- forget the figures of workers gone from the registry (pruned by leave and join)
  if redis.call("HLEN", KEYS[2]) > redis.call("HLEN", KEYS[1]) + 16 then
    local figures = redis.call("HKEYS", KEYS[2])
    for _, worker in ipairs(figures) do
      if redis.call("HEXISTS", KEYS[1], worker) == 0 then
        redis.call("HDEL", KEYS[2], worker)
      end
    end
  end
end

local ok, problem = pcall(sample)
if not ok then
  redis.log(redis.LOG_NOTICE, "scrapy_dist: history not sampled: " .. tostring(problem))
end
return now
