package limiter

import (
	"math"

	"github.com/quotaplane/quotaplane/regions"
)

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
//     those tokens a second time. A debt is cleared only once a reply saying what the
//     script charged was read: a call that failed, timed out or got no answer keeps
//     its debt (and what the fallback admits in its place is owed too), even if Redis
//     may run it later. That can charge twice (under-admission), never hand out a
//     second bucket.
//
// So a fallback episode costs latency, not accuracy: what the N fallback buckets admit
// beyond their refill is taken off what Redis admits afterwards (see owed for the
// bound), down to one bucket of debt at the most.

// fallbackLimit is this instance's 1/N of lim (n = instances), rounded DOWN:
// floor(capacity/n) tokens, refill/n, so the n fallback buckets together never hold more
// than the regional capacity. A rule with fewer tokens than instances keeps one token
// per instance (a bucket of 0 would reject everything), the one case where the region
// may admit more than its capacity (n tokens), counted by
// ratelimit_fallback_min_capacity_total.
func fallbackLimit(lim regions.Limit, n int) regions.Limit {
	if n <= 1 {
		return lim
	}
	return regions.Limit{Capacity: max(1, lim.Capacity/int64(n)), RefillPerSecond: lim.RefillPerSecond / float64(n)}
}

// decideFallback decides with this instance's 1/N of the rule and, with owe, records
// what it admits as owed to the shared bucket. A cost above the fallback bucket's
// capacity is rejected, never clipped (that would admit the request for fewer tokens
// than it costs); it may pass again once Redis answers.
func (l *Redis) decideFallback(r Request, cost int64, owe bool) Decision {
	n := l.instanceCount()
	lim := fallbackLimit(r.Limit, n)
	if n > 1 && r.Limit.Capacity < int64(n) {
		// Fewer tokens than instances: together they may admit up to n, not capacity.
		l.m.minCapacity.Inc()
	}
	if cost > lim.Capacity {
		l.m.costAboveFallback.Inc()
		return Decision{Limit: lim.Capacity, RetryAfter: l.openFor, Source: SourceFallback}
	}
	now := l.fallback.now()
	var d Decision
	l.fallback.update(now, idOf(r), lim, func(e entry, owed int64) (entry, int64, bool) {
		d = e.b.Take(now, lim.Capacity, lim.RefillPerSecond, cost)
		if d.Allowed && owe {
			owed += cost
		}
		return e, owed, true
	})
	d.Source = SourceFallback
	return d
}

// observe lowers the fallback bucket of r to this instance's share of remaining, the
// whole rule's tokens left as Redis just reported them. It never raises the bucket. A
// missing (full) bucket is added whenever the share is below full: a fallback that
// started full while Redis held less would admit, in an outage, tokens Redis had
// already given out, and a debt charged afterwards cannot take back what was admitted
// within the window. (Local evicts buckets once they are full again, so a healthy
// gateway holds buckets only for keys used within their time-to-fill.)
func (l *Redis) observe(r Request, remaining int64) {
	n := l.instanceCount()
	lim := fallbackLimit(r.Limit, n)
	share := float64(remaining) / float64(max(n, 1))
	if share >= float64(lim.Capacity) {
		return // a missing bucket is full: nothing to lower
	}
	now := l.fallback.now()
	l.fallback.update(now, idOf(r), lim, func(e entry, owed int64) (entry, int64, bool) {
		e.b.lower(now, lim.Capacity, lim.RefillPerSecond, share)
		return e, owed, true
	})
}

// owed takes what the fallback admitted for r since Redis last answered, to be charged
// to the shared bucket (holding lim: the rule's, or one shard's) by the next call.
//
// The debt is at most what the fallback bucket is short of full: the fallback refills
// at this instance's share of the rule while it admits, and admissions that its refill
// has covered since are no more than the shared bucket would have admitted for this
// instance meanwhile. So a debt decays as the bucket refills, and is void once it is
// full; N instances together never charge more than their admissions beyond the rule.
// Past lim.Capacity (the most debt a bucket holds) the rest stays owed, for the next
// call (another shard of a sharded rule).
func (l *Redis) owed(r Request, lim regions.Limit) int64 {
	if l.fallback.owing.Load() == 0 {
		return 0 // the usual case: no bucket owes anything
	}
	now := l.fallback.now()
	flim := fallbackLimit(r.Limit, l.instanceCount())
	var debt int64
	l.fallback.update(now, idOf(r), flim, func(e entry, owed int64) (entry, int64, bool) {
		if owed <= 0 {
			return e, 0, false
		}
		c := float64(flim.Capacity)
		e.b.refill(now, c, flim.RefillPerSecond)
		short := int64(math.Ceil(c - e.b.tokens - eps))
		owed = max(0, min(owed, short))
		debt = min(owed, lim.Capacity)
		return e, owed - debt, false
	})
	return debt
}

// stillOwed puts back a debt that owed took when the call that was to charge it did not
// reach Redis (refused, dropped before it was written, or never sent; see mayHaveRun).
func (l *Redis) stillOwed(r Request, debt int64) {
	if debt == 0 {
		return
	}
	l.fallback.update(l.fallback.now(), idOf(r), fallbackLimit(r.Limit, l.instanceCount()), func(e entry, owed int64) (entry, int64, bool) {
		return e, owed + debt, false
	})
}
