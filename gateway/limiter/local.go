package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/regions"
)

// DefaultMaxBuckets is LocalOptions.MaxBuckets when zero.
const DefaultMaxBuckets = 1 << 20

const (
	localShards = 64 // Local.key picks a shard with the top 6 bits of a hash
	// sampleOnInsert and sampleEvery/sampleOnHit: how many buckets an insert, and every
	// sampleEvery-th hit, inspect for eviction (see Local).
	sampleOnInsert = 8
	sampleEvery    = 16
	sampleOnHit    = 4
	// sampleToMakeRoom: how many buckets a shard at its cap inspects before it evicts
	// one that is not yet full.
	sampleToMakeRoom = 32
	// shrinkBelow: a shard map rebuilt when it holds fewer than 1/shrinkBelow of its
	// peak (Go maps never give memory back on delete) and the peak is at least shrinkMin.
	shrinkBelow = 4
	shrinkMin   = 1024
)

// LocalOptions configures a Local limiter. The zero value works: the wall clock, no
// metrics, DefaultMaxBuckets.
type LocalOptions struct {
	// Region is the constant "region" label of the metrics.
	Region string
	// Now is the clock; nil means time.Now. Tests inject a fake one.
	Now func() time.Time
	// MaxBuckets caps the buckets held (0 means DefaultMaxBuckets). Idle buckets are
	// evicted exactly (see Local); only past this cap is a bucket that is not yet full
	// evicted (ratelimit_local_evictions_total{reason="capacity"}).
	MaxBuckets int
	// Registerer receives the metrics; nil means they are not registered.
	Registerer prometheus.Registerer
}

// Local is an in-memory limiter: a sharded map of Buckets keyed by (tenant, route,
// value). It is the whole limiter of a standalone gateway (SourceLocal) and holds the
// buckets of the Redis limiter's fallback (SourceFallback; see fallback).
//
// A bucket is keyed by a 64-bit hash of (tenant, route, value) with a per-process random
// seed, not by the strings: 32 bytes a slot and no pointers for the garbage collector to
// scan in a map of a million buckets. Two keys share a bucket only if their hashes
// collide: with a million buckets the chance that any two do is about 3e-8, and the seed
// keeps anyone from choosing ids that do.
//
// Memory stays bounded without a background goroutine. A bucket idle until it has
// refilled to capacity is indistinguishable from a missing bucket (a missing bucket is
// full, or held to the request's raise cap like a stored one), so evicting it changes no
// decision. Every insert inspects a few buckets of its shard (Go's randomised map
// iteration makes them a random sample) and deletes the full ones, as Redis does for
// expiring keys: with k inspected per insert, at most about 1/k of a shard is dead
// weight. A shard that shrinks to a quarter of its peak is rebuilt, because Go maps keep
// their memory after deletes. Above MaxBuckets, the closest-to-full sampled bucket is
// evicted, inexactly, and counted. The fallback's buckets start empty instead
// (startEmpty): there an idle bucket is never evicted, only past MaxBuckets.
//
// It is safe for concurrent use.
type Local struct {
	now        func() time.Time
	seed       maphash.Seed
	max        int64        // MaxBuckets: a cap on the whole limiter, not per shard
	size       atomic.Int64 // buckets held, over every shard
	startEmpty bool         // a missing bucket is empty (the fallback), not full
	shards     [localShards]shard
	m          *localMetrics
}

type shard struct {
	mu   sync.Mutex
	m    map[uint64]entry
	peak int
	hits uint32
	size *atomic.Int64 // the Local's count of buckets
	// owed is, for a fallback, what a bucket admitted while Redis could not be asked:
	// tokens the shared bucket has yet to be charged (fallback.go), with the bucket's
	// name and the limit it admitted them under. nil unless some bucket owes, and always
	// in a standalone Local, so a bucket costs no more for it.
	owed map[uint64]owing
	_    [16]byte // 48 + 16 bytes: each shard on its own 64-byte cache line
}

// owing is one bucket's debt in a fallback's Local.
type owing struct {
	tokens int64
	id     bucketID
	lim    regions.Limit // the fallback bucket's limit when it last admitted
	rule   regions.Limit // the shared bucket's (the regional limit), to charge it under
}

type entry struct {
	b      Bucket
	fullAt int64 // Unix ns from which b is full, so evicting it is exact
}

// NewLocal returns a Local limiter. It starts no goroutines.
func NewLocal(opts LocalOptions) (*Local, error) {
	l := newLocal(opts, false)
	if err := register(opts.Registerer, opts.Region, l.m.collectors(l.Len)...); err != nil {
		return nil, fmt.Errorf("new local limiter: %w", err)
	}
	return l, nil
}

