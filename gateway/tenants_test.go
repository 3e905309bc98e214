package gateway

import (
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func newTestTracker(t *testing.T, max int) (*tenantTracker, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, "r1", nil)
	if err != nil {
		t.Fatal(err)
	}
	return newTenantTracker(m, "r1", max, func(tenant, route string) (float64, bool) { return 0.5, true }), reg
}

func tenantCount(tr *tenantTracker, tenant, route string, d decision) float64 {
	return testutil.ToFloat64(tr.vec.WithLabelValues("r1", tenant, route, decisionNames[d]))
}

func TestTenantTrackerAdmitsFirstUpToMax(t *testing.T) {
	tr, reg := newTestTracker(t, 2)
	tr.count("a", "x", decAllowed)
	tr.count("b", "x", decThrottled)
	tr.count("c", "x", decAllowed) // over the cap
	tr.count("a", "x", decAllowed)
	if got := tenantCount(tr, "a", "x", decAllowed); got != 2 {
		t.Errorf("a/x allowed = %v, want 2", got)
	}
	if got := tenantCount(tr, "b", "x", decThrottled); got != 1 {
		t.Errorf("b/x throttled = %v, want 1", got)
	}
	if got := tenantCount(tr, labelOther, labelOther, decAllowed); got != 1 {
		t.Errorf("_other allowed = %v, want 1", got)
	}
	// c/x has no series of its own: 2 tracked pairs + _other, 3 decisions each.
	if n := testutil.CollectAndCount(reg, "ratelimit_tenant_requests_total"); n != 9 {
		t.Errorf("%d tenant series, want 9", n)
	}
}

func TestTenantTrackerRotatesBusiestIn(t *testing.T) {
	tr, reg := newTestTracker(t, 2)
	tr.count("quiet", "x", decAllowed)
	for range 5 {
		tr.count("steady", "x", decAllowed)
	}
	for range 3 {
		tr.count("hot", "x", decAllowed) // untracked: a candidate
	}
	tr.rotate()
	if tr.trackedPairs() != 2 {
		t.Fatalf("%d tracked pairs, want 2", tr.trackedPairs())
	}
	tr.count("hot", "x", decThrottled)
	if got := tenantCount(tr, "hot", "x", decThrottled); got != 1 {
		t.Errorf("hot/x throttled = %v after rotation, want 1 (tracked)", got)
	}
	// The evicted pair's series are gone; steady keeps its history.
	if n := testutil.CollectAndCount(reg, "ratelimit_tenant_requests_total"); n != 9 {
		t.Errorf("%d tenant series, want 9 (quiet evicted)", n)
	}
	if got := tenantCount(tr, "steady", "x", decAllowed); got != 5 {
		t.Errorf("steady/x = %v, want 5", got)
	}
	if n := testutil.CollectAndCount(reg, "ratelimit_region_share_ratio"); n != 2 {
		t.Errorf("%d share series, want 2 (tracked pairs only; the caller owns \"*\")", n)
	}
}

func TestTenantTrackerKeepsBusyPairsAgainstQuieterCandidates(t *testing.T) {
	tr, _ := newTestTracker(t, 1)
	for range 10 {
		tr.count("busy", "x", decAllowed)
	}
	for i := range 50 {
		tr.count(fmt.Sprintf("t%d", i), "x", decAllowed) // each seen once
	}
	tr.rotate()
	tr.count("busy", "x", decAllowed)
	if got := tenantCount(tr, "busy", "x", decAllowed); got != 11 {
		t.Fatalf("busy/x = %v, want 11 (still tracked)", got)
	}
}

// TestTenantTrackerBounded: many tenants never grow the series or the sketch past their caps.
func TestTenantTrackerBounded(t *testing.T) {
	const max = 100
	tr, reg := newTestTracker(t, max)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 5000 {
				tr.count(fmt.Sprintf("t%d", (i*7+w)%3000), "x", decision(i%3))
				if i%1000 == 0 {
					tr.rotate()
				}
			}
		})
	}
	wg.Wait()
	tr.rotate()
	if n := testutil.CollectAndCount(reg, "ratelimit_tenant_requests_total"); n > (max+1)*3 {
		t.Fatalf("%d tenant series, cap is %d", n, (max+1)*3)
	}
	cands := 0
	for i := range tr.shards {
		tr.shards[i].mu.Lock()
		cands += len(tr.shards[i].cands)
		tr.shards[i].mu.Unlock()
	}
	if cands > maxCandidates {
		t.Fatalf("%d candidates, cap %d", cands, maxCandidates)
	}
}

func BenchmarkTenantTrackerCount(b *testing.B) {
	reg := prometheus.NewRegistry()
	m, _ := newMetrics(reg, "r1", nil)
	tr := newTenantTracker(m, "r1", 1000, func(string, string) (float64, bool) { return 1, true })
	names := make([]string, 2000)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%d", i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tr.count(names[i%len(names)], "create-order", decAllowed)
			i++
		}
	})
}

// benchTracker is a full tracker of 1000 pairs (tenant-0..999 on create-order) and the
// names of 100000 tenants, as many as a large deployment has.
func benchTracker(b *testing.B) (*tenantTracker, []string) {
	b.Helper()
	m, err := newMetrics(prometheus.NewRegistry(), "r1", nil)
	if err != nil {
		b.Fatal(err)
	}
	tr := newTenantTracker(m, "r1", 1000, func(string, string) (float64, bool) { return 1, true })
	names := make([]string, 100000)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%d", i)
	}
	for _, n := range names[:1000] {
		tr.count(n, "create-order", decAllowed)
	}
	if tr.trackedPairs() != 1000 {
		b.Fatalf("%d tracked pairs, want 1000", tr.trackedPairs())
	}
	return tr, names
}

// BenchmarkTenantTrackerTracked: every request is of a tracked pair.
func BenchmarkTenantTrackerTracked(b *testing.B) {
	tr, names := benchTracker(b)
	names = names[:1000]
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tr.count(names[i%len(names)], "create-order", decAllowed)
			i++
		}
	})
}

// BenchmarkTenantTrackerUntracked: every request is of an untracked pair, the set full.
func BenchmarkTenantTrackerUntracked(b *testing.B) {
	tr, names := benchTracker(b)
	names = names[1000:]
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tr.count(names[i%len(names)], "create-order", decAllowed)
			i++
		}
	})
}
