-- Dedupe and enqueue a batch of requests in one atomic step: a fingerprint is
-- recorded only for a request that is queued in the same call ("seen implies queued").
--
-- KEYS[1] = request queue: a list, or a priority queue's marker (its levels,
--           lua/_levels.lua, are named after it)
-- KEYS[2] = sequence counter (string) giving each entry a unique, increasing id (one
--           written by hand is set aside and restarted, lua/_sequence.lua)
-- KEYS[3] = crawl epoch (see lua/_fence.lua)
-- KEYS[4] = the calling worker's holding hash (lua/_leases.lua; read for a request that
--           names a parent lease, and its size when the counter is found missing), or
--           KEYS[2] when the caller has none
-- KEYS[5..] = the dupefilter backend's keys (none when ARGV[2] == "none")
-- ARGV[1] = queue kind: "list" (LPUSH), "levels" (LPUSH to the list of the entry's
--           score, lua/_levels.lua) or "slots" (the same in the levels of the entry's
--           download slot; its score is then "<score>@<slot>", lua/_levels.lua)
-- ARGV[2] = filter kind: "none", "set", "bloom" (bitmap) or "bf" (RedisBloom)
-- ARGV[3] = F, the number of filter arguments that follow
-- ARGV[4 .. 3+F] = filter arguments (backend-specific, see lua/_filters.lua;
--                  ARGV[4], when given, is the expiry in milliseconds)
-- ARGV[4+F ..] = four per request: token ("" = dont_filter), score, payload, parent;
--                the token is what the backend tests and sets (the raw fingerprint
--                for "set" and "bf", its 16-byte MurmurHash3 for "bloom"); parent is
--                the lease id of the request whose callback produced it ("" = none:
--                a seed's, a start request's)
-- ARGV[#ARGV] = the crawl epoch the caller joined ("" = unfenced), after the requests
--
-- Entries are "<ENTRY_ID_LEN-digit id><payload>" (16 digits): ids keep identical
-- payloads distinct (and name their leases); each list is first-in first-out.
-- Redis does not roll a script back when a command fails, so the script writes in a
-- safe order: it only reads while deciding, pushes the new entries, and records their
-- tokens last. A failure can at worst queue a request whose token is not recorded
-- (crawled twice), never record a token whose request is not queued.
-- A request whose parent lease this worker no longer holds (it expired and was taken
-- back, or was delivered again to another worker: the worker was paused past its lease)
-- is refused: neither queued nor its token recorded; the parent's new holder crawls it.
-- Returns: one integer per request, 1 if queued, 0 if its token was seen, -1 if its
-- parent lease is not the caller's; an error "EPOCH ..." (or "TRYAGAIN ...", lua/_fence.lua) if the crawl's epoch is not
-- ARGV[#ARGV] (nothing written).
-- uses: _batch, _filters, _levels, _fence, _sequence

local queue, seq, holding = KEYS[1], KEYS[2], KEYS[4]
local queue_kind, filter_kind = ARGV[1], ARGV[2]
local nfilter = tonumber(ARGV[3])
local first = 4 + nfilter
local n = (#ARGV - first) / 4
local refused = fence(KEYS[3], ARGV[#ARGV])
if refused then
  return redis.error_reply(refused)
end

-- Per filter kind: test(token) returns true if the token is new (read-only);
-- record(token) marks it seen.
local filters = {}
if filter_kind == "set" then
  -- the exact set, the default: filter_for's, without building the other kinds
  filters.set = set_filter(filter_state(nfilter), KEYS[5])
elseif filter_kind ~= "none" then
  -- (the libraries' definitions only this block uses go here)
  -- the kinds live in lua/_filters.lua; one that must refuse the call says so here,
  -- before anything is written
  local refusal
  filters[filter_kind], refusal = filter_for(filter_kind, nfilter, n, 5, true)
  if refusal then
    return redis.error_reply(refusal)
  end
end

local filter = filters[filter_kind]
if filter_kind ~= "none" and filter == nil then
  return redis.error_reply("unknown filter kind " .. filter_kind)
end
local levels, slots = queue_kind == "levels", queue_kind == "slots"
if levels or slots then
  local refusal -- (the marker is written if absent)
  if levels then
    refusal = levels_refusal(queue)
  else
    -- (the libraries' definitions only this block uses go here)
    refusal = slots_refusal(queue)
  end
  if refusal then
    return redis.error_reply(refusal)
  end
else
  local queue_type = redis.call("TYPE", queue)["ok"]
  if queue_type ~= "none" and queue_type ~= "list" then
    return redis.error_reply("WRONGTYPE " .. queue .. " holds a " .. queue_type)
  end
end

-- Whether this worker still holds each parent lease: one HEXISTS per distinct parent
-- (an HMGET would make each lease record, ~100 bytes, a Lua string only to test it:
-- twice the instructions of an HEXISTS per parent, bench_instructions.py).
local holds = {}
for i = 0, n - 1 do
  local parent = ARGV[first + 4 * i + 3]
  if parent ~= "" and holds[parent] == nil then
    holds[parent] = redis.call("HEXISTS", holding, parent) == 1
  end
end

-- Whether each token that will be tested is new: one variadic read for a filter that
-- has test_many (lua/_filters.lua), else test(token) token by token below. `answer`
-- maps a distinct token to its place in `fresh`: one table keyed by token where there
-- were three (a key added to a table costs hundreds of instructions, more when the table
-- grows).
local fresh, answer
if filter ~= nil and filter.test_many then
  local distinct = array_of(n)
  answer = {}
  for i = 0, n - 1 do
    local token, parent = ARGV[first + 4 * i], ARGV[first + 4 * i + 3]
    if token ~= "" and not answer[token] and (parent == "" or holds[parent]) then
      distinct[#distinct + 1] = token
      answer[token] = #distinct
    end
  end
  fresh = filter.test_many(distinct)
end

-- 1. decide (reads only); a token repeated inside the batch is new only once
local result, accepted, tokens, pending = array_of(n), array_of(n), array_of(n), {}
for i = 0, n - 1 do
  local token, parent = ARGV[first + 4 * i], ARGV[first + 4 * i + 3]
  local new = true
  if parent ~= "" and not holds[parent] then
    new = nil
  elseif filter ~= nil and token ~= "" then
    if fresh then
      local k = answer[token]
      new = fresh[k]
      fresh[k] = false -- (its next copies are not new)
    else
      new = not pending[token] and filter.test(token)
      if new then
        pending[token] = true
      end
    end
    if new then
      tokens[#tokens + 1] = token
    end
  end
  result[i + 1] = new and 1 or (new == nil and -1 or 0)
  if new then
    accepted[#accepted + 1] = i
  end
end

-- 2. push the new entries (one variadic LPUSH per list, lua/_batch.lua)
if #accepted > 0 then
  -- asked only of a fresh counter (it starts at the server's clock either way): are
  -- there entries it would have numbered again, queued or leased by this worker? Yes
  -- (an error reading, a key of another type too): the server log warns that it went
  -- missing mid-crawl. Other workers' holdings are not read.
  local last = next_ids(seq, #accepted, function()
    local queued = slots and slots_queued(queue)
      or redis.pcall(levels and "ZCARD" or "LLEN", levels and levels_key(queue) or queue)
    if type(queued) ~= "number" or queued > 0 then
      return true
    end
    if holding == seq then -- no holding
      return false
    end
    -- leases of queue entries (a seed's lease id is not numbered by the counter)
    local records = redis.pcall("HVALS", holding)
    if records.err then
      return true
    end
    for _, record in ipairs(records) do
      if string.sub(record, 1, 2) == FROM_QUEUE .. "|" then
        return true
      end
    end
    return false
  end)
  local id_of = id_texts(last - #accepted + 1, #accepted)
  -- each entry: its id, then its payload
  if slots then
    -- (the libraries' definitions only this block uses go here)
    -- (each distinct "<score>@<slot>" split, and its level named, once: `parts`)
    local by_slot, order, parts = {}, {}, {}
    for k, i in ipairs(accepted) do
      local text = ARGV[first + 4 * i + 1]
      local part = parts[text]
      if part == nil then
        local score, slot = split_slot(text)
        part = {score, slot, level_name(score)}
        parts[text] = part
      end
      add_to_slot(by_slot, order, part[2], part[1], id_of[k] .. ARGV[first + 4 * i + 2], part[3])
    end
    local refusal = push_slots(queue, by_slot, order)
    if refusal then
      return redis.error_reply(refusal)
    end
  elseif levels then
    local by_level, order, names = {}, {}, {}
    for k, i in ipairs(accepted) do
      local score = ARGV[first + 4 * i + 1]
      local name = names[score]
      if name == nil then
        name = level_name(score)
        names[score] = name
      end
      add_to_level(by_level, order, name, id_of[k] .. ARGV[first + 4 * i + 2], #accepted)
    end
    local refusal = push_levels(queue, by_level, order)
    if refusal then
      return redis.error_reply(refusal)
    end
  else
    local push = array_of(#accepted)
    for k, i in ipairs(accepted) do
      push[k] = id_of[k] .. ARGV[first + 4 * i + 2]
    end
    batched({"LPUSH", queue}, push)
  end
end

-- 3. record their tokens
if #tokens > 0 and filter.record_many then
  filter.record_many(tokens)
else
  for _, token in ipairs(tokens) do
    filter.record(token)
  end
end
return result
