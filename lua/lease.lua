-- lease.lua: take UP TO `want` tokens from one token bucket, atomically, for an instance
-- that spends them locally (a lease on a hot key). Run with prelude.lua in front of it;
-- same bucket, record, clock and expiry as token_bucket.lua.
--
-- KEYS[1]  the bucket
-- KEYS[2]  (optional) its rule record
-- ARGV[1]  capacity: an integer, 1 <= capacity <= 1e15
-- ARGV[2]  refill per second: 0 < refill <= 1e12
-- ARGV[3]  want: the most tokens to take; an integer >= 1 (more than capacity is allowed
--          and simply cannot all be granted)
-- ARGV[4]  debt (optional, default 0): charged first, as in token_bucket.lua
--
-- Reply (integers): {granted, remaining, retry_after_ms, reset_ms, charged}
--   granted         min(want, floor(tokens)), 0 in debt: what the caller may now spend
--   retry_after_ms  0 when granted > 0, else ms (rounded up) until one token exists
--   the others as in token_bucket.lua
-- Error: "QPINVALID <reason>" for bad arguments; nothing is read or written then.
local capacity, refill, err = rule_args()
if err then
  return err
end
local want = num(ARGV[3], 1, math.huge, true)
if want == nil then
  return invalid('want must be an integer >= 1', ARGV[3])
end
local debt, derr = debt_arg(capacity)
if derr then
  return derr
end

local key, rkey = KEYS[1], KEYS[2]
local now = now_us()
local tokens, ts, dirty, charged = open_charged(capacity, refill, debt, now)

local granted = math.max(0, math.min(want, math.floor(tokens + EPS)))
local retry_after = 0
if granted > 0 then
  tokens = math.max(tokens - granted, 0)
else
  retry_after = wait_ms(1, tokens, refill)
end

if granted > 0 or debt > 0 or dirty then
  store(key, rkey, tokens, ts, capacity, refill)
end

return {granted, math.max(0, math.floor(tokens + EPS)), retry_after, wait_ms(capacity, tokens, refill), charged}