func newLocal(opts LocalOptions, startEmpty bool) *Local {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxBuckets <= 0 {
		opts.MaxBuckets = DefaultMaxBuckets
	}
	l := &Local{now: opts.Now, seed: maphash.MakeSeed(), max: int64(opts.MaxBuckets), startEmpty: startEmpty, m: newLocalMetrics()}
	for i := range l.shards {
		l.shards[i].m = make(map[uint64]entry)
		l.shards[i].size = &l.size
	}
	return l
}

// Decide takes r.Cost tokens (0 means 1) from the local bucket of (r.Tenant, r.Route)
// holding r.Limit, from r.Value's bucket nested in it and from a bucket per band of
// r.Bands: from all or from none. Decisions have SourceLocal. The error is non-nil only
// for an invalid request (ErrInvalidRequest) or a context that has already ended.
func (l *Local) Decide(ctx context.Context, r Request) (Decision, error) {
	cost, err := r.cost()
	if err != nil {
		return Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("decide %s/%s: %w", r.Tenant, r.Route, err)
	}
	var d Decision
	if len(r.Bands) > 0 {
		d = l.takeBands(l.now(), r, 1, cost, false)
	} else {
		d = l.take(l.now(), r, r.Limit, r.ValueLimit, cost, false)
	}
	d.Source = SourceLocal
	return d, nil
}

// Len is the number of buckets held.
func (l *Local) Len() int { return int(l.size.Load()) }

// Sweep deletes every bucket that is full by now and returns how many. Buckets are
// evicted as new ones arrive anyway; Sweep is for a caller that wants memory back after
// a burst of keys with no traffic since (for example on a timer). A Local whose buckets
// start empty keeps them all.
func (l *Local) Sweep() int {
	if l.startEmpty {
		return 0
	}
	now := l.now().UnixNano()
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			if e.fullAt <= now {
				s.remove(k)
				n++
			}
		}
		s.maybeShrink()
		s.mu.Unlock()
	}
	l.m.evicted(evictIdle, n)
	return n
}

// bucketID names one in-memory bucket, and the shared bucket its debts are charged to: a
// tenant's route, with a client value of it (Request.Value) or a further band of its
// rule (Request.Bands, by name), or neither (""). Never both.
type bucketID struct {
	tenant, route, value, band string
	// period is a quota band's period start (Unix s) and until its counter's expiry
	// (Unix ms): one bucket per period. Both 0 for a token bucket.
	period, until int64
}

// key hashes id and picks its shard. Each id is hashed on its own, with the seed (no
// copy through a Hash's buffer), and the hashes are mixed by odd multipliers, so
// ("ab", "c") and ("a", "bc"), or ("a", "b") and ("b", "a"), differ. A value, of any
// length, is hashed the same way: the map holds 64-bit keys only.
func (l *Local) key(id bucketID) (uint64, *shard) {
	k := maphash.String(l.seed, id.tenant)*0x9e3779b97f4a7c15 ^ maphash.String(l.seed, id.route)
	if id.value != "" {
		k = k*0xbf58476d1ce4e5b9 ^ maphash.String(l.seed, id.value)
	}
	if id.band != "" { // another multiplier: a band never shares a value's bucket
		k = k*0x94d049bb133111eb ^ maphash.String(l.seed, id.band)
	}
	if id.period != 0 { // a quota's bucket of one period
		k = (k ^ uint64(id.period)) * 0xd6e8feb86659fd93
	}
	return k, &l.shards[k>>58] // the top 6 bits pick one of 64 shards
}

