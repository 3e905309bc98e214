package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// untilSource decides r until a decision comes from want, at most n times, and returns
// how many decisions it took.
func untilSource(t *testing.T, l *Redis, r Request, want Source, n int) int {
	t.Helper()
	for i := 1; i <= n; i++ {
		if d := mustDecide(t, l, r); d.Source == want {
			return i
		}
	}
	t.Fatalf("no %s decision in %d", want, n)
	return 0
}

// TestLeaseLifecycle: a key becomes hot and is leased in batches sized by the bound;
// its decisions are local; an expired lease is renewed with one call while the key stays
// hot; a cooled key gives its unspent tokens back and is decided by Redis again.
func TestLeaseLifecycle(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, rdb, Options{
		Region: "test", Registerer: reg, Now: clock.Now, Timeout: time.Second,
		Leases: LeaseOptions{Threshold: 100}, Instances: func() int { return 2 },
	})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// batch = 2% x 1000/s / 2 instances = 10 tokens; bound 20.
	r := Request{Tenant: "hot", Route: "r", Limit: regions.Limit{Capacity: 100_000, RefillPerSecond: 1000}}
	calls0 := scriptCalls(t, rdb)
	// The clock stands still: every decision is "now", so the key is hot at once; it
	// is tracked after a sampled few (1 in 16).
	untilSource(t, l, r, SourceLease, 200)
	plain := scriptCalls(t, rdb) - calls0
	leases := l.Leases()
	if len(leases) != 1 {
		t.Fatalf("Leases() = %+v, want one", leases)
	}
	li := leases[0]
	if li.Tenant != "hot" || li.Route != "r" || li.Batch != 10 || li.Instances != 2 || li.Bound != 20 ||
		li.Held != 9 || li.ExpiresIn != DefaultLeaseTTL {
		t.Errorf("Leases()[0] = %+v, want hot/r batch 10, 2 instances, bound 20, 9 held, expiring in %v", li, DefaultLeaseTTL)
	}
	if v := metricValue(t, reg, "ratelimit_lease_overadmission_bound_tokens", map[string]string{"tenant": "hot", "route": "r"}); v != 20 {
		t.Errorf("ratelimit_lease_overadmission_bound_tokens = %v, want 20", v)
	}
	if v := metricValue(t, reg, "ratelimit_lease_keys", nil); v != 1 {
		t.Errorf("ratelimit_lease_keys = %v, want 1", v)
	}

	// 100 decisions: all local but one lease call per 10 tokens.
	before := scriptCalls(t, rdb)
	for i := range 100 {
		if d := mustDecide(t, l, r); !d.Allowed || d.Source != SourceLease || d.Limit != 100_000 {
			t.Fatalf("decision %d on a leased key: %+v, want allowed from the lease", i, d)
		}
	}
	if n := scriptCalls(t, rdb) - before; n != 10 {
		t.Errorf("100 leased decisions made %d Redis calls, want 10 (batches of 10)", n)
	}
	t.Logf("%d plain calls before the key was leased", plain)

	// A request larger than a batch goes to Redis; the lease stays as it was.
	heldBefore := l.Leases()[0].Held
	big := r
	big.Cost = 11
	if d := mustDecide(t, l, big); d.Source != SourceRedis || !d.Allowed {
		t.Errorf("cost 11 on a leased key with batch 10: %+v, want allowed by redis", d)
	}
	if li := l.Leases(); len(li) != 1 || li[0].Held != heldBefore {
		t.Errorf("after a large request: %+v, want the lease untouched (held %d)", li, heldBefore)
	}

	// Past the TTL the held tokens may not be spent: the next decision renews the
	// lease (the key is still hot: 300 tokens over 300 ms) with one call.
	held := l.Leases()[0].Held
	clock.Advance(300 * time.Millisecond)
	before = scriptCalls(t, rdb)
	if d := mustDecide(t, l, r); d.Source != SourceLease || !d.Allowed {
		t.Errorf("after the TTL: %+v, want a renewed lease", d)
	}
	if n := scriptCalls(t, rdb) - before; n != 1 {
		t.Errorf("renewing made %d calls, want 1", n)
	}
	if li := l.Leases()[0]; li.Held != 9 || li.ExpiresIn != DefaultLeaseTTL {
		t.Errorf("renewed lease %+v (held %d before), want topped up to 10 then one spent", li, held)
	}

	// The key cools (one decision in 10 s): its 9 tokens go back, Redis decides.
	clock.Advance(10 * time.Second)
	before = scriptCalls(t, rdb)
	if d := mustDecide(t, l, r); d.Source != SourceRedis {
		t.Errorf("cooled key: %+v, want a redis decision", d)
	}
	if n := scriptCalls(t, rdb) - before; n != 2 {
		t.Errorf("cooling made %d calls, want 2 (return, take)", n)
	}
	if v := metricValue(t, reg, "ratelimit_lease_tokens_total", map[string]string{"direction": "returned"}); v != 9 {
		t.Errorf("tokens returned %v, want 9", v)
	}
	if got := l.Leases(); len(got) != 0 {
		t.Errorf("Leases() after cooling = %+v, want none", got)
	}
}

