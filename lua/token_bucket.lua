-- token_bucket.lua: take `cost` tokens from one token bucket, atomically. Run with
-- prelude.lua in front of it (lua/bucket.go); see there for the storage, the rule
-- record, the clock and expiry.
--
-- KEYS[1]  the bucket
-- KEYS[2]  (optional) its rule record; without it a missing bucket starts empty
-- ARGV[1]  capacity: an integer, 1 <= capacity <= 1e15
-- ARGV[2]  refill per second: 0 < refill <= 1e12, may be fractional ("0.3")
-- ARGV[3]  cost: an integer, 1 <= cost <= capacity
-- ARGV[4]  debt (optional, default 0): tokens a gateway's fallback admitted without this
--          bucket while Redis could not be reached, charged before the decision (never
--          below -capacity); an integer, 0 <= debt <= capacity
--
-- Reply (integers): {allowed (0|1), remaining, retry_after_ms, reset_ms, charged}
--   remaining       whole tokens left after this call (floor; 0 while in debt)
--   retry_after_ms  0 when allowed, else ms (rounded up) until `cost` tokens exist
--   reset_ms        ms (rounded up) until the bucket is full again
--   charged         whole tokens of the debt actually charged (less than debt when the
--                   -capacity floor clipped it)
-- Error: "QPINVALID <reason>" for bad arguments; nothing is read or written then.
local capacity, refill, err = rule_args()
if err then
  return err
end
local cost = num(ARGV[3], 1, capacity, true)
if cost == nil then
  return invalid('cost must be an integer between 1 and capacity', ARGV[3])
end
local debt, derr = debt_arg(capacity)
if derr then
  return derr
end

local key, rkey = KEYS[1], KEYS[2]
local now = now_us()
local tokens, ts, dirty, charged = open_charged(capacity, refill, debt, now)

local allowed = 0
local retry_after = 0
if tokens + EPS >= cost then
  allowed = 1
  tokens = math.max(tokens - cost, 0)
else
  retry_after = wait_ms(cost, tokens, refill)
end

-- A rejected call without debt on a bucket that exists under the same rule writes
-- nothing: refilling is a pure function of (tokens, ts, TIME).
if allowed == 1 or debt > 0 or dirty then
  store(key, rkey, tokens, ts, capacity, refill)
end

return {allowed, math.max(0, math.floor(tokens + EPS)), retry_after, wait_ms(capacity, tokens, refill), charged}
