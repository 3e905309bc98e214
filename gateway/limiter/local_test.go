package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/regions"
)

func newTestLocal(t testing.TB, opts LocalOptions) *Local {
	t.Helper()
	l, err := NewLocal(opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustDecide(t testing.TB, l interface {
	Decide(context.Context, Request) (Decision, error)
}, r Request) Decision {
	t.Helper()
	d, err := l.Decide(context.Background(), r)
	if err != nil {
		t.Fatalf("Decide(%+v): %v", r, err)
	}
	return d
}

func TestLocalArticle(t *testing.T) {
	clock := newFakeClock()
	l := newTestLocal(t, LocalOptions{Now: clock.Now})
	r := Request{Tenant: "shop-a", Route: "create-order", Limit: regions.Limit{Capacity: 2, RefillPerSecond: 1}}
	want := []Decision{
		{Allowed: true, Limit: 2, RefillPerSecond: 1, Remaining: 1, ResetAfter: time.Second, Source: SourceLocal},
		{Allowed: true, Limit: 2, RefillPerSecond: 1, Remaining: 0, ResetAfter: 2 * time.Second, Source: SourceLocal},
		{Allowed: false, Limit: 2, RefillPerSecond: 1, Remaining: 0, RetryAfter: time.Second, ResetAfter: 2 * time.Second, Source: SourceLocal},
	}
	for i, w := range want {
		if got := mustDecide(t, l, r); !reflect.DeepEqual(got, w) {
			t.Fatalf("request %d: got %+v, want %+v", i+1, got, w)
		}
	}
	clock.Advance(time.Second)
	if got := mustDecide(t, l, r); !got.Allowed || got.Remaining != 0 {
		t.Fatalf("after 1 s: got %+v, want allowed with remaining 0", got)
	}
	// Another route of the same tenant is another bucket.
	if got := mustDecide(t, l, Request{Tenant: "shop-a", Route: "other", Limit: r.Limit}); !got.Allowed || got.Remaining != 1 {
		t.Errorf("other route: got %+v, want a fresh bucket", got)
	}
}

func TestLocalFractionalRefill(t *testing.T) {
	clock := newFakeClock()
	l := newTestLocal(t, LocalOptions{Now: clock.Now})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 3, RefillPerSecond: 0.3}}
	for range 3 {
		mustDecide(t, l, r)
	}
	taken := 0
	for i := 1; i <= 200; i++ {
		clock.Advance(time.Second)
		if mustDecide(t, l, r).Allowed {
			taken++
		}
	}
	if taken != 60 {
		t.Errorf("200 s at 0.3/s admitted %d, want 60", taken)
	}
}

func TestLocalShrinkingCapacityClips(t *testing.T) {
	clock := newFakeClock()
	l := newTestLocal(t, LocalOptions{Now: clock.Now})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 100, RefillPerSecond: 1}}
	mustDecide(t, l, r) // 99 left
	r.Limit.Capacity = 4
	if d := mustDecide(t, l, r); !d.Allowed || d.Remaining != 3 || d.Limit != 4 {
		t.Fatalf("after shrinking to 4: %+v, want allowed, remaining 3, limit 4", d)
	}
}

func TestLocalCost(t *testing.T) {
	clock := newFakeClock()
	l := newTestLocal(t, LocalOptions{Now: clock.Now})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}, Cost: 4}
	for _, want := range []bool{true, true, false} {
		if d := mustDecide(t, l, r); d.Allowed != want {
			t.Fatalf("cost 4 of 10: %+v, want allowed %v", d, want)
		}
	}
}

func TestLocalInvalidRequests(t *testing.T) {
	l := newTestLocal(t, LocalOptions{})
	tests := []struct {
		name string
		r    Request
	}{
		{"capacity 0", Request{Limit: regions.Limit{Capacity: 0, RefillPerSecond: 1}}},
		{"capacity negative", Request{Limit: regions.Limit{Capacity: -1, RefillPerSecond: 1}}},
		{"refill 0", Request{Limit: regions.Limit{Capacity: 1, RefillPerSecond: 0}}},
		{"refill NaN", Request{Limit: regions.Limit{Capacity: 1, RefillPerSecond: math.NaN()}}},
		{"refill Inf", Request{Limit: regions.Limit{Capacity: 1, RefillPerSecond: math.Inf(1)}}},
		{"cost negative", Request{Limit: regions.Limit{Capacity: 1, RefillPerSecond: 1}, Cost: -1}},
		{"cost above capacity", Request{Limit: regions.Limit{Capacity: 1, RefillPerSecond: 1}, Cost: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.r.Tenant, tt.r.Route = "t", "r"
			d, err := l.Decide(context.Background(), tt.r)
			if !errors.Is(err, ErrInvalidRequest) || d.Allowed {
				t.Errorf("Decide = %+v, %v; want ErrInvalidRequest", d, err)
			}
		})
	}
	if n := l.Len(); n != 0 {
		t.Errorf("invalid requests created %d buckets", n)
	}
}

