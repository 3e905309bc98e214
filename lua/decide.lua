-- decide.lua: decide a batch of requests against token buckets and calendar-quota
-- counters, atomically. Run with state.lua in front of it (lua/script.go): see there for
-- the storage of a token bucket and the clock.
--
-- KEYS     every bucket of every decision, in order.
-- ARGV[1]  the decisions, little-endian binary (decimal arguments would cost a strtod
--          each, most of the script's time): per decision  op (uint8), n (double),
--          nb (uint8), then per bucket (nb of them)  c, r, debt, cap (doubles), and
--          ago (a double) when op has its high bit set (op + 128):
--   op    1 take:   take n tokens from every bucket, or from none (1 <= n <= each c)
--         2 lease:  take g = min(n, whole tokens of the emptiest bucket) from every one
--         3 return: give n tokens back to every bucket that exists, up to its capacity
--         4 charge: charge the debts only
--         5 settle: take n more from every bucket, whatever it holds, into debt with no
--                   floor but the deepest a key can hold (below): the real cost of an
--                   admitted request known after its response (n >= 0)
--   c     capacity, an integer 1..1e15;  r  refill per second, 0 < r <= 1e12
--   debt  tokens a gateway's fallback admitted without Redis, charged first, before the
--         decision, never below -c nor above what the bucket held (an integer >= 0)
--   cap   -1: none. >= 0: the most the bucket may hold now if it is missing: within
--         one fill time of a change that may have raised the tenant's limit, a bucket
--         that expired full under the old limit holds no more than the old limit plus
--         the new refill since the change. <= -2: -2 - cap is the most it may hold,
--         missing or stored (a shard other than shard 0, which may be one left over from
--         an earlier layout, refilled while unused)
--   ago   ms since the bucket's rule (c, r) last changed, as the caller knows it (0, or
--         absent: not known), 0..2^40: a stored bucket of another rule is converted at
--         that instant (below). A caller sends it only within a fill time of the change
--         (after that, converting at the change or at the call is the same), so most
--         decisions go without. Ignored by a counter.
-- The buckets of one decision are, for example, a tenant's route bucket and the bucket
-- of one client value nested inside it: both must admit.
--
-- A counter (r <= -1) is a bucket of another kind: the usage of a calendar quota (an
-- amount per hour, day, week or month) in one region for one period. The gateway names
-- one key per period, so the key changes at the period's end and the script never
-- resets one. Its numbers, in the same 32 bytes (40 with an ago, unused):
--   c     the allowance, the most it may reach: an integer 1..1e15
--   r     -r is when the key expires, unix ms (an integer 1..2^53): SET PXAT
--   debt  fallback admissions, added first, whole (an integer >= 0)
--   cap   the floor, the least it holds: usage the control plane knows of, in case Redis
--         lost the key (an integer 0..1e15; no -1 nor -2 - cap for a counter)
-- Stored: the used count as a decimal integer (Redis int-encodes it, the smallest
-- value). used = max(stored, floor) + debt, then, by op: a take admits only if
-- used + n <= c for every counter (and every token bucket admits), then used += n; a
-- lease grants at most c - used (>= 0), as the emptiest bucket; a return lowers used by
-- n, not below 0, if the key exists; a charge adds the debt only; a settle adds n with
-- no bound (above c). Used never passes MAX_USED (1e18, below): a settle or debt past it
-- stops there, and g says how much a settle took. A counter is written only when it
-- changed: taken, settled, returned, a debt charged, or the floor raised it.
--
-- A rule change on a stored bucket: it holds the lower of what it refilled under the
-- rule it was written under until now, and what it held at the change (ago ms before
-- now) plus the new refill since, clipped to the new capacity (a debt stays whole). So an
-- idle bucket refills at its old rate only until the change, not until its next call, and
-- no conversion holds more than the old rule would. Read back to the change, a bucket
-- below empty was written after it (by a gateway with an older rule, or a newer one: the
-- script cannot tell which is newer) or was in debt then: it converts at this call, as
-- without an ago, and no debt is forgiven. One written after it but not below empty is
-- read back at the old rate, which cuts what its writer left: so the gateway sends the
-- age less one reload lag, by when every gateway has the change and wrote before it
-- (docs/reliability.md, "Known gaps"). A stored value that is not a bucket (another
-- type, another length, NaN; another client's) reads as missing and is replaced by the
-- next write, rather than failing the batch.
--
-- Reply, per decision:  g, retry_ms,  then per bucket:  remaining, reset_ms, charged
-- (a counter:  remaining = max(c - used, 0), used, charged)
--   g         take: 1 admitted, 0 refused;  lease: tokens granted;  return, charge: 0;
--             settle: the whole tokens it took from every bucket (n, less what the
--             depth bound clipped of the bucket it clipped most)
--   retry_ms  0 unless refused (take) or nothing granted (lease): ms until the bucket
--             that refuses longest holds n tokens (a lease: one). A counter that
--             refuses counts for nothing here (the gateway knows its period's end): 0 if
--             only counters refuse
--   remaining whole tokens left (0 in debt);  reset_ms: ms until full;
--   charged   whole tokens of the debt charged (less than debt where -c clipped it)
-- Depth: only a settle takes a bucket below -c (a debt stops at -c, a take at 0; a
-- capacity lowered keeps a debt past the new -c: nothing owed is forgiven). Nothing takes
-- a bucket below its floor, c - r * FLOOR_S (below): a take or a lease stops at
-- max(0, floor), a debt at max(-c, floor), so a refill so slow that its full time would
-- not fit a double (below about c * 1e-294 per second) admits nothing. A settle stops MAX_DEBT_S
-- of refill below full (2^40 ms - 2 s, 34.8 years; from 2071, 2^32 - 1 - now s, less):
-- the full time must fit the state's uint32 seconds, and the TTL, capped at MAX_WAIT_MS,
-- must not end before the bucket is full (an expired key reads as full). So tokens >=
-- c - r * MAX_DEBT_S; the worst case, r = 1e12, is about -1.1e21 tokens and 34.8 years
-- to full (whole counts are exact above -2^53). A settle past the bound takes what is
-- left above it, and g says how much.
-- Error "QPINVALID <reason>" for bad arguments: a batch of the wrong shape is refused
-- whole, before anything is read; the numbers of each decision are checked before it
-- writes anything, so a refused decision changes nothing, and the decisions before it in
-- the batch stand (a gateway checks every decision in Go before it joins a batch, so only
-- another client can be refused here).
--
-- Redis calls: TIME once per batch (state.lua); per token bucket one GET, and one PSETEX only
-- when the bucket changed (tokens taken, settled or returned, a debt charged, a new rule); per
-- counter one GET, and one SET .. PXAT only when it changed. A refused take writes nothing
-- unless it converts the bucket to a new rule or charges a debt: refilling is a pure function
-- of the stored time, and a counter's floor is written only when it raised the stored count.
local MAX_USED = 1e18 -- a counter's most: a Redis integer (< 2^63) and an integer reply
local MAX_EXPIRE = 2 ^ 53 -- a counter's latest expiry, unix ms (exact in a double)
local format = string.format
-- DEEP_S: the most seconds a settle may take a bucket below full (the header's Depth).
local DEEP_S = UINT32 - now_s - 1
if DEEP_S > MAX_DEBT_S then
  DEEP_S = MAX_DEBT_S
end
-- FLOOR_S: the most seconds below full a stored full time holds at all (the write stops
-- at 1e300 us). No take, lease or debt takes a bucket below c - r * FLOOR_S, its floor,
-- which is above 0 only for a refill below about c * 1e-294 per second.
local FLOOR_S = 1e294
local s = ARGV[1]
local len, nkeys = s and #s or 0, #KEYS
-- The batch's shape first (two bytes read per decision): whole decisions, one key per
-- bucket. A malformed batch is refused before anything is read or written.
local pos, k = 1, 0
while pos + 9 <= len do
  local nb = s:byte(pos + 9)
  if nb == 0 then
    break -- a decision needs a bucket: the shape check below refuses the batch
  end
  pos, k = pos + 10 + (s:byte(pos) < 128 and 32 or 40) * nb, k + nb
end
if pos ~= len + 1 or k ~= nkeys then
  return redis.error_reply('QPINVALID the decisions must fill the argument, op (uint8), n (double), nb (uint8) and nb buckets of 32 bytes each (40 with an ago: op + 128), with one key per bucket')
end
-- out, st: sized for one decision of one bucket (growing a table rehashes it).
local out, st, o = {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}, 0
pos, k = 1, 0
-- st holds, per bucket of the decision at hand (6 slots each): c, r, tokens (a counter:
-- used), whether it exists, whether it must be written, the debt charged. One table for
-- the whole batch.
while pos <= len do
  local op, n, nb, from = unpack('<BdB', s, pos)
  local w, ago = 32, 0 -- bytes per bucket; the rule's change, if sent
  if op >= 128 then
    op, w = op - 128, 40
  end
  -- One comparison chain per number (NaN fails every one). A bucket is read as it is
  -- checked; nothing is written before the whole decision has passed.
  if not (op >= 1 and op <= 5 and n >= 0 and n <= 2 * MAX_CAPACITY and n % 1 == 0
      and (n >= 1 or op >= 3) and nb >= 1 and from + w * nb - 1 <= len and k + nb <= nkeys) then
    return redis.error_reply('QPINVALID at byte ' .. pos .. ': op must be 1 (take), 2 (lease), 3 (return), 4 (charge) or 5 (settle), plus 128 with an ago, n an integer >= 1 (>= 0 to return, charge or settle), and nb count the buckets that follow, 32 bytes (40) and a key each')
  end
  pos = from
  local low, ok = 1e300, true -- the emptiest bucket's tokens; whether all admit a take
  for j = 0, 6 * (nb - 1), 6 do
    local c, r, debt, cap
    if w == 32 then
      c, r, debt, cap, pos = unpack('<dddd', s, pos)
    else
      c, r, debt, cap, ago, pos = unpack('<ddddd', s, pos)
    end
    if not (c >= 1 and c <= MAX_CAPACITY and c % 1 == 0 and ago >= 0 and ago <= MAX_WAIT_MS
        and debt >= 0 and debt <= 2 * MAX_CAPACITY and debt % 1 == 0 and (op ~= 1 or n <= c)
        and (r > 0 and r <= MAX_REFILL
          and cap >= -2 - MAX_CAPACITY and cap <= MAX_CAPACITY and (cap >= 0 or cap == -1 or cap <= -2)
          or r <= -1 and r >= -MAX_EXPIRE and r % 1 == 0 and cap >= 0 and cap <= MAX_CAPACITY and cap % 1 == 0)) then
      return redis.error_reply('QPINVALID at byte ' .. pos - w .. ': a bucket needs an integer capacity 1..1e15 (a take at most it), an integer debt >= 0 and an ago of 0..2^40 ms; a token bucket a refill in (0, 1e12] and a cap of -1, 0..1e15 or -2-1e15..-2; a counter an integer -expiry (unix ms) in [-2^53, -1] and an integer floor 0..1e15')
    end
    if r < 0 then
      -- A counter: its used count. Anything but a number (a missing key, another type, a
      -- NaN) reads as the floor; an absurd count stops at MAX_USED.
      local v = pcall('GET', KEYS[k + j / 6 + 1])
      local u, dirty, charged = tonumber(v) or 0, false, debt
      if not (u >= cap) then
        u, dirty = cap, true -- the floor raised it (a missing key: unless the floor is 0)
      elseif u > MAX_USED then
        u, dirty = MAX_USED, true
      end
      if debt > 0 then
        u, dirty = u + debt, true
        if u > MAX_USED then
          charged, u = debt - (u - MAX_USED), MAX_USED
        end
      end
      if u + n > c then
        ok = false
      end
      if c - u < low then
        low = c - u
      end
      st[j + 1], st[j + 2], st[j + 3], st[j + 4], st[j + 5], st[j + 6] = c, r, u, v ~= false, dirty, charged
    else
      local capAll = cap <= -2
      if capAll then
        cap = -2 - cap
      end
      local key = KEYS[k + j / 6 + 1]
      -- GET: the bucket's one read (pcall: the old storage's WRONGTYPE comes back as a table).
      local v, t, has, dirty, charged = pcall('GET', key), c, false, false, 0
      if v then
        local c0, r0, d -- d: us until full under the stored rule
        if type(v) == 'table' then
          -- WRONGTYPE: the hash of the previous storage (state.lua), read once with HMGET
          -- and refilled to now; the write below replaces it.
          -- Another type (a list, a set) errors: then, as a hash with other fields or a NaN,
          -- it reads as missing, and the write replaces it.
          local h, ts = pcall('HMGET', key, 'tokens', 'ts', 'c', 'r')
          if h.err then
            h = {}
          end
          t, ts, c0, r0 = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
          if t and ts and c0 and r0 and t == t and ts == ts and c0 >= 1 and c0 <= MAX_CAPACITY
              and r0 > 0 and r0 <= MAX_REFILL then
            local el = (now_s * 1000000 + now_us) - ts
            if el > 0 then
              t = math.min(t + el * r0 / 1000000, math.max(t, c0))
            end
            d = (c0 - t) * 1000000 / r0
          else
            t = nil
          end
        else
          -- Anything but 28 bytes of sane numbers (written by another client) reads as
          -- missing, and the write replaces it: an error would fail the whole batch.
          t = nil
          if #v == 28 then
            local full_s, full_us
            full_s, full_us, c0, r0 = unpack(FORMAT, v)
            if full_us == full_us and c0 >= 1 and c0 <= MAX_CAPACITY and r0 > 0 and r0 <= MAX_REFILL then
              d = (full_s - now_s) * 1000000 + (full_us - now_us)
              t = c0
              if d > 0 then
                t = c0 - d * r0 / 1000000
              end
            end
          end
        end
        if t then
          has, dirty = true, c0 ~= c or r0 ~= r -- a new rule: store the converted state
          -- Converted at the change (header): what it held then under the old rule, if
          -- that is not below empty, plus the new refill since.
          local at = dirty and ago > 0 and c0 - (d + ago * 1000) * r0 / 1000000
          if at and at >= 0 then
            if at > c0 then
              at = c0 -- full before the change
            end
            if at > c then
              at = c
            end
            at = at + ago * r / 1000
            if at < t then
              t = at
            end
          end
          if t > c then
            t = c -- refilled past the top, or the rule shrank; a debt stays whole
          end
        else
          t = c
        end
      end
      if cap >= 0 and t > cap and (capAll or not has) then
        t = cap
      end
      -- floor: a take, a lease and a debt stop at max(0 or -c, the storable floor).
      local floor = c - r * FLOOR_S
      if debt > 0 then
        local lo = floor > -c and floor or -c
        local after = t - debt
        if after < lo then
          after = t < lo and t or lo -- never raised: a settle may have gone deeper
        end
        charged = t - after + EPS
        charged, t, dirty = charged - charged % 1, after, true
      end
      local usable = floor > 0 and t - floor or t
      if usable + EPS < n then
        ok = false
      end
      if usable < low then
        low = usable
      end
      st[j + 1], st[j + 2], st[j + 3], st[j + 4], st[j + 5], st[j + 6] = c, r, t, has, dirty, charged
    end
  end
  local g, take = 0, 0
  if op == 1 then
    if ok then
      g, take = 1, n
    end
  elseif op == 2 then
    take = low + EPS
    take = take - take % 1
    if take > n then
      take = n
    elseif take < 0 then
      take = 0
    end
    g = take
  elseif op == 5 then
    g = n -- lowered below by a bucket the depth bound clips
  end
  local refused = take == 0 and op <= 2
  local want = op == 1 and n or 1
  local retry = 0
  local at = o + 2
  out[o + 1] = g
  o = at
  for j = 0, 6 * (nb - 1), 6 do
    local c, r, t, dirty = st[j + 1], st[j + 2], st[j + 3], st[j + 5]
    if r < 0 then
      -- A counter: t is its used count.
      if take > 0 then
        t, dirty = t + take, true -- t + take <= c: the take and the lease checked it
      elseif op == 3 and n > 0 and st[j + 4] then
        t, dirty = t - n, true
        if t < 0 then
          t = 0
        end
      elseif op == 5 and n > 0 then
        t, dirty = t + n, true -- no bound but MAX_USED: a settle may take it past c
        if t > MAX_USED then
          local took = n - (t - MAX_USED)
          if took < out[at - 1] then
            out[at - 1] = took
          end
          t = MAX_USED
        end
      end
      if dirty then
        -- SET .. PXAT: the counter's one write, only when it changed; it lives until its
        -- period's key is no longer named. Decimal strings from format: Redis would send
        -- a number as %.17g, and 1e+15 is no integer to SET.
        call('SET', KEYS[k + j / 6 + 1], format('%.0f', t), 'PXAT', format('%.0f', -r))
      end
      local left = c - t
      if left < 0 then
        left = 0
      end
      out[o + 1], out[o + 2], out[o + 3] = left, t, st[j + 6]
    else
      if take > 0 then
        t, dirty = t - take, true
        if t < 0 then
          t = 0 -- t >= take - EPS: at most a rounding below 0
        end
      elseif op == 3 and n > 0 and st[j + 4] then
        t, dirty = t + n, true
        if t > c then
          t = c
        end
      elseif refused then
        local w = c - r * FLOOR_S -- the floor, as above
        w = (want - t + (w > 0 and w or 0)) * 1000 / r - EPS -- ms until this bucket holds want
        if w > retry then
          retry = w
        end
      elseif op == 5 and n > 0 then
        -- settle: no floor but the depth bound (header), nor raised if already past it
        local deep = c - r * DEEP_S
        local after = t - n
        if after < deep then
          after = t < deep and t or deep
          local took = t - after + EPS
          took = took - took % 1
          if took < out[at - 1] then
            out[at - 1] = took
          end
        end
        t, dirty = after, true
      end
      if dirty then
        -- The bucket as its full time: seconds within uint32 (until 2106), the rest in a
        -- double, so a far-off full time (a refill once a century) loses nothing.
        local d = (c - t) * 1000000 / r -- us until full
        if d > 1e300 then
          d = 1e300 -- a refill below ~1e-280 per second would overflow
        end
        local total = now_us + d
        local whole = total / 1000000
        whole = whole - whole % 1
        if whole > UINT32 - now_s then
          whole = UINT32 - now_s
        end
        local ttl = d / 1000
        ttl = ttl - ttl % 1 + 1001 -- ms: rounded up, plus the second after full
        if ttl > MAX_WAIT_MS then
          ttl = MAX_WAIT_MS
        end
        -- PSETEX: the bucket's one write, only when it changed; the TTL lets an idle bucket go.
        call('PSETEX', KEYS[k + j / 6 + 1], ttl, pack(FORMAT, now_s + whole, total - whole * 1000000, c, r))
      end
      local left = t + EPS
      left = left - left % 1
      if left < 0 then
        left = 0
      end
      local reset = (c - t) * 1000 / r - EPS -- ms until full
      if reset < 0 then
        reset = 0
      elseif reset > MAX_WAIT_MS then
        reset = MAX_WAIT_MS
      end
      out[o + 1], out[o + 2], out[o + 3] = left, reset - reset % -1, st[j + 6] -- ceil
    end
    o = o + 3
  end
  if retry > MAX_WAIT_MS then
    retry = MAX_WAIT_MS
  end
  out[at] = retry - retry % -1 -- ceil
  k = k + nb
end
return out
