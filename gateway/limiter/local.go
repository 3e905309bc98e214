package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
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
	// evicted, which forgets its debt, and that is counted
	// (ratelimit_local_evictions_total{reason="capacity"}).
	MaxBuckets int
	// Registerer receives the metrics; nil means they are not registered.
	Registerer prometheus.Registerer
}

// Local is an in-memory limiter: a sharded map of Buckets keyed by (tenant, route). It is
// the whole limiter of a standalone gateway (SourceLocal) and the store of Redis's
// fallback (SourceFallback).
//
// A bucket is keyed by a 64-bit hash of (tenant, route) with a per-process random seed,
// not by the strings: 32 bytes a slot and no pointers for the garbage collector to scan
// in a map of a million buckets. Two pairs share a bucket only if their hashes collide:
// with a million buckets the chance that any two do is about 3e-8, and the seed keeps
// anyone from choosing ids that do.
//
// Memory stays bounded without a background goroutine. A bucket idle until it has
// refilled to capacity is indistinguishable from a missing bucket (a missing bucket is
// full), so evicting it changes no decision (while the rule stays the same; a rule that
// grows meanwhile starts full at its new capacity, as a new rule does). Every insert inspects a few buckets of its
// shard (Go's randomised map iteration makes them a random sample) and deletes the full
// ones, as Redis does for expiring keys: with k inspected per insert, at most about 1/k
// of a shard is dead weight, so a shard holds about the buckets used within their
// time-to-fill, times k/(k-1). A shard that shrinks to a quarter of its peak is rebuilt,
// because Go maps keep their memory after deletes. Above MaxBuckets, the closest-to-full
// sampled bucket is evicted, inexactly, and counted.
//
// It is safe for concurrent use.
type Local struct {
	now    func() time.Time
	seed   maphash.Seed
	max    int64        // MaxBuckets: a cap on the whole limiter, not per shard
	size   atomic.Int64 // buckets held, over every shard
	shards [localShards]shard
	m      *localMetrics
	owing  atomic.Int64 // buckets with a debt (shard.owed), so a fallback with none skips the lookup
}

type shard struct {
	mu   sync.Mutex
	m    map[uint64]entry
	peak int
	hits uint32
	// owed is, for a fallback, what a bucket admitted while Redis could not be asked:
	// tokens the shared bucket has yet to be charged (fallback.go). Once the bucket is
	// full again its debt is void (the shared bucket would have refilled as well), so it
	// goes with the bucket. nil unless some bucket owes, and always in a Local limiter
	// of its own, so a bucket costs no more for it.
	owed  map[uint64]int64
	owing *atomic.Int64 // the Local's count of buckets with a debt
	size  *atomic.Int64 // the Local's count of buckets
	_     [8]byte       // 56 + 8 bytes: each shard on its own 64-byte cache line
}

type entry struct {
	b      Bucket
	fullAt int64 // Unix ns from which b is full, so evicting it is exact
}

// NewLocal returns a Local limiter. It starts no goroutines.
func NewLocal(opts LocalOptions) (*Local, error) {
	l := newLocal(opts)
	if err := register(opts.Registerer, opts.Region, l.m.collectors(l.Len)...); err != nil {
		return nil, fmt.Errorf("new local limiter: %w", err)
	}
	return l, nil
}

func newLocal(opts LocalOptions) *Local {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxBuckets <= 0 {
		opts.MaxBuckets = DefaultMaxBuckets
	}
	l := &Local{now: opts.Now, seed: maphash.MakeSeed(), max: int64(opts.MaxBuckets), m: newLocalMetrics()}
	for i := range l.shards {
		l.shards[i].m = make(map[uint64]entry)
		l.shards[i].owing = &l.owing
		l.shards[i].size = &l.size
	}
	return l
}

// Decide takes r.Cost tokens (0 means 1) from the local bucket of (r.Tenant, r.Route)
// holding r.Limit. Decisions have SourceLocal. The error is non-nil only for an
// invalid request (ErrInvalidRequest) or a context that has already ended.
func (l *Local) Decide(ctx context.Context, r Request) (Decision, error) {
	cost, err := r.cost()
	if err != nil {
		return Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("decide %s/%s: %w", r.Tenant, r.Route, err)
	}
	d := l.takeID(l.now(), idOf(r), r.Limit, cost)
	d.Source = SourceLocal
	return d, nil
}

