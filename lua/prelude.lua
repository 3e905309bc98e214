-- prelude.lua: the bucket's storage and refill maths, shared by token_bucket.lua,
-- lease.lua, return.lua and inspect.lua. Go prepends it to each script (lua/bucket.go),
-- so every script still loads alone (SCRIPT LOAD, redis-benchmark).
--
-- A bucket is a hash {tokens, ts, c, r}: tokens (a float; below 0 while in debt), ts
-- (Redis TIME in microseconds of the last refill), and the rule it was written under,
-- c (capacity) and r (refill per second). The clock is Redis TIME, never a client's; if
-- TIME goes backwards the bucket does not refill until TIME passes ts again.
--
-- KEYS[2], when given, is the bucket's rule record, a hash {c, r, s, p} shared by the
-- buckets of one (tenant, route) in the same Redis Cluster slot and never expired: the
-- rule last seen (c, r), since when (s, TIME in us), and p, what a missing bucket read
-- as at s. A missing bucket reads as full(now) = min(c, p + r * (now - s)):
--   * a rule first seen starts full (p = c);
--   * a rule change seen at time s sets p = min(new c, full(s) under the old record),
--     so a rule raised after a key expired starts from the old bucket, not the new size,
--     and grows at the new refill from s on.
-- Such a bucket expires once full (PEXPIRE 2x the time to fill, at least 1 s): a missing
-- key then reads as what it was.
--
-- Without KEYS[2] (the shards i >= 1 of a sharded rule, which live in other slots), a
-- missing bucket starts EMPTY at now and is written at once, without expiry: a new shard
-- count never creates full shards out of nothing.
--
-- A rule change on an existing bucket (its c, r differ from ARGV) refills under its old
-- rule, capped at the old capacity, up to the change (the record's s, or now without a
-- record), then at the new refill, and is clipped to the new capacity: a rule change
-- never creates tokens, and takes effect at the first call that sees it.
--
-- Token counts are floats; EPS absorbs the rounding of fractional refills. Capacity is
-- at most 1e15 and refill at most 1e12 per second, so whole token counts stay exact in a
-- double (2^53 > 9e15).
local EPS = 1e-9
local MAX_CAPACITY = 1e15
local MAX_REFILL = 1e12
local MAX_TTL_MS = 2 ^ 40 -- also caps the replied waits: Redis turns a Lua number past 2^63 into -2^63

-- num returns v as a finite number within [lo, hi] (an integer if int), else nil.
local function num(v, lo, hi, int)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge or n < lo or n > hi then
    return nil
  end
  if int and n ~= math.floor(n) then
    return nil
  end
  return n
end

local function invalid(msg, v)
  return redis.error_reply('QPINVALID ' .. msg .. ', got ' .. tostring(v))
end

-- rule_args reads ARGV[1] (capacity) and ARGV[2] (refill per second), or returns an
-- error reply as its third value.
local function rule_args()
  local capacity = num(ARGV[1], 1, MAX_CAPACITY, true)
  if capacity == nil then
    return nil, nil, invalid('capacity must be an integer between 1 and 1e15', ARGV[1])
  end
  local refill = num(ARGV[2], 0, MAX_REFILL, false)
  if refill == nil or refill <= 0 then
    return nil, nil, invalid('refill per second must be a number > 0 and <= 1e12', ARGV[2])
  end
  return capacity, refill, nil
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function us(v)
  return string.format('%d', v)
end

