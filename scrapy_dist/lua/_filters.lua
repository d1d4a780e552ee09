-- Library of the dupefilter backends (prepended by scrapy_dist/scripts.py to every
-- script whose header says "-- uses: _filters": lua/enqueue.lua, lua/dupefilter.lua).
-- No KEYS or ARGV of its own: filter_for reads the backend's keys from
-- KEYS[first_key ..] and its arguments from ARGV[4 .. 3 + nfilter].
--
-- filter_for(kind, nfilter, n, first_key, writes) returns the filter of one kind, a
-- table {test = function(token), record = function(token)}: test returns true if the
-- token is new and only reads; record marks it seen. A kind may also have
-- test_many(tokens) (an array of booleans, test's answer for each of the distinct
-- tokens) and record_many(tokens) (record each of the distinct tokens, in order): the
-- same effect in one variadic command instead of one per token ("set" has them). `n` is the number of tokens the
-- call may record, `writes` false for a call that only tests. It returns nil and a
-- message when the call must be refused (the script answers that error before
-- anything is pushed or recorded), and nil alone for an unknown kind.
--
-- Every kind's first filter argument, ARGV[4], is an expiry in milliseconds ("0" =
-- none): a filter key that a record leaves without an expiry gets one. An expiry is
-- never extended, so the filter forgets everything at most that long after it started.
--
-- "set": exact, the raw fingerprints in a set at KEYS[first_key].
--
-- The recrawl window (DUPEFILTER_RECRAWL_AFTER, W ms): "zset" is the exact set with a
-- window (token -> time recorded, by the server's TIME); "bf" and "bloom" take two
-- more filter arguments (W, and the generation length G, W/8) and "buckets" too (after
-- bits): tokens are recorded in the current generation's filter or buckets and tested
-- in every generation alive (seen for more than W - G, at most W); each generation's
-- keys expire when it leaves the window. See the window section below.
--
-- "buckets": exact, in many small lists that Redis keeps as listpacks at any length
-- (a list has no size threshold past which it leaves its compact encoding, unlike a
-- hash, a set or a zset). KEYS[first_key] = the meta hash: bits (the table has 2^bits
-- buckets), gen (the generation, fixed when the hash is created), count. Filter
-- arguments: expiry, bits (used only when this call creates the hash: a crawl keeps the
-- layout it started with, whatever later workers are configured with). Bucket i of
-- generation g is the list "<meta>:<g>:<i>" (undeclared keys, derived from the meta
-- key by suffixing, so in its hash slot). A token (at least 3 bytes, uniformly
-- distributed leading bytes) goes to bucket i = its first `bits` bits; the bucket
-- stores the token without its first floor(bits / 8) bytes, which i determines, so
-- nothing is lost: exact. A new generation (a hash created after the last was deleted:
-- a finished, flushed or expired crawl) starts from empty buckets; the worker deletes
-- the old generation's buckets (scrapy_dist.filters.buckets).
--
-- "bf": a RedisBloom filter (Redis 8, Redis Stack, valkey-bloom) at KEYS[first_key];
-- the token is the raw fingerprint. Filter arguments: expiry, capacity, error rate,
-- "grow" (EXPANSION 2) or "refuse" (NONSCALING; a call that could take the count past
-- the capacity is refused with DUPEFILTER_FULL). Records use BF.INSERT with the
-- configured capacity and error rate, so a filter that expired or was deleted comes
-- back as configured, never with the module's defaults (as BF.ADD would create it).
--
-- "bloom": a scalable chain of bitmap Bloom filters over GETBIT/SETBIT (any server).
-- KEYS[first_key] = the chain's hash: sig (the parameters its bits were written
-- with), stages (how many are open), n<s> (records in stage s), t<s> (server time
-- stage s opened); KEYS[first_key + 1 ..] = the bit keys ("segments", at most 2^32
-- bits each) of stages 0 .. P-1, stage by stage.
-- Filter arguments: expiry, sig, "grow" or "refuse", then the numbers as one JSON
-- array (one argument is cheaper to send and to read than a dozen; every value is an
-- integer below 2^53, exact in a double): guard (seconds a stage must be open before
-- the next may open), most stages, bits per segment, P, then bits, hashes and capacity
-- of each of the P stages.
-- A token is MurmurHash3_x64_128 of the fingerprint: 16 bytes, h1 then h2, each
-- little-endian. Stage s (m bits, k hashes) holds it in the bits
-- g_i = (h1 + i*h2 + (i^3 - i)/6) mod m, i = 0 .. k-1 (scrapy_dist.bloom); bit g is
-- bit g - j*S of segment j = floor(g / S), S the bits per segment.
-- A token is seen if some open stage has all its bits; a new token is recorded in the
-- last stage. When that stage holds its capacity, "grow" opens the next one (if its
-- keys were passed and the last opened at least guard seconds ago; until then the
-- last stage takes a few more), and "refuse", like a full chain, refuses a call that
-- could take the count past the capacity with DUPEFILTER_FULL. A call that passed
-- fewer stages than are open is refused with DUPEFILTER_STALE (the worker re-reads
-- and retries), one whose parameters differ from sig with DUPEFILTER_MISMATCH.
-- A stage's segments are created at their full size (setting their last bit to 0),
-- as BF.RESERVE does (a string grown bit by bit would be over-allocated by up to 1 MB
-- each time), but never here: allocating hundreds of MB inside an enqueue would block
-- the server for seconds. The worker pre-sizes them in separate calls, one segment per
-- call (lua/dupefilter.lua "prepare"): stage 0 before the chain opens, the next stage
-- once the last is half full. A stage whose segments are missing is never opened
-- here: the chain does not grow into it (the last stage takes the excess, which the
-- counts show), and a chain with no stage yet refuses with DUPEFILTER_STALE (the
-- worker re-reads, which prepares stage 0, and retries). Segments expire with the
-- hash, whose expiry they copy when the stage opens (or when the hash first gets one).
--
-- The functions take their state as a table rather than closing over many locals:
-- a script defines them anew on every call, and closures over many upvalues are what
-- costs.
-- uses: _batch

