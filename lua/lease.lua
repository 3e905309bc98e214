-- lease.lua: take UP TO `want` tokens from one token bucket, atomically, for an instance
-- that spends them locally (a lease on a hot key). Same bucket, clock and state as
-- token_bucket.lua; see there for the rules on time, rounding and expiry.
--
-- KEYS[1]  the bucket (hash {tokens, ts}); a missing key is a full bucket
-- ARGV[1]  capacity: an integer, 1 <= capacity <= 1e15
-- ARGV[2]  refill per second; > 0, may be fractional
-- ARGV[3]  want: the most tokens to take; an integer >= 1 (more than capacity is allowed
--          and simply cannot all be granted)
-- ARGV[4]  debt (optional, default 0): charged first, as in token_bucket.lua; an
--          integer, 0 <= debt <= capacity
--
-- Reply (integers): {granted, remaining, retry_after_ms, reset_ms}
--   granted         min(want, floor(tokens)), 0 in debt: what the caller may now spend
--   remaining       whole tokens left after this call (floor; 0 while in debt)
--   retry_after_ms  0 when granted > 0, else ms (rounded up) until one token exists
--   reset_ms        ms (rounded up) until the bucket is full again
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
local want = finite(ARGV[3])
if want == nil or want < 1 or want ~= math.floor(want) then
  return redis.error_reply('QPINVALID want must be an integer >= 1, got ' .. tostring(ARGV[3]))
end
local debt = 0
if ARGV[4] ~= nil then
  debt = finite(ARGV[4])
  if debt == nil or debt < 0 or debt > capacity or debt ~= math.floor(debt) then
    return redis.error_reply('QPINVALID debt must be an integer between 0 and capacity, got ' .. tostring(ARGV[4]))
  end
end

local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens, ts = tonumber(state[1]), tonumber(state[2])
if tokens == nil or ts == nil then
  tokens, ts = capacity, now
elseif now > ts then
  tokens = tokens + (now - ts) * refill / 1000000
  ts = now
end
if tokens > capacity then
  tokens = capacity
end
tokens = tokens - debt
if tokens < -capacity then
  tokens = -capacity
end

local granted = math.max(0, math.min(want, math.floor(tokens + EPS)))
local retry_after = 0
if granted > 0 then
  tokens = tokens - granted
  if tokens < 0 then
    tokens = 0
  end
else
  retry_after = math.min(math.ceil((1 - tokens) * 1000 / refill - EPS), MAX_TTL_MS)
end
local reset = math.min(math.ceil((capacity - tokens) * 1000 / refill - EPS), MAX_TTL_MS)
if reset < 0 then
  reset = 0
end

if granted > 0 or debt > 0 then
  local ttl = math.min(math.max(2 * reset, 1000), MAX_TTL_MS)
  redis.call('HSET', key, 'tokens', tokens, 'ts', string.format('%d', ts))
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end

return {granted, math.max(0, math.floor(tokens + EPS)), retry_after, reset}
