-- Library of the worker registry's scripts (prepended by scrapy_dist/scripts.py to every
-- script whose header says "-- uses: _registry": join, heartbeat, leave). No KEYS or ARGV
-- of its own.
--
-- The registry <crawl>:workers is a hash of worker id -> last heartbeat (server time in
-- seconds). One of another type (written by hand: SET <crawl>:workers x) is renamed out
-- of the way, never written over: "<key>:wrongtype" (lua/_levels.lua set_aside).
-- uses: _levels

-- Rename registry `key`, found holding a `kind`, out of the way; returns the reason
-- naming the new name, for the server's log.
local function set_aside_registry(key, kind)
  return "worker registry " .. key .. " held a " .. kind .. ", not a hash of heartbeats: "
    .. "renamed to " .. set_aside(key) .. " (inspect it, then delete it)"
end

-- Run `command` ({"HGETALL", key, ...}); a WRONGTYPE sets its key aside (reason_of(key,
-- kind) renames it, its reason goes to the server log) and reads as `empty`, with true.
-- Other errors fail the call with Redis's own error. (join.lua reads the registry and
-- the progress hash with it.)
local function call_or_set_aside(command, empty, reason_of)
  local value = redis.pcall(unpack(command))
  if type(value) ~= "table" or not value.err then
    return value, false
  end
  if string.sub(value.err, 1, 9) ~= "WRONGTYPE" then
    redis.call(unpack(command)) -- fails the call with Redis's own error
  end
  local key = command[2]
  redis.log(redis.LOG_WARNING, "scrapy_dist: " .. reason_of(key, redis.call("TYPE", key)["ok"]))
  return empty, true
end

-- Run a write of the registry (`command`, {"HSET", key, ...}); on WRONGTYPE the key is
-- set aside (set_aside_registry, logged) and the write made on a fresh hash. Returns the
-- reply, and true if the key was set aside.
local function registry_write(command)
  local reply, aside = call_or_set_aside(command, nil, set_aside_registry)
  if not aside then
    return reply, false
  end
  return redis.call(unpack(command)), true
end