local fmod, floor = math.fmod, math.floor

-- The chain hash's field names of stage s (count, opening time): constants, because
-- turning a number into a string is one of the dearer things a script does.
local COUNT_FIELD = {[0] = "n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"}
local OPENED_FIELD = {[0] = "t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"}

local function count_field(s)
  return COUNT_FIELD[s] or "n" .. s
end

local function opened_field(s)
  return OPENED_FIELD[s] or "t" .. s
end

-- Give `key` the filter's expiry (state.ttl ms) if it has none; return whether it did.
local function filter_expire(state, key)
  if state.ttl > 0 and not state.checked[key] then
    state.checked[key] = true
    if redis.call("PTTL", key) == -1 then
      redis.call("PEXPIRE", key, state.ttl)
      return true
    end
  end
  return false
end

local function set_filter(state, key)
  return {
    test = function(token)
      return redis.call("SISMEMBER", key, token) == 0
    end,
    record = function(token)
      redis.call("SADD", key, token)
      filter_expire(state, key)
    end,
    test_many = function(tokens)
      local new = array_of(#tokens)
      for i, member in ipairs(batched({"SMISMEMBER", key}, tokens)) do
        new[i] = member == 0
      end
      return new
    end,
    record_many = function(tokens)
      batched({"SADD", key}, tokens)
      filter_expire(state, key)
    end,
  }
end

local function bf_filter(state, key, n, writes)
  local capacity = tonumber(ARGV[5])
  local insert = {"BF.INSERT", key, "CAPACITY", ARGV[5], "ERROR", ARGV[6]}
  if ARGV[7] == "refuse" then
    insert[7] = "NONSCALING"
    if writes then
      local count = redis.call("BF.CARD", key)
      if count + n > capacity then
        return nil, "DUPEFILTER_FULL " .. key .. " holds " .. count .. " of its "
          .. capacity .. " fingerprints (BLOOM_ON_FULL = refuse)"
      end
    end
  else
    insert[7], insert[8] = "EXPANSION", "2"
  end
  insert[#insert + 1] = "ITEMS"
  local item = #insert + 1
  return {
    test = function(token)
      return redis.call("BF.EXISTS", key, token) == 0
    end,
    record = function(token)
      insert[item] = token
      redis.call(unpack(insert))
      filter_expire(state, key)
    end,
  }
end

-- h1 and h2 of a token, each reduced mod m. Lua numbers are doubles, so the 64-bit
-- halves are folded in a few bytes at a time, every intermediate value under 2^53.
local function bloom_reduce(token, m)
  local a1, a2, a3, a4, a5, a6, a7, a8, b1, b2, b3, b4, b5, b6, b7, b8 =
    string.byte(token, 1, 16)
  if m <= 536870912 then -- 2^29: 24-bit steps stay exact
    return fmod(fmod(fmod(a8 * 65536 + a7 * 256 + a6, m) * 16777216
        + a5 * 65536 + a4 * 256 + a3, m) * 65536 + a2 * 256 + a1, m),
      fmod(fmod(fmod(b8 * 65536 + b7 * 256 + b6, m) * 16777216
        + b5 * 65536 + b4 * 256 + b3, m) * 65536 + b2 * 256 + b1, m)
  end
  local a, b = 0, 0
  for _, byte in ipairs({a8, a7, a6, a5, a4, a3, a2, a1}) do
    a = fmod(a * 256 + byte, m)
  end
  for _, byte in ipairs({b8, b7, b6, b5, b4, b3, b2, b1}) do
    b = fmod(b * 256 + byte, m)
  end
  return a, b
end

-- The (key, bit) pairs of the token in `stage`.
local function bloom_bits(chain, stage, token)
  local m, keys, size = stage.m, stage.keys, chain.segment_bits
  local a, b = bloom_reduce(token, m)
  local bits = {}
  for i = 0, stage.k - 1 do
    local g = fmod(a + i * b + (i * i * i - i) / 6, m)
    local key = keys[1]
    if stage.segments > 1 then
      local segment = floor(g / size)
      key, g = keys[segment + 1], g - segment * size
    end
    bits[#bits + 1] = {key, g}
  end
  return bits
end

-- Whether `stage` has every bit of the token (GETBIT until one is 0).
local function bloom_has(chain, stage, token)
  for _, bit in ipairs(bloom_bits(chain, stage, token)) do
    if redis.call("GETBIT", bit[1], bit[2]) == 0 then
      return false
    end
  end
  return true
end

-- Set every bit of the token in `stage`.
local function bloom_put(chain, stage, token)
  for _, bit in ipairs(bloom_bits(chain, stage, token)) do
    redis.call("SETBIT", bit[1], bit[2], 1)
  end
end

local function bloom_clock(chain)
  if not chain.now then
    chain.now = tonumber(redis.call("TIME")[1])
  end
  return chain.now
end

-- Call each(key, bits) for every segment of stage s.
local function bloom_segments(chain, s, each)
  local stage = chain[s]
  for j = 0, stage.segments - 1 do
    local size = chain.segment_bits
    if j == stage.segments - 1 then
      size = stage.m - j * chain.segment_bits
    end
    each(stage.keys[j + 1], size)
  end
end

-- Whether every segment of stage s was pre-sized (it is never allocated here).
local function bloom_ready(chain, s)
  local ready = true
  bloom_segments(chain, s, function(key)
    if ready and redis.call("EXISTS", key) == 0 then
      ready = false
    end
  end)
  return ready
end

-- Give the pre-sized segments of stage s the expiry of the chain's hash.
local function bloom_open_stage(chain, s)
  local pttl = redis.call("PTTL", chain.meta)
  if pttl > 0 then
    bloom_segments(chain, s, function(key)
      redis.call("PEXPIRE", key, pttl)
    end)
  end
end

local function bloom_test(chain, token)
  for s = 0, chain.live - 1 do
    if bloom_has(chain, chain[s], token) then
      return false
    end
  end
  return true
end

local function bloom_record(chain, token)
  local last = chain.live - 1
  if chain.count >= chain[last].capacity and chain.grow and chain.live < chain.passed
      and chain.live < chain.most and bloom_clock(chain) - chain.opened >= chain.guard
      and chain.next_ready ~= false then
    chain.next_ready = bloom_ready(chain, chain.live)
  end
  if chain.next_ready then
    chain.next_ready = nil
    last = chain.live
    chain.live, chain.count, chain.opened = last + 1, 0, chain.now
    redis.call("HSET", chain.meta, "stages", chain.live, count_field(last), 0,
      opened_field(last), chain.now)
    bloom_open_stage(chain, last)
  end
  bloom_put(chain, chain[last], token)
  chain.count = chain.count + 1
  redis.call("HINCRBY", chain.meta, count_field(last), 1)
end

local function bloom_filter(state, first_key, n, writes)
  local meta, sig = KEYS[first_key], ARGV[5]
  local layout = cjson.decode(ARGV[7])
  local chain = {
    meta = meta, grow = ARGV[6] == "grow", guard = layout[1], most = layout[2],
    segment_bits = layout[3], passed = layout[4], live = 0, count = 0, opened = 0,
  }
  local key = first_key + 1
  for s = 0, chain.passed - 1 do
    local m = layout[5 + 3 * s]
    local segments = math.ceil(m / chain.segment_bits)
    local keys = {}
    for j = 1, segments do
      keys[j] = KEYS[key + j - 1]
    end
    chain[s] = {
      m = m, k = layout[6 + 3 * s], capacity = layout[7 + 3 * s], keys = keys,
      segments = segments,
    }
    key = key + segments
  end
  if key - 1 ~= #KEYS then
    return nil, "DUPEFILTER_LAYOUT " .. meta .. ": " .. #KEYS .. " keys passed for "
      .. (key - 1) .. " expected"
  end

  -- The chain's state: open stages, and the count and opening time of the last one.
  local fields = {"sig", "stages"}
  for s = 0, chain.passed - 1 do
    fields[3 + 2 * s], fields[4 + 2 * s] = count_field(s), opened_field(s)
  end
  local stored = redis.call("HMGET", meta, unpack(fields))
  if stored[1] then
    if stored[1] ~= sig then
      return nil, "DUPEFILTER_MISMATCH " .. meta .. " was written with " .. stored[1]
        .. ", this worker uses " .. sig
    end
    chain.live = tonumber(stored[2])
  end
  if chain.live > chain.passed then
    return nil, "DUPEFILTER_STALE " .. meta .. " has " .. chain.live
      .. " stages, the call passed the keys of " .. chain.passed
  end

  if writes then
    if chain.live == 0 then
      if not bloom_ready(chain, 0) then
        return nil, "DUPEFILTER_STALE " .. meta .. ": its first stage is not pre-sized yet"
      end
      redis.call("HSET", meta, "sig", sig, "stages", 1, "n0", 0, "t0", bloom_clock(chain))
      chain.live, chain.opened = 1, chain.now
      filter_expire(state, meta)
      bloom_open_stage(chain, 0)
    else
      local live = chain.live
      chain.count, chain.opened = tonumber(stored[1 + 2 * live]), tonumber(stored[2 + 2 * live])
      if filter_expire(state, meta) then
        for s = 0, live - 1 do
          bloom_segments(chain, s, function(segment)
            redis.call("PEXPIRE", segment, state.ttl)
          end)
        end
      end
    end
    local capacity = chain[chain.live - 1].capacity
    if (not chain.grow or chain.live >= chain.most) and chain.count + n > capacity then
      return nil, "DUPEFILTER_FULL " .. meta .. " holds " .. chain.count .. " of the "
        .. capacity .. " fingerprints of its last stage ("
        .. (chain.grow and "no stage left to grow into" or "BLOOM_ON_FULL = refuse") .. ")"
    end
  end

  return {
    test = function(token)
      return bloom_test(chain, token)
    end,
    record = function(token)
      bloom_record(chain, token)
    end,
  }
end

-- The bucket of a token and what it stores of it, for 2^bits buckets.
local function bucket_of(prefix, bits, token)
  local b1, b2, b3 = string.byte(token, 1, 3)
  local index = floor(((b1 or 0) * 65536 + (b2 or 0) * 256 + (b3 or 0)) / 2 ^ (24 - bits))
  return prefix .. index, string.sub(token, floor(bits / 8) + 1)
end

-- ---------------------------------------------------------------------------------
-- The recrawl window (DUPEFILTER_RECRAWL_AFTER): a fingerprint counts as seen only for
-- W milliseconds, by the server's clock (TIME), in bounded memory.

-- The server's time in milliseconds.
local function window_now()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
end

-- Generation g covers [g*gen, (g+1)*gen) ms; its records count as seen while
-- g*gen + window > now (then its keys expire: PEXPIREAT g*gen + window). A record made
-- at t is so seen for more than window - gen and at most window. Returns the first and
-- the current generation alive at `now`.
local function window_generations(now, window, gen)
  return floor((now - window) / gen) + 1, floor(now / gen)
end

-- A filter that holds nothing (a check before the first record).
local EMPTY = {
  test = function()
    return true
  end,
}

-- The generation chain's main hash (sig, run, and `extra` fields): returns the run id
-- generations are named after, false when there is none and the call only tests, or
-- nil and a DUPEFILTER_MISMATCH message when the hash was written with another sig.
local function window_main(main, sig, writes, extra)
  local stored = redis.call("HMGET", main, "sig", "run")
  if stored[1] then
    if stored[1] ~= sig or not stored[2] then
      return nil, "DUPEFILTER_MISMATCH " .. main .. " was written with " .. stored[1]
        .. ", this worker uses " .. sig
    end
    return stored[2]
  end
  if not writes then
    return false
  end
  local t = redis.call("TIME")
  local run = t[1] .. string.format("%06d", tonumber(t[2]))
  redis.call("HSET", main, "sig", sig, "run", run, unpack(extra))
  return run
end

-- "zset": exact with a window. KEYS[first_key] = zset token -> time recorded (ms);
-- filter arguments: expiry (unused, "0"), window ms. A token is new if absent or
-- recorded at least `window` ago; a record (re)sets its time. Each recording call
-- deletes a bounded number of expired entries (oldest first) and gives the key an
-- expiry of one window (nothing in it is seen once no record was made for that long).
local function zset_filter(state, key, n)
  local window = tonumber(ARGV[5])
  local now = window_now()
  local cutoff = now - window
  return {
    test = function(token)
      local at = redis.call("ZSCORE", key, token)
      return not at or tonumber(at) <= cutoff
    end,
    record = function(token)
      redis.call("ZADD", key, now, token)
      if not state.trimmed then
        state.trimmed = true
        local old = redis.call("ZRANGEBYSCORE", key, "-inf", cutoff, "LIMIT", 0,
          math.min(2 * n + 64, 4000))
        if #old > 0 then
          redis.call("ZREM", key, unpack(old))
        end
        redis.call("PEXPIRE", key, window)
      end
    end,
  }
end

-- "bf" with a window: filter arguments expiry, capacity (of one generation), error
-- rate, "grow"/"refuse", window ms, generation ms. KEYS[first_key] = the main hash
-- (sig, run, kind = "bf", window); generation g is the RedisBloom filter
-- "<main>:<run>:<g>", created by BF.INSERT, expiring at the end of its life.
local function bf_window_filter(main, n, writes)
  local window, gen = tonumber(ARGV[8]), tonumber(ARGV[9])
  local sig = "bf capacity=" .. ARGV[5] .. " error_rate=" .. ARGV[6] .. " window="
    .. ARGV[8] .. "/" .. ARGV[9]
  local run, refusal = window_main(main, sig, writes, {"kind", "bf", "window", ARGV[8]})
  if run == nil then
    return nil, refusal
  elseif not run then
    return EMPTY
  end
  local now = window_now()
  local first, cur = window_generations(now, window, gen)
  local prefix = main .. ":" .. run .. ":"
  local live = {}
  for g = first, cur do
    if redis.call("EXISTS", prefix .. g) == 1 then
      live[#live + 1] = prefix .. g
    end
  end
  local current, capacity = prefix .. cur, tonumber(ARGV[5])
  local insert = {"BF.INSERT", current, "CAPACITY", ARGV[5], "ERROR", ARGV[6]}
  if ARGV[7] == "refuse" then
    insert[7] = "NONSCALING"
    if writes then
      local count = 0
      if redis.call("EXISTS", current) == 1 then
        count = redis.call("BF.CARD", current)
      end
      if count + n > capacity then
        return nil, "DUPEFILTER_FULL " .. current .. " holds " .. count .. " of its "
          .. capacity .. " fingerprints (BLOOM_ON_FULL = refuse)"
      end
    end
  else
    insert[7], insert[8] = "EXPANSION", "2"
  end
  insert[#insert + 1] = "ITEMS"
  local item, expired = #insert + 1, false
  return {
    test = function(token)
      for _, key in ipairs(live) do
        if redis.call("BF.EXISTS", key, token) == 1 then
          return false
        end
      end
      return true
    end,
    record = function(token)
      insert[item] = token
      redis.call(unpack(insert))
      if not expired then
        expired = true
        redis.call("PEXPIREAT", current, cur * gen + window)
      end
    end,
  }
end

-- Largest stage (bits) a windowed bitmap generation creates inside the script when
-- the worker has not pre-sized it (8 MiB: allocated and zeroed in about a millisecond).
local INLINE_BITS = 67108864

-- "bloom" with a window: filter arguments expiry, sig, "grow"/"refuse", the layout
-- JSON (every stage passed), window ms, generation ms. KEYS[first_key] = the main hash
-- (sig, run, window); generation g is a chain of its own: hash "<main>:<run>:<g>"
-- (stages, n<s>, t<s>), stage s's segments "<main>:<run>:<g>:<s>:<i>" (undeclared
-- keys derived from the main key, so in its hash slot), all expiring at the end of
-- the generation's life. The worker pre-sizes stage 0 of the current and the next
-- generation; a small one missing is created here, a large one makes the call
-- DUPEFILTER_STALE (the worker prepares it and retries).
local function bloom_window_filter(main, n, writes)
  local sig = ARGV[5]
  local layout = cjson.decode(ARGV[7])
  local window, gen = tonumber(ARGV[8]), tonumber(ARGV[9])
  local run, refusal = window_main(main, sig, writes, {"window", ARGV[8]})
  if run == nil then
    return nil, refusal
  elseif not run then
    return EMPTY
  end
  local now = window_now()
  local first, cur = window_generations(now, window, gen)
  local passed = layout[4]
  local fields = {"stages"}
  for s = 0, passed - 1 do
    fields[2 + 2 * s], fields[3 + 2 * s] = count_field(s), opened_field(s)
  end
  local tested, current = {}, nil
  for g = first, cur do
    local meta = main .. ":" .. run .. ":" .. g
    local chain = {
      meta = meta, grow = ARGV[6] == "grow", guard = layout[1], most = layout[2],
      segment_bits = layout[3], passed = passed, live = 0, count = 0, opened = 0,
      now = floor(now / 1000),
    }
    for s = 0, passed - 1 do
      local m = layout[5 + 3 * s]
      local segments = math.ceil(m / chain.segment_bits)
      local keys = {}
      for j = 1, segments do
        keys[j] = meta .. ":" .. s .. ":" .. (j - 1)
      end
      chain[s] = {
        m = m, k = layout[6 + 3 * s], capacity = layout[7 + 3 * s], keys = keys,
        segments = segments,
      }
    end
    local stored = redis.call("HMGET", meta, unpack(fields))
    local live = tonumber(stored[1]) or 0
    if live > passed then
      return nil, "DUPEFILTER_STALE " .. meta .. " has " .. live
        .. " stages, the call passed the sizes of " .. passed
    end
    if live > 0 then
      chain.live = live
      chain.count = tonumber(stored[2 * live]) or 0
      chain.opened = tonumber(stored[2 * live + 1]) or 0
      tested[#tested + 1] = chain
    end
    if g == cur then
      current = chain
    end
  end
  if writes then
    if current.live == 0 then
      if not bloom_ready(current, 0) then
        if current[0].m > INLINE_BITS then
          return nil, "DUPEFILTER_STALE " .. current.meta .. ": its first stage is not "
            .. "pre-sized yet"
        end
        bloom_segments(current, 0, function(key, bits)
          if redis.call("EXISTS", key) == 0 then
            redis.call("SETBIT", key, bits - 1, 0)
          end
        end)
      end
      redis.call("HSET", current.meta, "stages", 1, "n0", 0, "t0", current.now)
      redis.call("PEXPIREAT", current.meta, cur * gen + window)
      bloom_open_stage(current, 0)
      current.live, current.opened = 1, current.now
      tested[#tested + 1] = current
    end
    local capacity = current[current.live - 1].capacity
    if (not current.grow or current.live >= current.most) and current.count + n > capacity then
      return nil, "DUPEFILTER_FULL " .. current.meta .. " holds " .. current.count
        .. " of the " .. capacity .. " fingerprints of its last stage ("
        .. (current.grow and "no stage left to grow into" or "BLOOM_ON_FULL = refuse") .. ")"
    end
  end
  return {
    test = function(token)
      for _, chain in ipairs(tested) do
        if not bloom_test(chain, token) then
          return false
        end
      end
      return true
    end,
    record = function(token)
      bloom_record(current, token)
      if not current.expiry_checked then
        -- a segment deleted or evicted mid-generation is re-created by SETBIT without
        -- an expiry: give it the generation's, or it would stay forever
        current.expiry_checked = true
        for s = 0, current.live - 1 do
          bloom_segments(current, s, function(key)
            if redis.call("PTTL", key) == -1 then
              redis.call("PEXPIREAT", key, cur * gen + window)
            end
          end)
        end
      end
    end,
  }
end

-- "buckets" with a window: filter arguments expiry, bits, window ms, generation ms. The
-- meta hash also holds `window`; generation g's buckets are "<meta>:<gen>-<g>:<i>" and
-- its count "<meta>:<gen>-<g>:n", each expiring at the end of the generation's life. A token is tested in the buckets
-- of every generation alive and recorded in the current one.
local function buckets_window(meta, bits, gen_id, writes)
  local window, gen = tonumber(ARGV[6]), tonumber(ARGV[7])
  local now = window_now()
  local first, cur = window_generations(now, window, gen)
  local base = meta .. ":" .. gen_id .. "-"
  local current = base .. cur .. ":"
  return {
    test = function(token)
      for g = first, cur do
        local key, rest = bucket_of(base .. g .. ":", bits, token)
        if redis.call("LPOS", key, rest) then
          return false
        end
      end
      return true
    end,
    record = function(token)
      local key, rest = bucket_of(current, bits, token)
      local expire_at = cur * gen + window
      if redis.call("RPUSH", key, rest) == 1 then
        redis.call("PEXPIREAT", key, expire_at)
      end
      redis.call("HINCRBY", meta, "count", 1)
      if redis.call("INCR", current .. "n") == 1 then
        redis.call("PEXPIREAT", current .. "n", expire_at)
      end
    end,
  }
end

local function buckets_filter(state, meta, writes, nfilter)
  local stored = redis.call("HMGET", meta, "bits", "gen", "window")
  local bits, gen = tonumber(stored[1]), stored[2]
  local window = nfilter >= 4 and ARGV[6] or false
  if gen and stored[3] ~= window then
    return nil, "DUPEFILTER_MISMATCH " .. meta .. " was written with window "
      .. (stored[3] or "none") .. " ms, this worker uses " .. (window or "none")
  end
  if not gen then
    if not writes then
      return EMPTY
    end
    bits = tonumber(ARGV[5])
    if not bits or bits < 0 or bits > 24 or bits ~= floor(bits) then
      return nil, "DUPEFILTER_LAYOUT " .. meta .. ": bits must be an integer 0..24"
    end
    local now = redis.call("TIME")
    gen = now[1] .. string.format("%06d", tonumber(now[2]))
    redis.call("HSET", meta, "bits", bits, "gen", gen, "count", 0)
    if window then
      redis.call("HSET", meta, "window", window)
    end
    filter_expire(state, meta)
  end
  if window then
    return buckets_window(meta, bits, gen, writes)
  end
  local prefix, pttl = meta .. ":" .. gen .. ":", nil
  return {
    test = function(token)
      local key, rest = bucket_of(prefix, bits, token)
      return redis.call("LPOS", key, rest) == false
    end,
    record = function(token)
      local key, rest = bucket_of(prefix, bits, token)
      if redis.call("RPUSH", key, rest) == 1 and state.ttl > 0 then
        -- a new bucket expires with the meta hash, not a whole TTL after it
        pttl = pttl or redis.call("PTTL", meta)
        if pttl > 0 then
          redis.call("PEXPIRE", key, pttl)
        end
      end
      redis.call("HINCRBY", meta, "count", 1)
    end,
  }
end

-- The state the functions of a kind without a window share: its expiry (ARGV[4], ms,
-- when the call gives filter arguments; 0 = none) and the keys it has checked.
local function filter_state(nfilter)
  return {ttl = nfilter > 0 and tonumber(ARGV[4]) or 0, checked = {}}
end

local function filter_for(kind, nfilter, n, first_key, writes)
  local state = filter_state(nfilter)
  if kind == "set" then
    return set_filter(state, KEYS[first_key])
  elseif kind == "zset" then
    return zset_filter(state, KEYS[first_key], n)
  elseif kind == "bf" then
    if nfilter >= 6 then
      return bf_window_filter(KEYS[first_key], n, writes)
    end
    return bf_filter(state, KEYS[first_key], n, writes)
  elseif kind == "bloom" then
    if nfilter >= 6 then
      return bloom_window_filter(KEYS[first_key], n, writes)
    end
    return bloom_filter(state, first_key, n, writes)
  elseif kind == "buckets" then
    return buckets_filter(state, KEYS[first_key], writes, nfilter)
  end
  return nil
end
