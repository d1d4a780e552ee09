-- Library of the lease scripts (prepended by scrapy_dist/scripts.py to every script
-- whose header says "-- uses: _leases"). No KEYS or ARGV of its own.
--
-- The leases a worker holds are one hash, its holding "<holders>:<worker>": lease id ->
-- "<origin>|<score>|<data>", origin FROM_QUEUE ("q") for an entry of the request queue
-- (data = its payload: the entry is "<lease id><payload>", the lease id being the
-- entry's ENTRY_ID_LEN-digit id), FROM_SEEDS ("s") for a raw seed (data = the seed).
-- The holders zset "<holders>" gives each worker that holds leases their one deadline:
-- a worker's leases last while it renews them (every reserve and renewal does), and
-- expire together. (The constants are scrapy_dist/frontier/wire.py's.)
--
-- The deliveries hash counts deliveries of an entry from its second one: an entry
-- leased with no count there is on its first delivery. The count is written when the
-- entry comes back for another try (expired, failed) and while it is leased again.
--
-- The previous version's layout (a leases zset lease id -> deadline, and a leased hash
-- lease id -> "<origin>|<score>|<worker>|<entry>") is only read: its expired leases are
-- reclaimed by lua/reserve.lua and counted by leased_count.
-- uses: _batch, _levels

-- The holding hash of worker `worker` (scrapy_dist/keys.py RedisKeys.holding).
local function holding_key(holders, worker)
  return holders .. ":" .. worker
end

-- A holding that is not a hash (written by hand) holds no lease a script can read: it
-- is renamed out of the way (lua/_levels.lua set_aside: "<holding>:wrongtype"), so
-- neither its worker nor the workers reclaiming from it fail on it for good. Returns
-- the dead-letter reason naming it (nil when `key` is a hash or absent), and whether
-- `key` is a hash. (HLEN first: cheaper than TYPE, whose reply is made a table; it
-- fails on a key of another type.)
local function set_aside_holding(key)
  local fields = redis.pcall("HLEN", key)
  if type(fields) == "number" then
    return nil, fields > 0
  end
  local kind = redis.call("TYPE", key)["ok"]
  if kind == "hash" or kind == "none" then
    return nil, kind == "hash"
  end
  local aside = set_aside(key)
  return "holding " .. key .. " held a " .. kind .. ", not a hash of leases: renamed to "
    .. aside .. " (inspect it, push its requests again if it has any, then delete it)", false
end

-- A holders key that is not a zset (written by hand) fails every reserve, renewal and
-- count that reads it, for good: it is renamed out of the way (set_aside) and the index
-- rebuilt from the holdings that exist ("<holders>:<worker>" hashes whose worker is a
-- worker id, WORKER_ID_PATTERN: not the keys of a job named "holders" nor keys set
-- aside; found with one SCAN walk of the keyspace in this call), each worker given
-- `deadline`: a live worker's next renewal sets its own, a gone worker's leases expire
-- then and are reclaimed. Returns the dead-letter reason naming it (also in the server's
-- log).
local function rebuild_holders(holders, deadline)
  local kind = redis.call("TYPE", holders)["ok"]
  local aside = set_aside(holders)
  local pattern = string.gsub(holders, "[%*%?%[%]\\]", "\\%0") .. ":*"
  local cursor, found = "0", 0
  repeat
    local reply = redis.call("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
    cursor = reply[1]
    for _, key in ipairs(reply[2]) do
      local worker = string.sub(key, #holders + 2)
      if string.find(worker, WORKER_ID_PATTERN) and redis.call("TYPE", key)["ok"] == "hash" then
        redis.call("ZADD", holders, deadline, worker)
        found = found + 1
      end
    end
  until cursor == "0"
  local reason = "holders " .. holders .. " held a " .. kind .. ", not a zset of the "
    .. "workers holding leases: renamed to " .. aside .. ", the index rebuilt from the "
    .. found .. " holding(s) found (their leases expire in one lease unless their worker "
    .. "renews them; inspect it, then delete it)"
  redis.log(redis.LOG_WARNING, "scrapy_dist: " .. reason)
  return reason
end

-- A deliveries key that is not a hash (written by hand) cannot count deliveries: it is
-- renamed out of the way ("<deliveries>:wrongtype", as a holding), before a script
-- takes anything whose count it would fail to read or write. Returns the dead-letter
-- reason naming it, or nil when `key` is a hash or absent.
local function set_aside_deliveries(key)
  local kind = redis.call("TYPE", key)["ok"]
  if kind == "hash" or kind == "none" then
    return nil
  end
  local aside = set_aside(key)
  return "deliveries " .. key .. " held a " .. kind .. ", not a hash of delivery counts: "
    .. "renamed to " .. aside .. " (counts start again from there; inspect it, then "
    .. "delete it)"
end

-- The type of key each way of putting an entry back writes (put_back); "level" writes
-- levels, which push_returned checks itself (lua/_levels.lua), and so does "slot" (its
-- indexes are checked by slot_keys_aside).
local PUT_BACK_TYPES = {rpush = "list", lpush = "list", sadd = "set", zadd = "zset"}

-- A queue or seeds key of another type than `how` puts back to (written by hand: a seed
-- SADDed to a list crawl's emptied seeds key) would fail a put-back after the lease left
-- its holding: it is renamed out of the way ("<key>:wrongtype") before. Returns the
-- dead-letter reason naming it, or nil.
local function set_aside_destination(key, how)
  if how == "slot" then
    return slot_keys_aside(key)
  end
  local want = PUT_BACK_TYPES[how]
  local kind = want and redis.call("TYPE", key)["ok"]
  if not want or kind == want or kind == "none" then
    return nil
  end
  local aside = set_aside(key)
  return key .. " held a " .. kind .. ", not the " .. want .. " its entries go back to: "
    .. "renamed to " .. aside .. " (inspect it, push its requests or seeds again, then "
    .. "delete it)"
end

-- set_aside_destination for the queue key `queue` (put back to by `qback`) and the seeds
-- key `seeds` (by `sback`): the dead-letter reasons of those set aside, in that order.
local function set_aside_destinations(queue, qback, seeds, sback)
  local reasons = {}
  for _, reason in ipairs({set_aside_destination(queue, qback) or false,
      set_aside_destination(seeds, sback) or false}) do
    if reason then
      reasons[#reasons + 1] = reason
    end
  end
  return reasons
end

-- A delivery count as the scripts write it (a whole number), or nil for one written by
-- hand ("junk", "nan", "1.5"...).
local function count_of(value)
  local n = tonumber(value)
  if n == nil or n ~= math.floor(n) or n < 0 or n == math.huge then
    return nil
  end
  return n
end

-- True if ZADD takes `score` as it is. tonumber also takes " 5", "1e999" or "1e-400",
-- which ZADD refuses, and hex, which a server may refuse: a put-back failing on one
-- comes after the holding was emptied.
local function zadd_score(score)
  local mantissa = string.match(score, "^[-+]?([%d.]*)[eE][-+]?%d+$")
    or string.match(score, "^[-+]?([%d.]*)$")
  if not mantissa then
    local word = string.lower(string.match(score, "^[-+]?(%a*)$") or "")
    return word == "inf" or word == "infinity"
  end
  local n = tonumber(score)
  return n ~= nil and n ~= math.huge and n ~= -math.huge
    and (n ~= 0 or not string.find(mantissa, "[1-9]"))
end

-- The holding record of an entry leased from `origin` at `score`.
local function holding_record(origin, score, entry)
  if origin == FROM_QUEUE then
    entry = string.sub(entry, ENTRY_ID_LEN + 1)
  end
  return origin .. "|" .. score .. "|" .. entry
end

-- A record's origin and score, if it is "<origin>|<score>|..." as holding_record (or the
-- previous version) writes it; nil when it is not.
local function record_head(record)
  local a = string.find(record, "|", 1, true)
  local b = a and string.find(record, "|", a + 1, true)
  if not b then
    return nil
  end
  local origin, score = string.sub(record, 1, a - 1), string.sub(record, a + 1, b - 1)
  -- (a queue per slot's score carries its slot: "<score>@<slot>", lua/_levels.lua)
  if (origin ~= FROM_QUEUE and origin ~= FROM_SEEDS) or not zadd_score(split_slot(score)) then
    return nil
  end
  return origin, score, b
end

-- Split the holding record of lease `id` into origin, score, entry; nil when the record
-- is not one a reserve writes (edited by hand): the caller dead-letters it whole
-- (malformed_reason), so that one bad record never stops the scripts that read it.
local function parse_holding(id, record)
  local origin, score, b = record_head(record)
  if not origin then
    return nil
  end
  local data = string.sub(record, b + 1)
  if origin == FROM_QUEUE then
    data = id .. data
  end
  return origin, score, data
end

-- Split a previous version's leased record into origin, score, worker, entry; nil when
-- it is malformed.
local function parse_previous(record)
  local origin, score, b = record_head(record)
  local c = origin and string.find(record, "|", b + 1, true)
  if not c then
    return nil
  end
  return origin, score, string.sub(record, b + 1, c - 1), string.sub(record, c + 1)
end

-- The dead-letter reason of lease `id`'s record in `key`, which parse_holding or
-- parse_previous could not read (its data is the record itself).
local function malformed_reason(key, id)
  return "malformed lease record of lease " .. id .. " in " .. key .. ": not \"<origin>|"
    .. "<score>|<entry>\" as a reserve writes it (edited by hand?); its entry cannot go "
    .. "back to the queue (push the request again if it is one)"
end

-- How many times each of the leases `ids` was delivered (a count absent, or not a count:
-- once): one HMGET, none when the deliveries hash is empty. Returns a table aligned
-- with `ids`.
local function delivered(deliveries, ids)
  local counts = {}
  if #ids > 0 and redis.call("EXISTS", deliveries) == 1 then
    counts = batched({"HMGET", deliveries}, ids)
  end
  local out = {}
  for k = 1, #ids do
    out[k] = count_of(counts[k] or "1") or 1
  end
  return out
end

-- An entry leased `times` times goes back for another try: keep its count (not a seed
-- copy's: "<id>:<n>", lua/reserve.lua, is never leased again).
local function count_return(deliveries, id, times)
  if string.find(id, ":", 1, true) then
    redis.call("HDEL", deliveries, id)
  else
    redis.call("HSET", deliveries, id, times)
  end
end

-- An entry leased `times` times is handed back untouched: that delivery does not count.
-- (A lease on its first delivery has no count to delete: a count is written from the
-- second delivery on.)
local function count_hand_back(deliveries, id, times)
  if times > 1 then
    redis.call("HSET", deliveries, id, times - 1)
  end
end

-- Leases held in the crawl: every holder's holding, and the previous version's leases
-- zset `previous`.
local function leased_count(holders, previous)
  local n = redis.call("ZCARD", previous)
  for _, worker in ipairs(redis.call("ZRANGE", holders, 0, -1)) do
    n = n + redis.call("HLEN", holding_key(holders, worker))
  end
  return n
end

-- Put an entry back where it was taken from; how: "level" (at the head of the level
-- of its score, lua/_levels.lua), "slot" (the same in the level of its slot, its score
-- "<score>@<slot>"), "zadd", "sadd", "rpush" or "lpush".
local function put_back(key, how, score, entry)
  if how == "level" then
    put_back_level(key, score, entry)
  elseif how == "slot" then
    put_back_slot(key, score, entry)
  elseif how == "zadd" then
    redis.call("ZADD", key, score, entry)
  elseif how == "sadd" then
    redis.call("SADD", key, entry)
  elseif how == "rpush" then
    redis.call("RPUSH", key, entry)
  else
    redis.call("LPUSH", key, entry)
  end
end

-- Put an entry back where its origin says it came from: the seeds key (FROM_SEEDS) or
-- the request queue (FROM_QUEUE), each with its own way of taking it back. Entries put
-- back to a priority queue's levels are pushed when the script calls push_returned()
-- (lua/_levels.lua), which it does once it has returned them all.
local function return_entry(origin, score, entry, queue, qback, seeds, sback)
  if origin == FROM_SEEDS then
    put_back(seeds, sback, score, entry)
  else
    put_back(queue, qback, score, entry)
  end
end

-- dead_record calls dead_json, which is lua/_deadletter.lua's: a script that calls
-- dead_record lists "_deadletter" before "_leases" on its "-- uses:" line.

-- The dead-letter record of a leased entry that will not be tried again.
local function dead_record(origin, entry, reason, now, worker, times)
  local data = entry
  if origin == FROM_QUEUE then
    data = string.sub(entry, ENTRY_ID_LEN + 1)
  end
  return dead_json(origin == FROM_QUEUE and "request" or "seed", data, reason, now, worker, times)
end

-- RPUSH `record` to the dead-letter list `dead`. A key of another type there (written by
-- hand) would fail the push after the call took what it buries (Redis keeps what was
-- taken): it is renamed out of the way ("<dead>:wrongtype", lua/_levels.lua) and a record
-- naming it goes first into a fresh list. Returns the records pushed (2 then, else 1),
-- each counted as dead by the caller. No call more than the RPUSH when the key is a list.
local function push_dead(dead, record, now, worker)
  local pushed = redis.pcall("RPUSH", dead, record)
  if type(pushed) == "number" then
    return 1
  end
  if string.sub(pushed.err, 1, 9) ~= "WRONGTYPE" then
    redis.call("RPUSH", dead, record) -- fails the call with Redis's own error
  end
  local kind = redis.call("TYPE", dead)["ok"]
  local aside = set_aside(dead)
  local reason = "dead-letter key " .. dead .. " held a " .. kind .. ", not a list of records: "
    .. "renamed to " .. aside .. " (inspect it, then delete it)"
  redis.call("RPUSH", dead, dead_json("request", "", reason, now, worker, 0), record)
  return 2
end

-- A number of the progress hash as the scripts read it: decimal digits with an optional
-- sign, point and exponent (no hex, "nan" or "inf", which tonumber also takes), finite;
-- nil for anything else (written by hand). scrapy_dist.frontier.epoch.stored_number reads the same.
local function decimal_of(value)
  if type(value) ~= "string" or not (string.find(value, "^%s*[-+]?%d*%.?%d*%s*$")
      or string.find(value, "^%s*[-+]?%d*%.?%d*[eE][-+]?%d+%s*$")) then
    return nil
  end
  local n = tonumber(value)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then
    return nil
  end
  return n
end

-- A counter or base of the progress hash as the scripts read it (a finite whole number,
-- decimal_of), or nil for one written by hand.
local function integer_of(value)
  local n = decimal_of(value)
  if n == nil or n ~= math.floor(n) then
    return nil
  end
  return n
end

-- The completion time `text` of the progress hash (finished_at: server seconds) as a
-- number, or nil with true when it is not one (decimal_of; written by hand: a date):
-- its text is then moved to the field "finished_at:wrongtype" (and named in the server
-- log), so that the crawl is never read as finished by it.
local function finished_time(stats, text)
  if not text then -- HGET's nil reply is false in Lua
    return nil, false
  end
  local n = decimal_of(text)
  if n then
    return n, false
  end
  redis.call("HSET", stats, "finished_at:wrongtype", text)
  redis.call("HDEL", stats, "finished_at")
  redis.log(redis.LOG_WARNING, "scrapy_dist: completion time finished_at of " .. stats
    .. " was not a number (written by hand?): removed, its text kept in finished_at:wrongtype")
  return nil, true
end

-- Rename the progress hash `stats`, found holding a `kind` (written by hand: SET
-- <crawl>:progress junk), out of the way (lua/_levels.lua set_aside:
-- "<stats>:wrongtype"), and start a fresh hash whose run_base is -1: the crawl had
-- counters, so something was settled, and this run counts as having settled one (an
-- emptied crawl finishes after its grace, lua/progress.lua, rather than waits for ever).
-- Its completion mark went with what was written over it: lua/join.lua starts a new
-- run (run_base 0) when no other worker is alive, so a run not yet begun is never
-- counted as having settled one. Returns the reason naming it, for a dead-letter record
-- or the server's log.
local function set_aside_progress(stats, kind)
  local aside = set_aside(stats)
  redis.call("HSET", stats, "run_base", "-1")
  return "progress hash " .. stats .. " held a " .. kind .. ", not a hash of counters: "
    .. "renamed to " .. aside .. " (counting starts again from 0; inspect it, then delete it)"
end

-- Restart counter `field` of the progress hash `stats` at n, this call's count, keeping
-- done + dead - run_base (this run's settlements, lua/progress.lua) at least n: the run
-- is not reported waiting for what it settled.
local function restart_count(stats, field, n)
  redis.call("HSET", stats, field, n)
  if field == "done" or field == "dead" then
    local v = redis.call("HMGET", stats, "done", "dead", "run_base")
    local done, dead = integer_of(v[1] or "0"), integer_of(v[2] or "0")
    local base = integer_of(v[3] or "0")
    if done and dead and base and done + dead - base < n then
      redis.call("HSET", stats, "run_base", string.format("%.0f", done + dead - n))
    end
  end
end

-- Add to the counters of the progress hash `stats`: `counts` is {field, n, ...} (an n of
-- 0 is skipped). A field HINCRBY cannot add to (not an integer, or out of range: written
-- by hand) would fail the call after its writes: it is restarted (restart_count), its old
-- text the data of a dead-letter record naming it, pushed to `dead` and counted as dead.
-- So is a progress hash of another type: it is set aside (set_aside_progress), a record
-- naming it pushed and counted, and the counts go to a fresh hash.
-- Returns the records pushed. No call more than the HINCRBYs when the fields are integers.
local function add_counts(stats, dead, counts, worker)
  local pushed, i = 0, 1
  while i < #counts do
    local field, n = counts[i], counts[i + 1]
    local added = n > 0 and redis.pcall("HINCRBY", stats, field, n)
    if type(added) == "table" then
      local wrongtype = string.sub(added.err, 1, 9) == "WRONGTYPE"
      if not (wrongtype or string.find(added.err, "not an integer", 1, true)
          or string.find(added.err, "overflow", 1, true)) then
        redis.call("HINCRBY", stats, field, n) -- fails the call with Redis's own error
      end
      local old, reason = ""
      if wrongtype then
        reason = set_aside_progress(stats, redis.call("TYPE", stats)["ok"])
        redis.call("HINCRBY", stats, field, n)
      else
        old = redis.call("HGET", stats, field) or ""
        restart_count(stats, field, n)
        reason = "progress counter " .. field .. " of " .. stats .. " was not an integer "
          .. "(written by hand?): restarted from this call's count, " .. n .. "; its old "
          .. "text is this record's data"
      end
      local t = redis.call("TIME")
      local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
      local more = push_dead(dead, dead_json("request", old, reason, now, worker, 0), now, worker)
      pushed = pushed + more
      counts[#counts + 1], counts[#counts + 2] = "dead", more
    end
    i = i + 2
  end
  return pushed
end

-- The counters `fields` of the progress hash `stats` (one HMGET), and whether one was
-- garbled: a value that is not a whole number (written by hand) reads as 0 and is reset
-- to 0, its text kept in the field "<field>:wrongtype" of the hash (and the server log).
-- A progress hash of another type is set aside (set_aside_progress, named in the server
-- log) and the fresh hash read.
local function read_counts(stats, fields)
  local raw = redis.pcall("HMGET", stats, unpack(fields))
  if raw.err then
    if string.sub(raw.err, 1, 9) ~= "WRONGTYPE" then
      redis.call("HMGET", stats, unpack(fields)) -- fails the call with Redis's own error
    end
    redis.log(redis.LOG_WARNING, "scrapy_dist: "
      .. set_aside_progress(stats, redis.call("TYPE", stats)["ok"]))
    local counts = read_counts(stats, fields)
    return counts, true
  end
  local counts, fixed = {}, {}
  for k, field in ipairs(fields) do
    counts[k] = integer_of(raw[k] or "0")
    if not counts[k] then
      counts[k] = 0
      fixed[#fixed + 1], fixed[#fixed + 2] = field .. ":wrongtype", raw[k]
      fixed[#fixed + 1], fixed[#fixed + 2] = field, "0"
      redis.log(redis.LOG_WARNING, "scrapy_dist: progress counter " .. field .. " of " .. stats
        .. " was not a number: reset to 0, its text kept in " .. field .. ":wrongtype")
    end
  end
  if #fixed > 0 then
    redis.call("HSET", stats, unpack(fixed))
  end
  return counts, #fixed > 0
end
