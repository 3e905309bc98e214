-- return.lua: give `n` unused tokens back to one token bucket (the end of a lease), never
-- above capacity. Same bucket, clock and state as token_bucket.lua.
--
-- KEYS[1]  the bucket (hash {tokens, ts}); a missing key is a full bucket, so returning
--          to it changes nothing and writes nothing
-- ARGV[1]  capacity: an integer, 1 <= capacity <= 1e15
-- ARGV[2]  refill per second; > 0, may be fractional
-- ARGV[3]  n: tokens to give back; an integer >= 0
--
-- Reply (integers): {remaining, reset_ms}: whole tokens in the bucket after the return (0 in debt),
-- and ms (rounded up) until it is full. A bucket that the return makes full is deleted
-- (a missing key is a full bucket).
-- Error: "QPINVALID <reason>" for bad arguments; nothing is read or written then.
local EPS = 1e-9
local MAX_CAPACITY = 1e15
local MAX_TTL_MS = 2 ^ 40 -- also caps the replied waits: Redis turns a Lua number past 2^63 into -2^63

local function finite(v)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then
    return nil
  end
  return n
end

local capacity = finite(ARGV[1])
if capacity == nil or capacity < 1 or capacity > MAX_CAPACITY or capacity ~= math.floor(capacity) then
  return redis.error_reply('QPINVALID capacity must be an integer between 1 and 1e15, got ' .. tostring(ARGV[1]))
end
local refill = finite(ARGV[2])
if refill == nil or refill <= 0 then
  return redis.error_reply('QPINVALID refill per second must be a number > 0, got ' .. tostring(ARGV[2]))
end
local n = finite(ARGV[3])
if n == nil or n < 0 or n ~= math.floor(n) then
  return redis.error_reply('QPINVALID n must be an integer >= 0, got ' .. tostring(ARGV[3]))
end

local key = KEYS[1]
local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens, ts = tonumber(state[1]), tonumber(state[2])
if tokens == nil or ts == nil then
  return {capacity, 0}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if now > ts then
  tokens = tokens + (now - ts) * refill / 1000000
  ts = now
end
if tokens < -capacity then
  tokens = -capacity -- a debt charged by token_bucket.lua or lease.lua stays owed
end
tokens = tokens + n
if tokens + EPS >= capacity then
  redis.call('DEL', key)
  return {capacity, 0}
end

local reset = math.min(math.ceil((capacity - tokens) * 1000 / refill - EPS), MAX_TTL_MS)
if reset < 0 then
  reset = 0
end
if n > 0 then
  local ttl = math.min(math.max(2 * reset, 1000), MAX_TTL_MS)
  redis.call('HSET', key, 'tokens', tokens, 'ts', string.format('%d', ts))
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end
return {math.max(0, math.floor(tokens + EPS)), reset}
