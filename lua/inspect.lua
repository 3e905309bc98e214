-- inspect.lua: read one token bucket as a call now would see it, writing nothing (for
-- `ratectl bucket inspect`). Run with prelude.lua in front of it; same bucket, record and
-- maths as token_bucket.lua.
--
-- KEYS[1]  the bucket
-- KEYS[2]  (optional) its rule record
-- ARGV[1]  capacity: an integer, 1 <= capacity <= 1e15
-- ARGV[2]  refill per second: 0 < refill <= 1e12
--
-- Reply: {exists (0|1), tokens (a string: the float, negative in debt), reset_ms,
--         pttl_ms (-1 no expiry, -2 missing), stored_capacity (string, "" if none),
--         stored_refill (string, "" if none)}
local capacity, refill, err = rule_args()
if err then
  return err
end
local key, rkey = KEYS[1], KEYS[2]
local v = redis.call('HMGET', key, 'c', 'r')
local exists = redis.call('EXISTS', key)
local tokens = load(key, rkey, capacity, refill, now_us(), false)
return {exists, string.format('%.17g', tokens), wait_ms(capacity, tokens, refill), redis.call('PTTL', key), v[1] or '', v[2] or ''}
