-- state.lua: a bucket's storage, shared by decide.lua and inspect.lua. Go prepends it to
-- each (lua/script.go), so every script still loads alone (SCRIPT LOAD, redis-benchmark).
--
-- A bucket is ONE string key: 28 bytes, struct '<I4ddd':
--   full_s, full_us  when the bucket is full again (Redis TIME: whole seconds, then
--                    microseconds after them, a double, so no precision is lost)
--   c, r             the capacity and refill per second it was written under
-- tokens(now) = c - r * (full - now), or c once now >= full; below 0 while in debt. One
-- time, not (tokens, ts): a call that takes nothing writes nothing, and refilling is a
-- pure function of TIME. The key expires one second after it is full (PSETEX), so memory
-- follows the buckets in use; a missing key reads as full (or as the caller's cap).
--
-- The clock is Redis TIME, read once per script call, never a client's clock.
-- Capacity is at most 1e15 and refill at most 1e12 per second: whole token counts stay
-- exact in a double (2^53 > 9e15).
--
-- Written for speed: Redis runs these lines for every decision, and in its Lua a
-- function call (math.floor, a local helper) costs as much as a dozen lines of
-- arithmetic, so floors are x - x % 1, ceilings x - x % -1, and decide.lua has its read
-- and write inline.
local EPS = 1e-9
local MAX_CAPACITY = 1e15
local MAX_REFILL = 1e12
local MAX_WAIT_MS = 2 ^ 40 -- 35 years: caps replies and key lifetimes
local MAX_DEBT_S = MAX_WAIT_MS / 1000 - 2 -- a settled bucket's most seconds below full (decide.lua)
local FORMAT = '<I4ddd'
local UINT32 = 4294967295
local unpack, pack, call, pcall = struct.unpack, struct.pack, redis.call, redis.pcall

-- The one TIME call of a script: every bucket of the batch is decided at this instant.
local clock = call('TIME')
local now_s, now_us = tonumber(clock[1]), tonumber(clock[2])

-- The storage before this one, still read so a rolling upgrade hands out no fresh bucket:
-- a hash {tokens, ts (us), c, r}; GET says WRONGTYPE, HMGET reads it, the next write
-- replaces it. Each script reads it inline where GET comes back as a table.
--
-- No function is defined here: the whole chunk runs on every call, and each `local
-- function` would allocate a closure per call on the decide path for a read that almost
-- never happens.

-- (end of state.lua)