// TestLeaseEmptyBucketRejectsLocally: once the shared bucket is empty, a leased key's
// requests are rejected locally (Source "lease") with no Redis call, until this
// instance's share of the refill can have made a batch.
func TestLeaseEmptyBucketRejectsLocally(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	clock := newFakeClock()
	// One instance, fraction 1: batch = refill 10/s x 1 s = 10. The capacity is large
	// enough that the key is surely tracked (sampled 1 in 16) before the bucket is empty.
	l := newTestRedis(t, rdb, Options{Now: clock.Now, Timeout: time.Second, Leases: LeaseOptions{Threshold: 1, Fraction: 1}})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 200, RefillPerSecond: 10}}
	admitted, start := 0, time.Now()
	for range 400 {
		d := mustDecide(t, l, r)
		if !d.Allowed {
			break
		}
		admitted++
	}
	// The instance stops asking once the bucket holds less than a batch per instance
	// (up to 9 tokens may be left for the others), and the bucket refills 10/s in real
	// time while this runs.
	if refilled := int(10*time.Since(start).Seconds()) + 1; admitted < 200-10 || admitted > 200+refilled {
		t.Fatalf("admitted %d before the first rejection, want the capacity (200) less at most a batch", admitted)
	}
	d := mustDecide(t, l, r)
	if d.Allowed || d.Source != SourceLease || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
		t.Errorf("empty bucket: %+v, want a local rejection with a RetryAfter up to the 1 s a batch takes", d)
	}
	before := scriptCalls(t, rdb)
	for range 50 {
		if d := mustDecide(t, l, r); d.Allowed || d.Source != SourceLease {
			t.Fatalf("blocked key: %+v, want a local rejection", d)
		}
	}
	if n := scriptCalls(t, rdb) - before; n != 0 {
		t.Errorf("50 local rejections made %d Redis calls, want 0", n)
	}
	clock.Advance(2 * time.Second) // past the wait: the next decision asks Redis again
	before = scriptCalls(t, rdb)
	mustDecide(t, l, r)
	if n := scriptCalls(t, rdb) - before; n != 1 {
		t.Errorf("after the wait: %d Redis calls, want 1 lease call", n)
	}
}

// TestLeaseNotWorthIt: a rule whose batch would be under 2 tokens (refill too small
// for the bound, given the instances) is never leased, however hot.
func TestLeaseNotWorthIt(t *testing.T) {
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{Timeout: time.Second, Leases: LeaseOptions{Threshold: 1}, Instances: func() int { return 20 }})
	// 2% of 1000/s over 20 instances: 1 token.
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 1_000_000, RefillPerSecond: 1000}}
	for range 200 {
		if d := mustDecide(t, l, r); d.Source != SourceRedis {
			t.Fatalf("%+v, want every decision from redis", d)
		}
	}
	if got := l.Leases(); len(got) != 0 {
		t.Errorf("Leases() = %+v, want none", got)
	}
}

// TestLeaseSurvivesRedisOutage: tokens already leased are spent while Redis is down;
// then the fallback decides.
func TestLeaseSurvivesRedisOutage(t *testing.T) {
	p := testenv.Redis(t)
	clock := newFakeClock()
	l := newTestRedis(t, newClient(t, p), Options{Now: clock.Now, Timeout: 100 * time.Millisecond, Leases: LeaseOptions{Threshold: 1, Fraction: 1}})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 1000, RefillPerSecond: 50}}
	untilSource(t, l, r, SourceLease, 200)
	held := l.Leases()[0].Held
	if held < 1 {
		t.Fatalf("held %d after a lease", held)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := range held {
		if d := mustDecide(t, l, r); d.Source != SourceLease || !d.Allowed {
			t.Fatalf("leased token %d with Redis dead: %+v, want allowed from the lease", i, d)
		}
	}
	if d := mustDecide(t, l, r); d.Source != SourceFallback {
		t.Errorf("lease spent, Redis dead: %+v, want the fallback's decision", d)
	}
}

