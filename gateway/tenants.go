package gateway

import (
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
// The hot path for a tracked pair is a read lock, a map lookup and two atomic adds.
type tenantTracker struct {
	vec      *prometheus.CounterVec // region, tenant, route, decision
	share    *prometheus.GaugeVec   // scope
	region   string
	max      int
	shareFor func(tenant, route string) (float64, bool)

	mu      sync.RWMutex
	tracked map[pairKey]*pairSeries
	full    atomic.Bool
	other   *pairSeries

	cmu     sync.Mutex
	cands   map[pairKey]*candidate
	candMax int
}

type pairKey struct{ tenant, route string }

// pairSeries are one tracked pair's counters and its count in the current interval.
type pairSeries struct {
	counters [numDecisions]prometheus.Counter // unauthenticated stays nil: no tenant is known
	window   atomic.Int64
}

// candidate is a space-saving counter: count overestimates the true count by at most err.
type candidate struct{ count, err int64 }

// maxCandidates bounds the sketch; a replacement scans it, so it stays small.
const maxCandidates = 64

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
		cands:    make(map[pairKey]*candidate, min(max, maxCandidates)),
		candMax:  min(max, maxCandidates),
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
	t.mu.RLock()
	s := t.tracked[k]
	t.mu.RUnlock()
	if s == nil {
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
			s = t.newSeries(k)
			t.tracked[k] = s
			t.setShare(k)
		}
		if len(t.tracked) >= t.max {
			t.full.Store(true)
		}
		t.mu.Unlock()
		if s != nil {
			return s
		}
	}
	t.cmu.Lock()
	t.note(k)
	t.cmu.Unlock()
	return t.other
}

// note counts k in the space-saving sketch. Called with cmu held.
func (t *tenantTracker) note(k pairKey) {
	if c := t.cands[k]; c != nil {
		c.count++
		return
	}
	if len(t.cands) < t.candMax {
		t.cands[k] = &candidate{count: 1}
		return
	}
	var minK pairKey
	var minC *candidate
	for ck, c := range t.cands {
		if minC == nil || c.count < minC.count {
			minK, minC = ck, c
		}
	}
	delete(t.cands, minK)
	minC.err = minC.count
	minC.count++
	t.cands[k] = minC
}

// rotate lets the busiest candidates of the last interval replace the quietest tracked
// pairs, then starts a new interval.
func (t *tenantTracker) rotate() {
	t.cmu.Lock()
	type cand struct {
		k     pairKey
		count int64 // guaranteed: count - err
	}
	cands := make([]cand, 0, len(t.cands))
	for k, c := range t.cands {
		cands = append(cands, cand{k, c.count - c.err})
	}
	clear(t.cands)
	t.cmu.Unlock()
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
			t.tracked[cands[i].k] = t.newSeries(cands[i].k)
			t.setShare(cands[i].k)
			continue
		}
		if len(tracked) == 0 || cands[i].count <= tracked[0].window {
			break
		}
		t.evict(tracked[0].k)
		tracked = tracked[1:]
		t.tracked[cands[i].k] = t.newSeries(cands[i].k)
		t.setShare(cands[i].k)
	}
	t.full.Store(len(t.tracked) >= t.max)
}

// evict deletes a tracked pair and its series. Called with mu held.
func (t *tenantTracker) evict(k pairKey) {
	delete(t.tracked, k)
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
