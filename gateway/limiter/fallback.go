package limiter

import (
	"math"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// fallback decides when Redis cannot, and owns everything that costs: this instance's
// in-memory buckets, each holding 1/N of a rule, and the debts of what they admitted.
// Two things keep it close to the shared bucket, so that a breaker that opens (or a call
// that times out) does not hand out a second allowance:
//
//   - Every answer from Redis lowers the fallback bucket to this instance's share of
//     what Redis reported left (remaining / N; observe). A tenant Redis is throttling
//     meets an empty fallback bucket, not a full one.
//   - Every token the fallback admits is owed to the shared bucket, and the next call
//     to Redis for that rule charges it first, in the same script call, into debt if
//     need be (the debt argument of the scripts). The shared bucket, which went on
//     refilling while Redis was not asked, does not admit those tokens a second time.
//
// A debt is cleared only once a reply saying what the script charged was read (settle):
// a call that failed, timed out or got no answer keeps its debt, even if Redis may run
// it later (a paused Redis runs it on resume; a HELLO that timed out never sent it).
// That can charge twice (under-admission), never hand out a second bucket. Every Redis
// call that may carry a debt goes through Redis.callCharging, the one path that takes a
// debt (owed), sends it and settles it: the plain, sharded and lease paths alike.
//
// So a fallback episode costs latency, not accuracy: what the N fallback buckets admit
// beyond their refill is taken off what Redis admits afterwards (see owed for the
// bound), down to one bucket of debt at the most.
type fallback struct {
	local     *Local
	instances func() int
	expected  int
	openFor   time.Duration                 // the breaker's open interval: the RetryAfter of a cost no fallback bucket holds
	changedAt func(tenant string) time.Time // Options.ChangedAt; nil: no raise is known
	m         *redisMetrics
}

func newFallback(o Options, m *redisMetrics) *fallback {
	return &fallback{
		local:     newLocal(LocalOptions{Now: o.Now, MaxBuckets: o.MaxFallbackBuckets}),
		instances: o.Instances,
		expected:  o.ExpectedInstances,
		openFor:   o.Breaker.OpenFor,
		changedAt: o.ChangedAt,
		m:         m,
	}
}

// n is N: the live instances of the region, else ExpectedInstances.
func (f *fallback) n() int {
	if n := f.instances(); n > 0 {
		return n
	}
	return f.expected
}

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

// decide decides r with this instance's 1/N of the rule and records what it admits as
// owed to the shared bucket. A cost above the fallback bucket's capacity is rejected,
// never clipped (that would admit the request for fewer tokens than it costs); it may
// pass again once Redis answers.
func (f *fallback) decide(r Request, cost int64) Decision {
	n := f.n()
	lim := fallbackLimit(r.Limit, n)
	if n > 1 && r.Limit.Capacity < int64(n) {
		// Fewer tokens than instances: together they may admit up to n, not capacity.
		f.m.minCapacity.Inc()
	}
	if cost > lim.Capacity {
		f.m.costAboveFallback.Inc()
		return Decision{Limit: lim.Capacity, RefillPerSecond: lim.RefillPerSecond, RetryAfter: f.openFor, Source: SourceFallback}
	}
	now := f.local.now()
	var d Decision
	f.local.update(now, idOf(r), lim, func(e entry, owed int64) (entry, int64, bool) {
		if e.b.last == 0 && f.changedAt != nil {
			// A bucket this instance holds nothing for reads as full, at the limit in
			// force now. After a raise that is more than the shared bucket holds (its
			// rule record grows it at the new refill from the change), so it starts from
			// what refilled since the change, which is never more.
			if since := f.changedAt(r.Tenant); !since.IsZero() {
				e.b.lower(now, lim.Capacity, lim.RefillPerSecond, lim.RefillPerSecond*max(0, now.Sub(since).Seconds()))
			}
		}
		d = e.b.Take(now, lim.Capacity, lim.RefillPerSecond, cost)
		if d.Allowed {
			owed += cost
		}
		return e, owed, true
	})
	if d.Allowed {
		f.m.owed.Add(float64(cost))
	}
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
func (f *fallback) observe(r Request, remaining int64) {
	n := f.n()
	lim := fallbackLimit(r.Limit, n)
	share := float64(remaining) / float64(max(n, 1))
	if share >= float64(lim.Capacity) {
		return // a missing bucket is full: nothing to lower
	}
	now := f.local.now()
	f.local.update(now, idOf(r), lim, func(e entry, owed int64) (entry, int64, bool) {
		e.b.lower(now, lim.Capacity, lim.RefillPerSecond, share)
		return e, owed, true
	})
}

// owed takes what the fallback admitted for r since Redis last answered, to be charged
// to the shared bucket (holding lim: the rule's, or one shard's) by the next call; the
// caller must settle it.
//
// The debt is at most what the fallback bucket is short of full: the fallback refills
// at this instance's share of the rule while it admits, and admissions that its refill
// has covered since are no more than the shared bucket would have admitted for this
// instance meanwhile. So a debt decays as the bucket refills, and is void once it is
// full; N instances together never charge more than their admissions beyond the rule.
// Past lim.Capacity (the most debt a bucket holds) the rest stays owed, for the next
// call (another shard of a sharded rule).
func (f *fallback) owed(r Request, lim regions.Limit) int64 {
	if f.local.owing.Load() == 0 {
		return 0 // the usual case: no bucket owes anything
	}
	now := f.local.now()
	flim := fallbackLimit(r.Limit, f.n())
	var debt int64
	f.local.update(now, idOf(r), flim, func(e entry, owed int64) (entry, int64, bool) {
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

// settle ends a debt that owed took: with a reply read (answered), the script charged
// charged of it, counted as repaid, and the rest (clipped by the bucket's -capacity
// floor) as written off; without one, the call did not count and the whole debt stays
// owed.
func (f *fallback) settle(r Request, debt int64, answered bool, charged int64) {
	if debt == 0 {
		return // a counter's Add is an atomic write: not for every decision
	}
	if !answered {
		f.local.update(f.local.now(), idOf(r), fallbackLimit(r.Limit, f.n()), func(e entry, owed int64) (entry, int64, bool) {
			return e, owed + debt, false
		})
		return
	}
	f.m.repaid.Add(float64(charged))
	if debt > charged {
		f.m.writtenOff.Add(float64(debt - charged))
	}
}