// TestLocalConcurrent: under -race, 64 goroutines on one key admit exactly capacity,
// while others hammer their own keys.
func TestLocalConcurrent(t *testing.T) {
	const workers, calls, capacity = 64, 1000, 100
	clock := newFakeClock()
	l := newTestLocal(t, LocalOptions{Now: clock.Now})
	hot := Request{Tenant: "hot", Route: "r", Limit: regions.Limit{Capacity: capacity, RefillPerSecond: 0.001}}
	var next, allowed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			own := Request{Tenant: "t" + strconv.Itoa(w), Route: "r", Limit: regions.Limit{Capacity: 5, RefillPerSecond: 1}}
			for next.Add(1) <= calls {
				d, err := l.Decide(context.Background(), hot)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					allowed.Add(1)
				}
				if _, err := l.Decide(context.Background(), own); err != nil {
					t.Error(err)
					return
				}
				clock.Advance(time.Microsecond)
			}
		})
	}
	wg.Wait()
	// 1000 µs of fake time at 0.001/s refills nothing.
	if got := allowed.Load(); got != capacity {
		t.Errorf("admitted %d of %d, want exactly %d", got, calls, capacity)
	}
}

// TestLocalIdleEvictionBoundsMemory drives 1M distinct keys through a limiter whose
// buckets are full 10 ms after their last use, at 1M keys per (fake) second: about
// 10,000 buckets are live at any time and the map must stay near that.
func TestLocalIdleEvictionBoundsMemory(t *testing.T) {
	keys, live := 1_000_000, 10_000 // keys per 10 ms of fake time
	if raceEnabled {
		keys = 200_000
	}
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	l := newTestLocal(t, LocalOptions{Region: "test", Now: clock.Now, Registerer: reg})
	lim := regions.Limit{Capacity: 10, RefillPerSecond: 100} // one token back in 10 ms
	tenants := make([]string, 1000)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%04d", i)
	}
	routes := make([]string, keys/len(tenants))
	for i := range routes {
		routes[i] = fmt.Sprintf("route-%04d", i)
	}
	peak := 0
	for i := range keys {
		l.takeRoute(clock.Now(), tenants[i%len(tenants)], routes[i/len(tenants)], lim, 1)
		clock.Advance(time.Microsecond)
		if i%1000 == 0 {
			peak = max(peak, l.Len())
		}
	}
	// Each shard holds its live buckets plus at most ~1/8 dead weight, plus noise
	// between shards; twice the live set is a generous bound.
	t.Logf("%d keys, %d live at a time: peak %d buckets, %d at the end", keys, live, peak, l.Len())
	if peak > 2*live {
		t.Errorf("peak %d buckets, want <= %d (2 x the live set)", peak, 2*live)
	}
	evicted := metricValue(t, reg, "ratelimit_local_evictions_total", map[string]string{"region": "test", "reason": "idle"})
	if evicted < float64(keys-2*live) {
		t.Errorf("evicted %v idle buckets, want >= %d", evicted, keys-2*live)
	}
	if f := metricValue(t, reg, "ratelimit_local_evictions_total", map[string]string{"reason": "capacity"}); f != 0 {
		t.Errorf("%v forced evictions, want 0", f)
	}
	// With no traffic, Sweep gives everything back once full.
	clock.Advance(time.Second)
	l.Sweep()
	if n := l.Len(); n != 0 {
		t.Errorf("after Sweep: %d buckets, want 0", n)
	}
	if g := metricValue(t, reg, "ratelimit_local_buckets", map[string]string{"region": "test"}); g != 0 {
		t.Errorf("ratelimit_local_buckets = %v, want 0", g)
	}
}

