package gateway

import (
	"hash/maphash"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// tenantTracker bounds ratelimit_tenant_requests_total to max (tenant, route) pairs that
// have series of their own; every other pair counts as tenant="_other", route="_other".
//
// Which pairs: the first max pairs seen are admitted at once (warm-up). Once the table is
// full, requests of untracked pairs go to "_other" and are also counted in a small
// space-saving sketch (Metwally et al.) of candidates. Every rotation interval, the
// candidates whose guaranteed count in the interval beats the quietest tracked pairs'
// counts replace them: the evicted pairs' series are deleted (Prometheus sees them go
// stale) and the newcomers' start at zero. So the tracked set converges to the busiest
// pairs, a pair needs one interval of being busier than the quietest tracked one to get
// in, at most len(candidates) pairs change per interval, and memory is bounded by
// max + candidate slots whatever the number of tenants.
//
// The hot path takes no tracker-wide lock: a tracked pair is a lock-free sync.Map lookup
// and two atomic adds; an untracked pair once the table is full is that lookup and one
// shard of the sketch, locked on its own (the sketch is split by the pair's hash, each
// shard a space-saving sketch of its pairs with an equal part of the slots). mu is taken
// only while the table changes: warm-up admissions, rotate and refreshShares.
type tenantTracker struct {
	vec      *prometheus.CounterVec // region, tenant, route, decision
	share    *prometheus.GaugeVec   // scope
	region   string
	max      int
	shareFor func(tenant, route string) (float64, bool)

	mu      sync.RWMutex
	tracked map[pairKey]*pairSeries // guarded by mu; series mirrors it for the hot path
	series  sync.Map                // pairKey -> *pairSeries, written only with mu held
	full    atomic.Bool
	other   *pairSeries

	seed   maphash.Seed
	shards []sketchShard
}

// sketchShard is one part of the candidate sketch: the pairs whose hash falls in it.
type sketchShard struct {
	mu      sync.Mutex
	cands   map[pairKey]*candidate
	candMax int
	_       [40]byte // a cache line of its own: shards are locked from every core
}

type pairKey struct{ tenant, route string }

// pairSeries are one tracked pair's counters and its count in the current interval.
type pairSeries struct {
	counters [numDecisions]prometheus.Counter // unauthenticated stays nil: no tenant is known
	window   atomic.Int64
}

// candidate is a space-saving counter: count overestimates the true count by at most err.
type candidate struct{ count, err int64 }

// maxCandidates bounds the sketch; a replacement scans its shard, so it stays small.
const maxCandidates = 64

// maxSketchShards bounds the shards of the sketch; each has maxCandidates/maxSketchShards
// slots at most.
const maxSketchShards = 8

// newTenantTracker builds a tracker; shareFor reports a pair's effective share for
// ratelimit_region_share_ratio (false while no snapshot is loaded).
func newTenantTracker(m *metrics, region string, max int, shareFor func(tenant, route string) (float64, bool)) *tenantTracker {
	t := &tenantTracker{
		vec:      m.tenantRequests,
		share:    m.shareRatio,
		region:   region,
		max:      max,
		shareFor: shareFor,
		tracked:  make(map[pairKey]*pairSeries, max),
		seed:     maphash.MakeSeed(),
	}
	// Slots: min(max, maxCandidates) in all, split evenly, one per shard at least.
	slots := min(max, maxCandidates)
	if slots < 1 {
		slots = 1
	}
	t.shards = make([]sketchShard, min(slots, maxSketchShards))
	for i := range t.shards {
		n := slots / len(t.shards)
		t.shards[i] = sketchShard{cands: make(map[pairKey]*candidate, n), candMax: n}
	}
	t.other = t.newSeries(pairKey{labelOther, labelOther})
	return t
}

func (t *tenantTracker) newSeries(k pairKey) *pairSeries {
	s := &pairSeries{}
	for d := range decUnauthenticated {
		s.counters[d] = t.vec.WithLabelValues(t.region, k.tenant, k.route, decisionNames[d])
	}
	return s
}

// count records one decided request of tenant on route.
func (t *tenantTracker) count(tenant, route string, d decision) {
	k := pairKey{tenant, route}
	var s *pairSeries
	if v, ok := t.series.Load(k); ok {
		s = v.(*pairSeries)
	} else {
		s = t.admit(k)
	}
	s.counters[d].Inc()
	s.window.Add(1)
}

// admit tracks k if there is room; otherwise notes it as a candidate and returns the
// "_other" series.
func (t *tenantTracker) admit(k pairKey) *pairSeries {
	if !t.full.Load() {
		t.mu.Lock()
		s := t.tracked[k]
		if s == nil && len(t.tracked) < t.max {
			s = t.track(k)
		}
		if len(t.tracked) >= t.max {
			t.full.Store(true)
		}
		t.mu.Unlock()
		if s != nil {
			return s
		}
	}
	sh := t.shard(k)
	sh.mu.Lock()
	sh.note(k)
	sh.mu.Unlock()
	return t.other
}

// shard is the part of the sketch that counts k.
func (t *tenantTracker) shard(k pairKey) *sketchShard {
	if len(t.shards) == 1 {
		return &t.shards[0]
	}
	return &t.shards[maphash.Comparable(t.seed, k)%uint64(len(t.shards))]
}

// note counts k in the shard's space-saving sketch. Called with sh.mu held.
func (sh *sketchShard) note(k pairKey) {
	if c := sh.cands[k]; c != nil {
		c.count++
		return
	}
	if len(sh.cands) < sh.candMax {
		sh.cands[k] = &candidate{count: 1}
		return
	}
	var minK pairKey
	var minC *candidate
	for ck, c := range sh.cands {
		if minC == nil || c.count < minC.count {
			minK, minC = ck, c
		}
	}
	delete(sh.cands, minK)
	minC.err = minC.count
	minC.count++
	sh.cands[k] = minC
}

// rotate lets the busiest candidates of the last interval replace the quietest tracked
// pairs, then starts a new interval.
func (t *tenantTracker) rotate() {
	type cand struct {
		k     pairKey
		count int64 // guaranteed: count - err
	}
	var cands []cand
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, c := range sh.cands {
			cands = append(cands, cand{k, c.count - c.err})
		}
		clear(sh.cands)
		sh.mu.Unlock()
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].count > cands[j].count })

	t.mu.Lock()
	defer t.mu.Unlock()
	type cur struct {
		k      pairKey
		window int64
	}
	tracked := make([]cur, 0, len(t.tracked))
	for k, s := range t.tracked {
		tracked = append(tracked, cur{k, s.window.Swap(0)})
	}
	t.other.window.Store(0)
	sort.Slice(tracked, func(i, j int) bool { return tracked[i].window < tracked[j].window })
	for i := 0; i < len(cands) && cands[i].count > 0; i++ {
		if _, ok := t.tracked[cands[i].k]; ok {
			continue
		}
		if len(t.tracked) < t.max {
			t.track(cands[i].k)
			continue
		}
		if len(tracked) == 0 || cands[i].count <= tracked[0].window {
			break
		}
		t.evict(tracked[0].k)
		tracked = tracked[1:]
		t.track(cands[i].k)
	}
	t.full.Store(len(t.tracked) >= t.max)
}

// track gives k series of its own and returns them. Called with mu held.
func (t *tenantTracker) track(k pairKey) *pairSeries {
	s := t.newSeries(k)
	t.tracked[k] = s
	t.series.Store(k, s)
	t.setShare(k)
	return s
}

// evict deletes a tracked pair and its series. Called with mu held.
func (t *tenantTracker) evict(k pairKey) {
	delete(t.tracked, k)
	t.series.Delete(k)
	for d := range decUnauthenticated {
		t.vec.DeleteLabelValues(t.region, k.tenant, k.route, decisionNames[d])
	}
	t.share.DeleteLabelValues(k.tenant + "/" + k.route)
}

// setShare sets a tracked pair's share gauge. Called with mu held.
func (t *tenantTracker) setShare(k pairKey) {
	if v, ok := t.shareFor(k.tenant, k.route); ok {
		t.share.WithLabelValues(k.tenant + "/" + k.route).Set(v)
	}
}

// refreshShares sets every tracked pair's share gauge, after a reload.
func (t *tenantTracker) refreshShares() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.tracked {
		t.setShare(k)
	}
}

// trackedPairs is the number of pairs with series of their own.
func (t *tenantTracker) trackedPairs() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.tracked)
}