-- record reads the rule record rkey (nil: none) under the rule (capacity, refill) at
-- now and returns what a missing bucket reads as and when the rule last changed. With
-- write, a rule first seen or changed is recorded.
local function record(rkey, capacity, refill, now, write)
  if rkey == nil then
    return 0, now
  end
  local v = redis.call('HMGET', rkey, 'c', 'r', 's', 'p')
  local c, r, s, p = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), tonumber(v[4])
  if c == nil or r == nil or s == nil or p == nil then
    if write then
      redis.call('HSET', rkey, 'c', capacity, 'r', refill, 's', us(now), 'p', capacity)
    end
    return capacity, now
  end
  local full = p
  if now > s and full < c then
    full = math.min(c, p + (now - s) * r / 1000000)
  end
  if c == capacity and r == refill then
    return math.min(full, capacity), s
  end
  full = math.min(full, capacity)
  if write then
    redis.call('HSET', rkey, 'c', capacity, 'r', refill, 's', us(now), 'p', full)
  end
  return full, now
end

-- load reads the bucket at key under (capacity, refill) at now (see the top). It returns
-- tokens (at most capacity), ts, and whether the bucket must be written even if nothing
-- is taken (a new bucket without a record, or a rule change).
local function load(key, rkey, capacity, refill, now, write)
  local v = redis.call('HMGET', key, 'tokens', 'ts', 'c', 'r')
  local tokens, ts, c0, r0 = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), tonumber(v[4])
  local fresh, since = record(rkey, capacity, refill, now, write)
  if tokens == nil or ts == nil then
    return fresh, now, rkey == nil
  end
  if c0 == nil or r0 == nil then
    c0, r0 = capacity, refill -- written before buckets kept their rule
  end
  local changed = c0 ~= capacity or r0 ~= refill
  if now > ts then
    if not changed then
      tokens = tokens + (now - ts) * refill / 1000000
    else
      local t = math.min(math.max(since, ts), now)
      tokens = math.min(tokens + (t - ts) * r0 / 1000000, math.max(tokens, c0))
      tokens = tokens + (now - t) * refill / 1000000
    end
    ts = now
  end
  if tokens > capacity then
    tokens = capacity -- refilled past the top, or the rule shrank
  end
  return tokens, ts, changed
end

-- wait_ms is how long (ms, rounded up, capped) until the bucket holds want tokens.
local function wait_ms(want, tokens, refill)
  local w = math.min(math.ceil((want - tokens) * 1000 / refill - EPS), MAX_TTL_MS)
  if w < 0 then
    return 0
  end
  return w
end

-- store writes the bucket and its rule; with a record it expires once full, without one
-- it never expires (see the top).
local function store(key, rkey, tokens, ts, capacity, refill)
  redis.call('HSET', key, 'tokens', tokens, 'ts', us(ts), 'c', capacity, 'r', refill)
  if rkey ~= nil then
    local ttl = math.min(math.max(2 * wait_ms(capacity, tokens, refill), 1000), MAX_TTL_MS)
    redis.call('PEXPIRE', key, us(ttl))
  else
    redis.call('PERSIST', key)
  end
end

-- charge takes debt from tokens, never below -capacity, and returns the new tokens and
-- the whole tokens actually charged.
local function charge(tokens, debt, capacity)
  if debt <= 0 then
    return tokens, 0
  end
  local after = math.max(tokens - debt, -capacity)
  return after, math.floor(tokens - after + EPS)
end

-- debt_arg reads the optional debt argument ARGV[4] (0 when absent), or returns an error
-- reply as its second value.
local function debt_arg(capacity)
  if ARGV[4] == nil then
    return 0, nil
  end
  local debt = num(ARGV[4], 0, capacity, true)
  if debt == nil then
    return nil, invalid('debt must be an integer between 0 and capacity', ARGV[4])
  end
  return debt, nil
end

-- open_charged loads the bucket of KEYS[1] (its rule record KEYS[2]) at now, refilled
-- under the rule in force and moved to this one, and charges debt from it. It returns
-- the tokens, the time of the last refill, whether the state must be written, and the
-- whole tokens charged.
local function open_charged(capacity, refill, debt, now)
  local tokens, ts, dirty = load(KEYS[1], KEYS[2], capacity, refill, now, true)
  local charged
  tokens, charged = charge(tokens, debt, capacity)
  return tokens, ts, dirty, charged
end

-- (end of prelude)