// take is the decision of every local request without bands (takeBands decides those),
// at now, with validated limits and cost: the route bucket of r holding lim and, when r
// has a value, the value's bucket holding vlim, admitted together or not at all. The
// two are locked in shard order, so two requests on them never deadlock and never both
// pass a check that only one can. With owe, what is admitted is recorded as owed by
// each bucket (a fallback's).
func (l *Local) take(now time.Time, r Request, lim, vlim regions.Limit, cost int64, owe bool) Decision {
	// (lim and vlim are the buckets' own; r.Limit and r.ValueLimit the shared buckets'.)
	rid := bucketID{tenant: r.Tenant, route: r.Route}
	rk, rs := l.key(rid)
	if r.Value == "" {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		e, ok := rs.m[rk]
		l.open(&e, ok, now, lim, r.capFor(lim, 0))
		d := e.b.Take(now, lim.Capacity, lim.RefillPerSecond, cost)
		l.store(rs, rk, e, ok, now, lim)
		if owe && d.Allowed {
			rs.owe(rk, owing{tokens: cost, id: rid, lim: lim, rule: r.Limit})
		}
		return d
	}
	vid := bucketID{tenant: r.Tenant, route: r.Route, value: r.Value}
	vk, vs := l.key(vid)
	first, second := rs, vs
	if vk>>58 < rk>>58 {
		first, second = vs, rs
	}
	first.mu.Lock()
	defer first.mu.Unlock()
	if second != first {
		second.mu.Lock()
		defer second.mu.Unlock()
	}
	re, rok := rs.m[rk]
	ve, vok := vs.m[vk]
	l.open(&re, rok, now, lim, r.capFor(lim, 0))
	l.open(&ve, vok, now, vlim, r.capFor(vlim, 0))
	both := re.b.has(now, lim, cost) && ve.b.has(now, vlim, cost)
	d := tighter(re.b.decide(now, lim, cost, both), ve.b.decide(now, vlim, cost, both))
	l.store(rs, rk, re, rok, now, lim)
	l.store(vs, vk, ve, vok, now, vlim)
	if owe && both {
		rs.owe(rk, owing{tokens: cost, id: rid, lim: lim, rule: r.Limit})
		vs.owe(vk, owing{tokens: cost, id: vid, lim: vlim, rule: r.ValueLimit})
	}
	return d
}

// owe adds o.tokens to what bucket k owes, with o's limits (the latest); the shard's
// lock is held.
func (s *shard) owe(k uint64, o owing) {
	if s.owed == nil {
		s.owed = make(map[uint64]owing)
	}
	o.tokens += s.owed[k].tokens
	s.owed[k] = o
}

// owedBy takes what bucket id owes, at most n, never more than its bucket is short of
// full at now under the limit it admitted under: the fallback refills at this instance's
// share of the rule while it admits, and what its refill has covered since is no more
// than the shared bucket would have admitted for this instance meanwhile, so a debt
// decays as the bucket refills and is void once it is full. (The N instances together
// never charge less than their admissions beyond the rule, and a bucket of debt per
// instance after a long outage would refuse a tenant that kept to its limit.) The debt
// is capped by the limit it was admitted under, whatever N is now.
func (l *Local) owedBy(id bucketID, now time.Time, n int64) (int64, owing) {
	k, s := l.key(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.owed[k]
	if !ok {
		return 0, owing{}
	}
	e := s.m[k]
	c := float64(o.lim.Capacity)
	e.b.refill(now, c, o.lim.RefillPerSecond)
	short := int64(math.Ceil(c - e.b.tokens - eps))
	d := min(o.tokens, max(short, 0))
	took := min(d, n)
	if rest := d - took; rest > 0 {
		o.tokens = rest
		s.owed[k] = o
	} else {
		delete(s.owed, k)
	}
	return took, o
}

// reowe gives back a debt owedBy took (its call got no reply), o with its tokens.
func (l *Local) reowe(id bucketID, o owing) {
	k, s := l.key(id)
	s.mu.Lock()
	s.owe(k, o)
	s.mu.Unlock()
}

// owedTotal is what drainOwed would return at now, summed, without removing anything.
func (l *Local) owedTotal(now time.Time) int64 {
	var n int64
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		for k, o := range s.owed {
			e := s.m[k]
			c := float64(o.lim.Capacity)
			b := e.b // a copy: looking refills nothing
			b.refill(now, c, o.lim.RefillPerSecond)
			n += min(o.tokens, max(int64(math.Ceil(c-b.tokens-eps)), 0))
		}
		s.mu.Unlock()
	}
	return n
}

// drainOwed removes every debt, each capped as owedBy caps it at now, and returns them.
func (l *Local) drainOwed(now time.Time) []owedBucket {
	var out []owedBucket
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		for k, o := range s.owed {
			e := s.m[k]
			c := float64(o.lim.Capacity)
			e.b.refill(now, c, o.lim.RefillPerSecond)
			if d := min(o.tokens, max(int64(math.Ceil(c-e.b.tokens-eps)), 0)); d > 0 {
				out = append(out, owedBucket{id: o.id, debt: debt{tokens: d, lim: o.rule}})
			}
		}
		s.owed = nil
		s.mu.Unlock()
	}
	return out
}