// TestLeaseTableBounded: many hot keys fill the table up to MaxLeaseKeys and no more;
// the bound series are capped at MaxLeaseSeries.
func TestLeaseTableBounded(t *testing.T) {
	p := testenv.Redis(t)
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, newClient(t, p), Options{
		Region: "test", Registerer: reg, Now: clock.Now, Timeout: time.Second,
		Leases: LeaseOptions{Threshold: 1, Fraction: 1, MaxKeys: 128, MaxSeries: 5},
	})
	for k := range 400 {
		r := Request{Tenant: fmt.Sprintf("t%d", k), Route: "r", Limit: regions.Limit{Capacity: 1000, RefillPerSecond: 100}}
		for range 40 {
			mustDecide(t, l, r)
		}
	}
	leased := l.Leases()
	if len(leased) == 0 || len(leased) > 128 {
		t.Errorf("%d leased keys, want some and at most 128", len(leased))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ratelimit_lease_overadmission_bound_tokens" && len(mf.GetMetric()) != min(5, len(leased)) {
			t.Errorf("%d bound series, want %d", len(mf.GetMetric()), min(5, len(leased)))
		}
	}
}

func TestNewRedisRejectsBadLeaseOptions(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	for _, o := range []Options{
		{Leases: LeaseOptions{Threshold: -1}},
		{Leases: LeaseOptions{Fraction: 1.5}},
		{Leases: LeaseOptions{Fraction: -0.1}},
		{Leases: LeaseOptions{TTL: -time.Second}},
		{Leases: LeaseOptions{MaxKeys: -1}},
		{Pipeline: PipelineOptions{Batch: -1}},
		{Pipeline: PipelineOptions{InFlight: -2}},
		{Breaker: BreakerOptions{OpenFor: -time.Second}},
		{Registerer: prometheus.NewRegistry()}, // no Region for the metrics' label
	} {
		if _, err := NewRedis(rdb, o); err == nil {
			t.Errorf("NewRedis(%+v): no error", o)
		}
	}
}

// TestLeaseManyCallersOneInstance: 64 concurrent callers on one instance's leased key
// share its batches: they take turns refilling rather than each asking Redis, so Redis
// calls stay about one per batch admitted.
func TestLeaseManyCallersOneInstance(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	l := newTestRedis(t, rdb, Options{Timeout: time.Second, Leases: LeaseOptions{Threshold: 100}})
	// One instance: batch = 2% of 1000/s = 20.
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 1000, RefillPerSecond: 1000}}
	untilSource(t, l, r, SourceLease, 500)
	before := scriptCalls(t, rdb)
	sources, allowed := decideConcurrently(t, l, 64, 500, func(int) Request { return r })
	calls := scriptCalls(t, rdb) - before
	t.Logf("64 x 500 decisions: %d allowed, %d Redis calls, sources %v", allowed, calls, sources)
	if allowed == 0 || float64(calls) > float64(allowed)/15 {
		t.Errorf("%d Redis calls for %d admitted, want about one per batch of 20 (at most 1/15)", calls, allowed)
	}
}

// BenchmarkLeaseTrackingColdKeys: what leases cost a decision on a key that is not hot
// (the rate tracking in front of the Redis call), over 100,000 keys.
func BenchmarkLeaseTrackingColdKeys(b *testing.B) {
	p := testenv.Redis(b)
	l := newTestRedis(b, newClient(b, p), Options{Leases: LeaseOptions{Threshold: 100}})
	reqs := make([]Request, 100_000)
	for i := range reqs {
		reqs[i] = Request{Tenant: fmt.Sprintf("tenant-%06d", i), Route: "r", Limit: regions.Limit{Capacity: 1000, RefillPerSecond: 1000}}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, ok := l.decideLease(ctx, reqs[i%len(reqs)], 1, 1); ok {
			b.Fatal("a cold key was leased")
		}
		i += 7919 // a prime stride: every key in turn, none twice in a row
	}
}
