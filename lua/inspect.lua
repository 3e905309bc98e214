-- inspect.lua: read one bucket as a take now would see it, writing nothing (for
-- `ratectl bucket inspect`). Run with state.lua in front of it.
--
-- KEYS[1]  the bucket
-- ARGV[1]  capacity (1..1e15);  ARGV[2]  refill per second (0 < r <= 1e12)
-- ARGV[3]  (optional, default 0) ms since the rule last changed, 0..2^40: converted at
--          that instant, as decide.lua's ago
--
-- Reply: {exists (0|1), tokens (a string: the float, negative in debt), reset_ms,
--         pttl_ms (-1 no expiry, -2 missing), stored_capacity (string, "" if none),
--         stored_refill (string, "" if none)}
local c, r = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (c and c >= 1 and c <= MAX_CAPACITY and c == math.floor(c)) then
  return redis.error_reply('QPINVALID capacity must be an integer between 1 and 1e15, got ' .. tostring(ARGV[1]))
end
if not (r and r > 0 and r <= MAX_REFILL) then
  return redis.error_reply('QPINVALID refill per second must be a number > 0 and <= 1e12, got ' .. tostring(ARGV[2]))
end
local ago = tonumber(ARGV[3] or 0)
if not (ago and ago >= 0 and ago <= MAX_WAIT_MS) then
  return redis.error_reply('QPINVALID ago must be a number of ms between 0 and 2^40, got ' .. tostring(ARGV[3]))
end
local v, t, c0, r0, d = pcall('GET', KEYS[1]) -- WRONGTYPE comes back as a table, not as a failure
if type(v) == 'table' then -- the hash of the previous storage (state.lua)
  local h = pcall('HMGET', KEYS[1], 'tokens', 'ts', 'c', 'r')
  if h.err then
    h = {} -- another type: read as missing, as decide.lua does
  end
  local ts
  t, ts, c0, r0 = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
  if t and ts and c0 and r0 then
    local el = (now_s * 1000000 + now_us) - ts
    if el > 0 then
      t = math.min(t + el * r0 / 1000000, math.max(t, c0))
    end
    d = (c0 - t) * 1000000 / r0
  else
    t = nil
  end
elseif v and #v == 28 then -- another length reads as missing, as decide.lua does
  local full_s, full_us
  full_s, full_us, c0, r0 = unpack(FORMAT, v)
  d = (full_s - now_s) * 1000000 + (full_us - now_us) -- us until full
  t = c0
  if d > 0 then
    t = c0 - d * r0 / 1000000
  end
end
local exists, sc, sr = 0, '', ''
if t == nil then
  t = c
else
  exists, sc, sr = 1, string.format('%.17g', c0), string.format('%.17g', r0)
  local at = (c0 ~= c or r0 ~= r) and ago > 0 and c0 - (d + ago * 1000) * r0 / 1000000
  if at and at >= 0 then -- converted at the change, as decide.lua does
    t = math.min(t, math.min(at, c0, c) + ago * r / 1000)
  end
  t = math.min(t, c) -- as decide.lua reads it: a debt stays whole under a smaller capacity
end
local reset = math.min(math.max(math.ceil((c - t) * 1000 / r - EPS), 0), MAX_WAIT_MS)
return {exists, string.format('%.17g', t), reset, redis.call('PTTL', KEYS[1]), sc, sr}
