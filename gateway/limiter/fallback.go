package limiter

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// fallback decides while Redis cannot, and owns everything that costs: this instance's
// in-memory buckets, each holding 1/N of a rule, and the debts of what they admitted.
//
// The rule it keeps: a fallback bucket never holds more than the shared bucket is known
// to hold now, and nothing is known of it: any answer from Redis may be stale by the
// time Redis fails (other gateways take from the same bucket meanwhile), and a new
// process, or one that has not asked for a key yet, knows nothing at all. So:
//
//   - It decides only during an episode: from the moment this gateway's breaker opens
//     until it closes. A call that fails while the breaker is closed (one slow call, a
//     CPU stall) is refused, not decided from a bucket: that costs a 429, never a
//     second allowance while the other gateways still reach Redis.
//   - Every bucket starts EMPTY when it is first used in an episode, and earns this
//     instance's share of the refill, R/N per second, up to floor(C/N) (at least 1). The
//     N instances together earn the rule's refill, no more. The buckets go when the
//     episode ends: the next one starts empty again.
//   - An instance earns nothing until the other gateways of the region count it in
//     their N (Options.Counted): a gateway that has just started would otherwise earn a
//     share no one else has given up.
//   - What it admits is owed to the shared bucket, and the next call to Redis for that
//     bucket charges it first, in the same script call, into debt if need be (down to
//     -capacity). A debt decays as the fallback bucket refills (Local.owedBy: what its
//     refill covered, the shared bucket would have admitted for this instance anyway),
//     capped by the limit it was admitted under, whatever N has become. It is cleared
//     only once a reply saying what the script charged was read: a call that failed,
//     timed out or got no answer keeps it. So an outage's refill is spent once, by the
//     fallbacks, not again by Redis afterwards.
//   - When an episode ends, its debts become fixed amounts (as owedBy caps them then),
//     kept until charged; Redis.Flush charges them at shutdown, and what it cannot
//     (Redis still down) is counted as lost (ratelimit_fallback_debt_lost_tokens_total).
//
// So a Redis outage costs a region its bursts and a few hundred milliseconds of refusals
// while the breaker opens, never more than the rule: during a full outage the region
// admits at most its refill; during a partial one (some gateways cut off, the others
// still answered by Redis) the cut gateways add their refill share while it lasts, and
// what they admit is charged when Redis answers them again.
type fallback struct {
	episode    atomic.Pointer[Local] // the buckets of the episode in progress; nil while the breaker is closed
	mu         sync.Mutex
	ended      []*Local     // episodes ended whose debts are not yet fixed (guarded by mu)
	endedN     atomic.Int32 // len(ended), read without mu on the hot path
	debts      *debtTable   // fixed debts of ended episodes
	unsettled  *debtTable   // settles Redis did not answer (settle.go): charged with no floor
	instances  func() int
	expected   int
	counted    func() bool
	openFor    time.Duration // the breaker's open interval: the RetryAfter of a refusal
	maxBuckets int
	now        func() time.Time
	m          *redisMetrics
}

func newFallback(o Options, m *redisMetrics) *fallback {
	max := o.MaxFallbackBuckets
	if max <= 0 {
		max = DefaultMaxBuckets
	}
	return &fallback{
		debts:      newDebtTable(max),
		unsettled:  newDebtTable(max),
		instances:  o.Instances,
		expected:   o.ExpectedInstances,
		counted:    o.Counted,
		openFor:    o.Breaker.OpenFor,
		maxBuckets: max,
		now:        o.Now,
		m:          m,
	}
}

// begin starts an episode: the breaker left the closed state. Every bucket starts anew.
// It is called under the breaker's lock, so it only swaps a pointer.
func (f *fallback) begin() {
	if f.episode.Load() == nil {
		f.episode.Store(newLocal(LocalOptions{Now: f.now, MaxBuckets: f.maxBuckets}, true))
	}
}

// end ends the episode: the breaker closed. Its buckets go once their debts are fixed
// (fix, on the next call). It is called under the breaker's lock.
func (f *fallback) end() {
	ep := f.episode.Swap(nil)
	if ep == nil {
		return
	}
	f.mu.Lock()
	f.ended = append(f.ended, ep)
	f.endedN.Store(int32(len(f.ended)))
	f.mu.Unlock()
}

// fix turns the debts of ended episodes into fixed amounts in the debt table, so their
// buckets can go.
func (f *fallback) fix() {
	if f.endedN.Load() == 0 {
		return
	}
	f.mu.Lock()
	ended := f.ended
	f.ended = nil
	f.endedN.Store(0)
	f.mu.Unlock()
	now := f.now()
	for _, ep := range ended {
		for _, o := range ep.drainOwed(now) {
			f.debts.add(o.id, o.lim, o.tokens)
		}
	}
}

// mayOwe reports, from atomics only, whether the fallback may owe anything: an episode
// in progress, ended ones not fixed, or debts in the table.
func (f *fallback) mayOwe() bool {
	return f.episode.Load() != nil || f.endedN.Load() > 0 || f.debts.size.Load() > 0
}

