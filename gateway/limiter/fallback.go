package limiter

import "github.com/quotaplane/quotaplane/regions"

// The fallback of a Redis limiter is a Local whose bucket for a rule holds this
// instance's 1/N of it. Two things keep it close to the shared bucket, so that a
// breaker that opens (or a call that times out) does not hand out a second allowance:
//
//   - Every answer from Redis lowers the fallback bucket to this instance's share of
//     what Redis reported left (remaining / N). A tenant Redis is throttling meets an
//     empty fallback bucket, not a full one.
//   - Every token the fallback admits is owed to the shared bucket, and the next call
//     to Redis for that rule charges it first, in the same script call, into debt if
//     need be (the debt argument of lua/token_bucket.lua and lua/lease.lua). The
//     shared bucket, which went on refilling while Redis was not asked, does not admit
//     those tokens a second time. A call that timed out after it was sent has most
//     likely run (Redis was slow, or paused and runs it on resume): its debt is not
//     kept, and what the fallback admits in its place is not owed.
//
// So a fallback episode costs latency, not accuracy: what the N fallback buckets admit
// is taken off what Redis admits afterwards. What is left is the case where the
// fallback buckets admit more than the shared bucket would have in the whole episode
// plus the following refill (one bucket of debt at most), and a debt whose fallback
// bucket refilled to full before Redis answered again (forgiven: by then the shared
// bucket would be full too).

// fallbackLimit is this instance's 1/N of lim (n = instances). A rule too small to split
// keeps one token per instance (regions.Scale).
func fallbackLimit(lim regions.Limit, n int) regions.Limit {
	if n <= 1 {
		return lim
	}
	return regions.Scale(lim.Capacity, lim.RefillPerSecond, 1/float64(n))
}

// decideFallback decides with this instance's 1/N of the rule and, with owe, records
// what it admits as owed to the shared bucket. A cost above the scaled capacity is
// clipped to it, so a request the regional rule admits can still pass.
func (l *Redis) decideFallback(r Request, cost int64, owe bool) Decision {
	n := l.instanceCount()
	lim := fallbackLimit(r.Limit, n)
	if n > 1 && r.Limit.Capacity < int64(n) {
		// Fewer tokens than instances: together they may admit up to n, not capacity.
		l.m.minCapacity.Inc()
	}
	cost = min(cost, lim.Capacity)
	now := l.fallback.now()
	var d Decision
	l.fallback.update(now, r.Tenant, r.Route, lim, func(e *entry, owed *int64) bool {
		d = e.b.Take(now, lim.Capacity, lim.RefillPerSecond, cost)
		if d.Allowed && owe {
			*owed += cost
		}
		return true
	})
	d.Source = SourceFallback
	return d
}

// observe lowers the fallback bucket of r to this instance's share of remaining, the
// whole rule's tokens left as Redis just reported them. It never raises the bucket.
func (l *Redis) observe(r Request, remaining int64) {
	n := l.instanceCount()
	lim := fallbackLimit(r.Limit, n)
	share := float64(remaining) / float64(max(n, 1))
	if share >= float64(lim.Capacity) {
		return // a missing bucket is full: nothing to lower
	}
	now := l.fallback.now()
	l.fallback.update(now, r.Tenant, r.Route, lim, func(e *entry, _ *int64) bool {
		e.b.lower(now, lim.Capacity, lim.RefillPerSecond, share)
		return true
	})
}

// owed takes what the fallback admitted for r since Redis last answered, to be charged
// to the shared bucket (holding lim) by the next call: at most lim.Capacity, the most
// debt a bucket holds. A debt whose fallback bucket has refilled to full since is void:
// the shared bucket would have refilled as well.
func (l *Redis) owed(r Request, lim regions.Limit) int64 {
	now := l.fallback.now()
	var debt int64
	l.fallback.update(now, r.Tenant, r.Route, fallbackLimit(r.Limit, l.instanceCount()), func(e *entry, owed *int64) bool {
		if *owed > 0 && e.fullAt > now.UnixNano() {
			debt = min(*owed, lim.Capacity)
		}
		*owed = 0
		return false
	})
	return debt
}

// stillOwed puts back a debt that owed took when the call that was to charge it got no
// answer. (The call may have run all the same: then the debt is charged twice, which
// errs on the side of refusing.)
func (l *Redis) stillOwed(r Request, debt int64) {
	if debt == 0 {
		return
	}
	l.fallback.update(l.fallback.now(), r.Tenant, r.Route, fallbackLimit(r.Limit, l.instanceCount()), func(_ *entry, owed *int64) bool {
		*owed += debt
		return false
	})
}