// open prepares the entry a request found (ok) or the missing one it gets: a missing
// bucket of a fallback starts empty; a missing one of a standalone Local starts full, or
// at capTokens after a raise (lua.NoCap for none). A bucket it holds keeps its tokens: a
// rule change on it takes effect as Bucket.Take applies it.
func (l *Local) open(e *entry, ok bool, now time.Time, lim regions.Limit, capTokens float64) {
	switch {
	case ok:
	case l.startEmpty:
		e.b.empty(now)
	case capTokens >= 0:
		e.b.lower(now, lim.Capacity, lim.RefillPerSecond, capTokens)
	}
}

// tighter is the decision of the two buckets' that tells the client most: the one with
// fewer tokens left (the one that refused), with its limit and reset, admitted only if
// both were.
func tighter(a, b Decision) Decision {
	allowed, retry := a.Allowed && b.Allowed, max(a.RetryAfter, b.RetryAfter)
	if b.Remaining < a.Remaining || (b.Remaining == a.Remaining && b.ResetAfter > a.ResetAfter) {
		a = b
	}
	a.Allowed, a.RetryAfter = allowed, retry
	if allowed {
		a.RetryAfter = 0
	}
	return a
}

// store puts e back (was: whether it was there), keeping the shard bounded as described
// on Local. The shard's lock is held.
func (l *Local) store(s *shard, k uint64, e entry, was bool, now time.Time, lim regions.Limit) {
	t := now.UnixNano()
	idle, forced := 0, 0
	if !was {
		if !l.startEmpty {
			idle += s.sample(t, sampleOnInsert)
		}
		// The cap is the whole limiter's: a per-shard cap of MaxBuckets/64 would let a
		// client landing in a blocked client's shard evict its bucket (and so give it a
		// full one back) long before the limiter is full. The slot is taken before the
		// check, so concurrent inserts cannot all pass it.
		if l.size.Add(1) > l.max {
			i, f := s.makeRoom(t, !l.startEmpty)
			idle, forced = idle+i, forced+f
		}
	} else if s.hits++; s.hits%sampleEvery == 0 && !l.startEmpty {
		idle += s.sample(t, sampleOnHit)
	}
	e.fullAt = e.b.fullAt(lim.Capacity, lim.RefillPerSecond)
	s.m[k] = e
	if len(s.m) > s.peak {
		s.peak = len(s.m)
	} else if idle > 0 {
		s.maybeShrink()
	}
	if idle > 0 || forced > 0 {
		l.m.evicted(evictIdle, idle)
		l.m.evicted(evictCapacity, forced)
	}
}

// sample inspects up to n buckets of the shard, a random sample, and deletes the full
// ones. It returns how many it deleted.
func (s *shard) sample(now int64, n int) int {
	seen, deleted := 0, 0
	for k, e := range s.m {
		if e.fullAt <= now {
			s.remove(k)
			deleted++
		}
		if seen++; seen >= n {
			break
		}
	}
	return deleted
}

// makeRoom is called when the limiter is at its cap: it samples for full buckets (when
// full ones may go: idleOK), and if there are none, evicts the sampled bucket closest to
// full. It returns the idle and the forced evictions.
func (s *shard) makeRoom(now int64, idleOK bool) (idle, forced int) {
	seen := 0
	var victim uint64
	victimAt, found := int64(0), false
	for k, e := range s.m {
		if _, owes := s.owed[k]; owes {
			continue // its debt needs its bucket
		}
		if idleOK && e.fullAt <= now {
			s.remove(k)
			idle++
		} else if !found || e.fullAt < victimAt {
			victim, victimAt, found = k, e.fullAt, true
		}
		if seen++; seen >= sampleToMakeRoom {
			break
		}
	}
	if idle == 0 && found {
		s.remove(victim)
		forced = 1
	}
	return idle, forced
}

// remove evicts the bucket k. A fallback never evicts a bucket that owes: makeRoom picks
// among the others.
func (s *shard) remove(k uint64) {
	delete(s.m, k)
	s.size.Add(-1)
}

// maybeShrink rebuilds the map once it holds a small part of its peak, so the memory of
// a burst of keys is given back.
func (s *shard) maybeShrink() {
	if s.peak < shrinkMin || len(s.m) >= s.peak/shrinkBelow {
		return
	}
	m := make(map[uint64]entry, len(s.m))
	for k, e := range s.m {
		m[k] = e
	}
	s.m, s.peak = m, len(m)
}

// Close does nothing: a Local holds no goroutine or connection. It lets a caller hold
// either limiter behind one interface with Decide and Close.
func (l *Local) Close() {}
