-- token_bucket.lua: take `cost` tokens from one token bucket, atomically.
--
-- KEYS[1]  the bucket: a hash {tokens = float, ts = Redis TIME in microseconds of the last
--          refill}. A missing key is a full bucket.
-- ARGV[1]  capacity: the most tokens the bucket holds; an integer, 1 <= capacity <= 1e15
-- ARGV[2]  refill per second; > 0, may be fractional ("0.3")
-- ARGV[3]  cost: tokens this request needs; an integer, 1 <= cost <= capacity
-- ARGV[4]  debt (optional, default 0): tokens a gateway's fallback admitted without this
--          bucket while Redis could not be reached, charged before the decision; an
--          integer, 0 <= debt <= capacity
--
-- Reply (integers): {allowed (0|1), remaining, retry_after_ms, reset_ms}
--   remaining       whole tokens left after this call (floor; 0 while in debt)
--   retry_after_ms  0 when allowed, else ms (rounded up) until `cost` tokens exist
--   reset_ms        ms (rounded up) until the bucket is full again
-- Error: "QPINVALID <reason>" for bad arguments; nothing is read or written then.
--
-- The clock is Redis TIME, never a client's, so gateway clock skew cannot matter. If TIME
-- ever goes backwards (a failover to a host with a slower clock), the bucket does not
-- refill until TIME passes the stored ts again: never more tokens than were due.
-- Token counts are floats; EPS absorbs the rounding of fractional refills so that, say,
-- ten refills of 0.3 tokens make 3 tokens, not 2.9999999999999996.
-- A charged debt may leave the bucket below empty (tokens < 0, never below -capacity): it
-- refuses until it has refilled past what was admitted without it.
-- A rejected call without debt writes nothing: refilling is a pure function of (tokens, ts, TIME), so
-- the stored state already says the same thing. An allowed call writes both fields and
-- sets PEXPIRE to twice the time until the bucket is full (at least 1 s): an expired key
-- is read as full, which it is by then, so expiry is exact and idle buckets cost nothing.
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
local cost = finite(ARGV[3])
if cost == nil or cost < 1 or cost > capacity or cost ~= math.floor(cost) then
  return redis.error_reply('QPINVALID cost must be an integer between 1 and capacity, got ' .. tostring(ARGV[3]))
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
  tokens = capacity -- refilled past the top, or the rule shrank
end
tokens = tokens - debt
if tokens < -capacity then
  tokens = -capacity
end

local allowed = 0
if tokens + EPS >= cost then
  allowed = 1
  tokens = tokens - cost
  if tokens < 0 then
    tokens = 0
  end
end

local retry_after = 0
if allowed == 0 then
  retry_after = math.min(math.ceil((cost - tokens) * 1000 / refill - EPS), MAX_TTL_MS)
end
local reset = math.min(math.ceil((capacity - tokens) * 1000 / refill - EPS), MAX_TTL_MS)
if reset < 0 then
  reset = 0
end

if allowed == 1 or debt > 0 then
  local ttl = math.min(math.max(2 * reset, 1000), MAX_TTL_MS)
  redis.call('HSET', key, 'tokens', tokens, 'ts', string.format('%d', ts))
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end

return {allowed, math.max(0, math.floor(tokens + EPS)), retry_after, reset}