// Len is the number of buckets held.
func (l *Local) Len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// Sweep deletes every bucket that is full by now and returns how many. Buckets are
// evicted as new ones arrive anyway; Sweep is for a caller that wants memory back after
// a burst of keys with no traffic since (for example on a timer).
func (l *Local) Sweep() int {
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

// bucketID names one in-memory bucket: a tenant's route, and a client value of it
// (Request.Value) or "".
type bucketID struct{ tenant, route, value string }

func idOf(r Request) bucketID { return bucketID{r.Tenant, r.Route, r.Value} }

// key hashes id and picks its shard. Each id is hashed on its own, with the seed (no
// copy through a Hash's buffer), and the hashes are mixed by odd multipliers, so
// ("ab", "c") and ("a", "bc"), or ("a", "b") and ("b", "a"), differ. A value, of any
// length, is hashed the same way: the map holds 64-bit keys only.
func (l *Local) key(id bucketID) (uint64, *shard) {
	k := maphash.String(l.seed, id.tenant)*0x9e3779b97f4a7c15 ^ maphash.String(l.seed, id.route)
	if id.value != "" {
		k = k*0xbf58476d1ce4e5b9 ^ maphash.String(l.seed, id.value)
	}
	return k, &l.shards[k>>58] // the top 6 bits pick one of 64 shards
}

// take is takeID for a (tenant, route) without a value.
func (l *Local) take(now time.Time, tenant, route string, lim regions.Limit, cost int64) Decision {
	return l.takeID(now, bucketID{tenant: tenant, route: route}, lim, cost)
}

// takeID is the decision of every local bucket, at now, with a validated limit and cost.
func (l *Local) takeID(now time.Time, id bucketID, lim regions.Limit, cost int64) Decision {
	var d Decision
	l.update(now, id, lim, func(e entry, owed int64) (entry, int64, bool) {
		d = e.b.Take(now, lim.Capacity, lim.RefillPerSecond, cost)
		return e, owed, true
	})
	return d
}

// update runs f on the bucket id, a full one if there is none, and its
// debt (see shard.owed), under its shard's lock, and stores what f returns unless f
// says not to keep a missing bucket (then it stays missing, owing nothing). It keeps the
// shard bounded as described on Local. (Values in and out, not pointers: a pointer
// handed to f would put the entry on the heap on every decision.)
func (l *Local) update(now time.Time, id bucketID, lim regions.Limit, f func(e entry, owed int64) (entry, int64, bool)) {
	t := now.UnixNano()
	k, s := l.key(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[k]
	var owed int64
	if s.owed != nil {
		owed = s.owed[k]
	}
	was := owed
	e, owed, keep := f(e, owed)
	if !keep && !ok {
		owed = 0
	}
	switch {
	case owed != 0:
		if s.owed == nil {
			s.owed = make(map[uint64]int64)
		}
		s.owed[k] = owed
		if was == 0 {
			l.owing.Add(1)
		}
	case was != 0:
		s.forgive(k)
	}
	if !keep && !ok {
		return
	}
	idle, forced := 0, 0
	if !ok {
		idle += s.sample(t, sampleOnInsert)
		// The cap is the whole limiter's: a per-shard cap of MaxBuckets/64 would let a
		// client landing in a blocked client's shard evict its bucket (and so give it a
		// full one back) long before the limiter is full.
		// The slot is taken before the check, so concurrent inserts cannot all pass it.
		if l.size.Add(1) > l.max {
			i, f, dropped := s.makeRoom(t)
			idle, forced = idle+i, forced+f
			if dropped > 0 {
				l.m.debtDropped.Add(float64(dropped))
			}
		}
	} else if s.hits++; s.hits%sampleEvery == 0 {
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

// makeRoom is called when the shard is at its cap: it samples for full buckets, and if
// there are none, evicts the sampled bucket closest to full. It returns the idle and
// the forced evictions, and the debt the forced one forgot.
func (s *shard) makeRoom(now int64) (idle, forced int, dropped int64) {
	seen := 0
	var victim uint64
	victimAt, found := int64(0), false
	for k, e := range s.m {
		if e.fullAt <= now {
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
		dropped = s.remove(victim)
		forced = 1
	}
	return idle, forced, dropped
}

// remove evicts the bucket k, and its debt with it, and returns that debt. (A full
// bucket's debt is void anyway: see fallback.owed.)
func (s *shard) remove(k uint64) int64 {
	delete(s.m, k)
	s.size.Add(-1)
	if s.owed != nil {
		if d, owed := s.owed[k]; owed {
			s.forgive(k)
			return d
		}
	}
	return 0
}

// forgive drops k's debt, which must exist, and the debt map once it is empty.
func (s *shard) forgive(k uint64) {
	delete(s.owed, k)
	s.owing.Add(-1)
	if len(s.owed) == 0 {
		s.owed = nil
	}
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