// owing is every token the fallback admitted that Redis has not been charged: the debts
// of the episode in progress, of the ended ones not fixed yet, and the fixed ones.
func (f *fallback) owing() int64 {
	now := f.now()
	n := f.debts.total()
	if ep := f.episode.Load(); ep != nil {
		n += ep.owedTotal(now)
	}
	f.mu.Lock()
	for _, ep := range f.ended {
		n += ep.owedTotal(now)
	}
	f.mu.Unlock()
	return n
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
// per instance (a bucket of 0 would reject everything), the one case where the region's
// fallbacks may hold more than its capacity (n tokens), counted by
// ratelimit_fallback_min_capacity_total.
func fallbackLimit(lim regions.Limit, n int) regions.Limit {
	if n <= 1 {
		return lim
	}
	return regions.Limit{Capacity: max(1, lim.Capacity/int64(n)), RefillPerSecond: lim.RefillPerSecond / float64(n)}
}

// decide decides r, whose call to Redis failed or was not made (the breaker), with this
// instance's 1/N of the rule (and of the value's, and of each band's), and records what
// it admits as owed. Outside an episode, before the instance is counted, or for a cost
// above a fallback bucket (never clipped into a cheaper pass), it refuses.
func (f *fallback) decide(r Request, cost int64) Decision {
	n := f.n()
	lim := fallbackLimit(r.Limit, n)
	refuse := Decision{Limit: lim.Capacity, RefillPerSecond: lim.RefillPerSecond, RetryAfter: f.openFor, Source: SourceFallback}
	// Refused with no fallback bucket deciding: the limit is the region's, not a 1/N
	// the client was never held to (a 429 of a slow call halved the advertised limit).
	unbucketed := Decision{Limit: r.Limit.Capacity, RefillPerSecond: r.Limit.RefillPerSecond, RetryAfter: f.openFor, Source: SourceFallback}
	ep := f.episode.Load()
	switch {
	case ep == nil:
		f.m.refused[refuseClosed].Inc()
		return r.refusedBands(unbucketed, 1)
	case f.counted != nil && !f.counted():
		f.m.refused[refuseUncounted].Inc()
		return r.refusedBands(unbucketed, 1)
	}
	if n > 1 && r.Limit.Capacity < int64(n) {
		f.m.minCapacity.Inc() // fewer tokens than instances: together they may hold n
	}
	vlim := fallbackLimit(r.ValueLimit, n)
	above := cost > lim.Capacity || (r.Value != "" && cost > vlim.Capacity)
	for _, b := range r.Bands {
		above = above || b.Quota == nil && cost > fallbackLimit(b.Limit, n).Capacity // a quota short refuses in takeBands
	}
	if above {
		f.m.costAboveFallback.Inc()
		return r.refusedBands(refuse, n)
	}
	plain := r
	plain.RaisedAgo, plain.BandRaises = 0, nil // its buckets start empty: a raise can hold them to no less
	var d Decision
	if len(r.Bands) > 0 {
		d = ep.takeBands(f.now(), plain, n, cost, true)
	} else {
		d = ep.take(f.now(), plain, lim, vlim, cost, true)
	}
	if d.Allowed {
		// Owed to every bucket it took from (the rule's, each band's, a value's), as each
		// is charged, written off or lost on its own.
		f.m.owed.Add(float64(cost) * float64(r.owingBuckets()))
	}
	d.Source = SourceFallback
	return d
}

// owingBuckets is how many buckets a fallback admission of r owes its cost to: the
// route's, each band's and the value's.
func (r Request) owingBuckets() int {
	n := 1 + len(r.Bands)
	if r.Value != "" {
		n++
	}
	return n
}

// taken is a debt owed took: from the fixed debts of ended episodes, and from a bucket of
// the episode in progress (the probes of a half-open breaker), with that bucket's debt.
type taken struct {
	fixed, live int64
	ep          *Local
	o           owing
}

func (t taken) total() int64 { return t.fixed + t.live }

// owed takes what the fallback admitted for the bucket id and is still owed, at most n
// (a call charges at most twice its bucket's capacity: the script floors at -capacity),
// to be sent with a call; the caller settles it.
func (f *fallback) owed(id bucketID, n int64) taken {
	f.fix()
	t := taken{fixed: f.debts.take(id, n)}
	if ep := f.episode.Load(); ep != nil && t.fixed < n {
		t.ep = ep
		t.live, t.o = ep.owedBy(id, f.now(), n-t.fixed)
	}
	return t
}

// settle ends a debt that owed took: with a reply read (answered), the script charged
// charged of it, counted as repaid; the rest was clipped by the bucket's -capacity floor,
// and with it whatever the bucket still owes is written off (a bucket a whole capacity
// in debt admits nothing for a fill time already). Without a reply the call did not
// count and the whole debt is owed again, where it was: a debt of the episode in
// progress goes on decaying with its bucket.
func (f *fallback) settle(id bucketID, lim regions.Limit, t taken, answered bool, charged int64) {
	debt := t.total()
	if debt == 0 {
		return
	}
	if !answered {
		f.debts.add(id, lim, t.fixed)
		if t.live > 0 {
			t.o.tokens = t.live
			t.ep.reowe(id, t.o)
		}
		return
	}
	f.m.repaid.Add(float64(charged))
	if debt > charged {
		rest := f.debts.take(id, 1<<62)
		f.m.writtenOff.Add(float64(debt - charged + rest))
	}
}

// drain fixes every debt, the episode in progress's too, and removes them all (a
// flush).
func (f *fallback) drain() []owedBucket {
	if ep := f.episode.Load(); ep != nil {
		for _, o := range ep.drainOwed(f.now()) {
			f.debts.add(o.id, o.lim, o.tokens)
		}
	}
	f.fix()
	return f.debts.drain()
}