// TestLocalMemoryPerBucket measures the heap cost of one live bucket with 1M of them
// (figures in docs/BENCHMARKS.md), then that a shard map gives memory back once its
// buckets are evicted.
func TestLocalMemoryPerBucket(t *testing.T) {
	keys := 1_000_000
	if raceEnabled {
		keys = 100_000
	}
	clock := newFakeClock()
	routes := make([]string, keys)
	for i := range routes {
		routes[i] = fmt.Sprintf("route-%07d", i) // 13 bytes: a 16-byte allocation each
	}
	before := heapInUse()
	l := newTestLocal(t, LocalOptions{Now: clock.Now, MaxBuckets: 2 * keys})
	lim := regions.Limit{Capacity: 10, RefillPerSecond: 1}
	for i := range keys {
		l.takeRoute(clock.Now(), "tenant", routes[i], lim, 1)
	}
	full := heapInUse()
	per := float64(full-before) / float64(keys)
	t.Logf("%d live buckets: %.1f MB, %.1f bytes per bucket (route strings are held by the caller)", keys, float64(full-before)/1e6, per)
	if n := l.Len(); n != keys {
		t.Fatalf("%d buckets, want %d", n, keys)
	}
	if per > 100 {
		t.Errorf("%.1f bytes per bucket, want <= 100", per)
	}
	// Everything is full 1 s after its last use. Traffic on other keys evicts some
	// (a few buckets inspected per call); Sweep evicts the rest and the maps shrink.
	clock.Advance(2 * time.Second)
	for i := range keys / 10 {
		l.takeRoute(clock.Now(), "other", routes[i], lim, 1)
	}
	if n := l.Len(); n > keys {
		t.Errorf("after new keys with idle ones: %d buckets, want <= %d", n, keys)
	}
	clock.Advance(2 * time.Second)
	l.Sweep()
	after := heapInUse()
	t.Logf("after Sweep: %d buckets, %.1f MB", l.Len(), float64(after-before)/1e6)
	if l.Len() != 0 || after-before > (full-before)/10 {
		t.Errorf("after Sweep: %d buckets and %d bytes, want 0 and <= %d", l.Len(), after-before, (full-before)/10)
	}
	runtime.KeepAlive(l)
	runtime.KeepAlive(routes)
}

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

func TestLocalMaxBuckets(t *testing.T) {
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	l := newTestLocal(t, LocalOptions{Region: "test", Now: clock.Now, MaxBuckets: 64 * 16, Registerer: reg})
	lim := regions.Limit{Capacity: 10, RefillPerSecond: 0.001} // never full during the test
	for i := range 10_000 {
		l.takeRoute(clock.Now(), "t", strconv.Itoa(i), lim, 1)
	}
	if n := l.Len(); n > 64*16 {
		t.Errorf("%d buckets, want <= %d", n, 64*16)
	}
	if f := metricValue(t, reg, "ratelimit_local_evictions_total", map[string]string{"reason": "capacity"}); f < 10_000-64*16 {
		t.Errorf("%v forced evictions, want >= %d", f, 10_000-64*16)
	}
}

func TestNewLocalMetricsNeedRegion(t *testing.T) {
	if _, err := NewLocal(LocalOptions{Registerer: prometheus.NewRegistry()}); err == nil {
		t.Error("NewLocal with a Registerer and no Region: no error")
	}
	reg := prometheus.NewRegistry()
	newTestLocal(t, LocalOptions{Region: "a", Registerer: reg})
	if _, err := NewLocal(LocalOptions{Region: "a", Registerer: reg}); err == nil {
		t.Error("second NewLocal on one registry: no error")
	}
}

func BenchmarkLocalDecide(b *testing.B) {
	l := newTestLocal(b, LocalOptions{})
	reqs := make([]Request, 1024)
	for i := range reqs {
		reqs[i] = Request{Tenant: fmt.Sprintf("tenant-%04d", i), Route: "create-order", Limit: regions.Limit{Capacity: 1000, RefillPerSecond: 1000}}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := l.Decide(ctx, reqs[i&1023]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// TestLocalCapIsGlobal: MaxBuckets caps the whole limiter, not each of its 64 shards. A
// cap of MaxBuckets/64 per shard evicted a drained bucket as soon as another key landed in
// its shard, and the evicted key came back with a full bucket (unauthenticated_limit with
// max_clients 100 gave a blocked client its budget back).
func TestLocalCapIsGlobal(t *testing.T) {
	clock := newFakeClock()
	l := newTestLocal(t, LocalOptions{Now: clock.Now, MaxBuckets: 100})
	lim := regions.Limit{Capacity: 1, RefillPerSecond: 0.001}
	for i := range 100 {
		if d := l.takeRoute(clock.Now(), "t", strconv.Itoa(i), lim, 1); !d.Allowed {
			t.Fatalf("key %d: first take refused", i)
		}
	}
	if n := l.Len(); n != 100 {
		t.Errorf("%d buckets held, want all 100 (within MaxBuckets)", n)
	}
	for i := range 100 {
		if d := l.takeRoute(clock.Now(), "t", strconv.Itoa(i), lim, 1); d.Allowed {
			t.Errorf("key %d: admitted again from a drained bucket (evicted below the cap)", i)
		}
	}
}

// takeRoute is take for a (tenant, route) without a value.
func (l *Local) takeRoute(now time.Time, tenant, route string, lim regions.Limit, cost int64) Decision {
	return l.take(now, Request{Tenant: tenant, Route: route}, lim, regions.Limit{}, cost, false)
}
