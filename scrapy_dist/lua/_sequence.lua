-- Library of the entry ids (prepended by scrapy_dist/scripts.py to every script whose
-- header says "-- uses: _sequence"). No KEYS or ARGV of its own.
--
-- The crawl's sequence counter (scrapy_dist/keys.py RedisKeys.seq, a string) numbers
-- queue entries (lua/enqueue.lua) and copies of one seed leased at once
-- (lua/reserve.lua). An id must be a whole number of at most ENTRY_ID_LEN digits that
-- a Lua number holds exactly, and greater than every id in use.
-- uses: _batch, _levels

-- The largest id: 2^53 (Lua numbers are doubles) fits ENTRY_ID_LEN (16) digits.
local MAX_ID = 9007199254740991

-- An id as ENTRY_ID_LEN digits (or fewer), never in exponent notation.
local function id_text(id)
  return string.format("%.0f", id)
end

-- The last digit of an id, by value (see id_texts).
local DIGITS = {[0] = "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}

-- The texts of the n ids first .. first + n - 1, each ENTRY_ID_LEN digits (zero-padded:
-- how entries start), in order. Formatting a number is most of the cost of building an
-- entry: this formats one number per ten ids and appends the last digit.
local function id_texts(first, n)
  local texts, k, id = array_of(n), 0, first
  local head_format = "%0" .. (ENTRY_ID_LEN - 1) .. ".0f"
  while k < n do
    local tens = math.floor(id / 10)
    local head = string.format(head_format, tens)
    for d = id - tens * 10, math.min(9, id - tens * 10 + n - k - 1) do
      k = k + 1
      texts[k] = head .. DIGITS[d]
    end
    id = (tens + 1) * 10
  end
  return texts
end

-- Set counter `seq` to the server's time in microseconds + n; returns it.
local function restart_at_clock(seq, n)
  local t = redis.call("TIME")
  local last = tonumber(t[1]) * 1000000 + tonumber(t[2]) + n
  redis.call("SET", seq, id_text(last))
  return last
end

-- Take n ids from counter `seq` (one INCRBY): returns the last of them (the first is
-- last - n + 1), and nil or, when the counter was garbled, the reason it was restarted.
-- A counter a script cannot count on (written by hand: not an integer, of another
-- type, negative, or past MAX_ID) would fail the call after its writes, or give ids
-- that collide or do not fit: it is renamed out of the way ("<seq>:wrongtype",
-- lua/_levels.lua set_aside; its text stays there) and restarts at the server's time in
-- microseconds, above any id it gave (one per microsecond at most since the crawl
-- began). So does a missing counter (INCRBY gave n): a crawl's first ids, or a counter
-- deleted or evicted mid-crawl, which must not give the ids of entries still queued or
-- leased by any worker again; in_use(), if given, says whether entries with ids are
-- known to exist, and only decides whether the server log warns. Any other error (OOM,
-- READONLY...) fails the call with Redis's own error.
local function next_ids(seq, n, in_use)
  local last = redis.pcall("INCRBY", seq, n)
  if last == n then
    -- a fresh counter: ids from the server's clock are above every id a lost counter
    -- gave (a lease overwritten in a holding would be a request lost)
    last = restart_at_clock(seq, n)
    if in_use and in_use() then
      redis.log(redis.LOG_WARNING, "scrapy_dist: sequence counter " .. seq .. " was "
        .. "missing while the crawl holds entries (deleted or evicted?): restarted at "
        .. id_text(last - n) .. ", above every id it gave")
    end
    return last, nil
  end
  if type(last) == "table" then
    local err = last.err
    if not (string.sub(err, 1, 9) == "WRONGTYPE" or string.find(err, "not an integer", 1, true)
        or string.find(err, "overflow", 1, true)) then
      redis.call("INCRBY", seq, n) -- fails the call with Redis's own error
    end
  elseif last - n >= 0 and last <= MAX_ID then
    return last, nil
  else
    redis.call("DECRBY", seq, n) -- its text as written, set aside below
  end
  local kind = redis.call("TYPE", seq)["ok"]
  local aside = set_aside(seq)
  last = restart_at_clock(seq, n)
  local reason = "sequence counter " .. seq .. " held a " .. kind .. " that is not an id "
    .. "counter (written by hand?): renamed to " .. aside .. ", restarted at "
    .. id_text(last - n) .. " (inspect it, then delete it)"
  redis.log(redis.LOG_WARNING, "scrapy_dist: " .. reason)
  return last, reason
end
