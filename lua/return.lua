-- return.lua: give `n` unused tokens back to one token bucket (the end of a lease), never
-- above capacity. Run with prelude.lua in front of it; same bucket, record, clock and
-- expiry as token_bucket.lua.
--
-- KEYS[1]  the bucket; a missing one is left alone (returning to it changes nothing:
--          the tokens are lost, which can only under-admit)
-- KEYS[2]  (optional) its rule record
-- ARGV[1]  capacity: an integer, 1 <= capacity <= 1e15
-- ARGV[2]  refill per second: 0 < refill <= 1e12
-- ARGV[3]  n: tokens to give back; an integer >= 0
--
-- Reply (integers): {remaining, reset_ms}: whole tokens in the bucket after the return
-- (0 in debt), and ms (rounded up) until it is full.
-- Error: "QPINVALID <reason>" for bad arguments; nothing is read or written then.
local capacity, refill, err = rule_args()
if err then
  return err
end
local n = num(ARGV[3], 0, math.huge, true)
if n == nil then
  return invalid('n must be an integer >= 0', ARGV[3])
end

local key, rkey = KEYS[1], KEYS[2]
if redis.call('EXISTS', key) == 0 then
  local fresh = record(rkey, capacity, refill, now_us(), false)
  return {math.floor(fresh + EPS), wait_ms(capacity, fresh, refill)}
end
local now = now_us()
local tokens, ts, dirty = load(key, rkey, capacity, refill, now, true)
tokens = math.min(tokens + n, capacity)
if n > 0 or dirty then
  store(key, rkey, tokens, ts, capacity, refill)
end
return {math.max(0, math.floor(tokens + EPS)), wait_ms(capacity, tokens, refill)}
