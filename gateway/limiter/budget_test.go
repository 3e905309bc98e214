package limiter

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// unreachableRedis is a limiter whose Redis closes every connection at once (so every
// call fails fast, without go-redis's background redial), with a frozen fake clock and n
// instances, whose breaker is open: every decision comes from the fallback, whose
// buckets start empty and earn only what the test advances the clock by.
func unreachableRedis(t *testing.T, n int, reg prometheus.Registerer) (*Redis, *fakeClock) {
	t.Helper()
	return unreachableRedisWith(t, Options{Region: "test", Registerer: reg, Instances: func() int { return n }})
}

// unreachableRedisWith is unreachableRedis with opts (its Now, Timeout and breaker are
// set here).
func unreachableRedisWith(t *testing.T, opts Options) (*Redis, *fakeClock) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	clock := newFakeClock()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	opts.Now, opts.Timeout = clock.Now, time.Second
	opts.Breaker = BreakerOptions{Failures: 1, FailureSpan: time.Millisecond, OpenFor: time.Hour}
	l := newTestRedis(t, rdb, opts)
	openBreaker(t, l, clock)
	return l, clock
}

// openBreaker fails calls (on a key of its own) until the breaker is open: two failures
// a fake millisecond apart, the breaker's failure span.
func openBreaker(t *testing.T, l *Redis, clock *fakeClock) {
	t.Helper()
	trip := Request{Tenant: "trip", Route: "trip", Limit: regions.Limit{Capacity: 1 << 20, RefillPerSecond: 1}}
	for i := 0; !l.FallbackActive(); i++ {
		if i == 10 {
			t.Fatal("the breaker did not open after 10 failed calls")
		}
		mustDecide(t, l, trip)
		clock.Advance(time.Millisecond)
	}
}

// TestFallbackStartsEmpty (issue 21 item 2): a fallback bucket holds nothing it has not
// earned: it starts empty when first used in an episode and earns this instance's share
// of the refill, R/N, up to floor(C/N); a key first used late in the episode starts
// empty then, not with what the episode could have earned for it.
func TestFallbackStartsEmpty(t *testing.T) {
	l, clock := unreachableRedis(t, 2, nil)
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 2}} // 5 tokens, 1/s each
	if n := decideN(t, l, r, 10); n != 0 {
		t.Fatalf("admitted %d from a bucket first used now, want 0: it starts empty", n)
	}
	clock.Advance(3 * time.Second)
	if n := decideN(t, l, r, 10); n != 3 {
		t.Fatalf("admitted %d after 3 s at 1/s, want 3", n)
	}
	clock.Advance(time.Hour)
	if n := decideN(t, l, r, 10); n != 5 {
		t.Fatalf("admitted %d after an hour, want the bucket's 5 (floor(10/2))", n)
	}
	late := Request{Tenant: "t", Route: "late", Limit: r.Limit}
	if n := decideN(t, l, late, 10); n != 0 {
		t.Fatalf("a key first used an hour into the episode admitted %d, want 0", n)
	}
}

// TestFallbackRefusesWhileTheBreakerIsClosed: a call that fails while the breaker is
// closed (a slow call, a stall shorter than the failure span) is refused, not decided
// from a bucket: the other gateways still reach Redis, and a second allowance would add
// to theirs. Its limit is the region's (10), not the 1/N of a bucket that did not decide
// (5 of 2 gateways: a 429 of a slow call advertised half the limit).
func TestFallbackRefusesWhileTheBreakerIsClosed(t *testing.T) {
	reg := prometheus.NewRegistry()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	l := newTestRedis(t, rdb, Options{Region: "test", Registerer: reg, Breaker: BreakerOptions{Failures: 1 << 30}, ExpectedInstances: 2})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1000}}
	for i := range 20 {
		if d := mustDecide(t, l, r); d.Allowed || d.Source != SourceFallback || d.RetryAfter <= 0 || d.Limit != 10 {
			t.Fatalf("decision %d with the breaker closed: %+v, want refused by the fallback with a RetryAfter and the region's limit 10", i, d)
		}
	}
	if v := metricValue(t, reg, "ratelimit_fallback_refused_total", map[string]string{"reason": "breaker_closed"}); v != 20 {
		t.Errorf("refused{reason=breaker_closed} = %v, want 20", v)
	}
}

// TestFallbackEarnsNothingUntilCounted: a gateway the others do not count in their N
// yet (it has just started) earns nothing: its share would come on top of theirs.
func TestFallbackEarnsNothingUntilCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	counted := false
	l, clock := unreachableRedisWith(t, Options{Region: "test", Registerer: reg, Counted: func() bool { return counted }})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}}
	before := metricValue(t, reg, "ratelimit_fallback_refused_total", map[string]string{"reason": "not_counted"})
	clock.Advance(time.Hour)
	if n := decideN(t, l, r, 5); n != 0 {
		t.Fatalf("admitted %d before the others count this gateway, want 0", n)
	}
	if v := metricValue(t, reg, "ratelimit_fallback_refused_total", map[string]string{"reason": "not_counted"}) - before; v != 5 {
		t.Errorf("refused{reason=not_counted} grew by %v, want 5", v)
	}
	counted = true
	if n := decideN(t, l, r, 1); n != 0 {
		t.Fatalf("admitted %d once counted, from a bucket first used now, want 0", n)
	}
	clock.Advance(3 * time.Second)
	if n := decideN(t, l, r, 5); n != 3 {
		t.Fatalf("admitted %d 3 s after being counted at 1/s, want 3", n)
	}
}

// TestFallbackRoundsDown (issue 14 item 4): each instance's fallback bucket is
// floor(C/N), so the N buckets hold at most C; capacity 30 over 20 instances is 1 token
// each (20 region-wide), not round(1.5) = 2 (40, 1.33x). Fewer tokens than instances
// keeps 1 each, and that is counted.
func TestFallbackRoundsDown(t *testing.T) {
	for _, tt := range []struct {
		capacity, n, want int64
		floorExceeds      bool
	}{
		{30, 20, 1, false},
		{59, 20, 2, false},
		{100, 3, 33, false},
		{5, 20, 1, true},
	} {
		reg := prometheus.NewRegistry()
		l, clock := unreachableRedis(t, int(tt.n), reg)
		r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: tt.capacity, RefillPerSecond: 1}}
		decideN(t, l, r, 1) // the bucket starts empty...
		clock.Advance(time.Hour)
		got := int64(decideN(t, l, r, 100)) // ...and an hour fills it
		if got != tt.want {
			t.Errorf("capacity %d over %d instances: a full fallback bucket admitted %d, want floor = %d", tt.capacity, tt.n, got, tt.want)
		}
		if got*tt.n > max(tt.capacity, tt.n) {
			t.Errorf("capacity %d over %d instances: %d region-wide", tt.capacity, tt.n, got*tt.n)
		}
		counted := metricValue(t, reg, "ratelimit_fallback_min_capacity_total", nil) > 0
		if counted != tt.floorExceeds {
			t.Errorf("capacity %d over %d instances: min-capacity counted %v, want %v", tt.capacity, tt.n, counted, tt.floorExceeds)
		}
	}
}

// TestFallbackNeverClipsCost (issue 14 item 4): a cost above the fallback bucket is
// rejected, not clipped into a pass that costs less than it takes. Capacity 100 over 4
// instances is 25 tokens each; cost-50 requests must not pass at all.
func TestFallbackNeverClipsCost(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, clock := unreachableRedis(t, 4, reg)
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 100, RefillPerSecond: 1}, Cost: 50}
	clock.Advance(time.Hour)
	for i := range 10 {
		d := mustDecide(t, l, r)
		if d.Allowed || d.Source != SourceFallback || d.RetryAfter <= 0 {
			t.Fatalf("cost-50 request %d against a 25-token fallback bucket: %+v, want rejected by the fallback with a RetryAfter", i, d)
		}
	}
	if v := metricValue(t, reg, "ratelimit_fallback_cost_rejections_total", nil); v != 10 {
		t.Errorf("ratelimit_fallback_cost_rejections_total = %v, want 10", v)
	}
	r.Cost = 25
	decideN(t, l, r, 1)
	clock.Advance(time.Hour)
	if d := mustDecide(t, l, r); !d.Allowed {
		t.Errorf("cost 25 = the full fallback bucket: %+v, want allowed", d)
	}
}

// TestDebtKeepsTheCapacityItWasAdmittedUnder (issue 21): N grows from 2 to 5 during the
// episode; what the fallback admitted under 5 tokens a bucket stays owed whole, not cut
// to the 2 tokens a bucket holds with 5 instances.
func TestDebtKeepsTheCapacityItWasAdmittedUnder(t *testing.T) {
	n := 2
	l, clock := unreachableRedisWith(t, Options{Region: "test", Instances: func() int { return n }})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.001}}
	decideN(t, l, r, 1)
	clock.Advance(time.Hour * 3) // 10.8 tokens at 0.001/s over 2: the 5 of a full bucket
	if got := decideN(t, l, r, 10); got != 5 {
		t.Fatalf("admitted %d with N = 2, want 5", got)
	}
	n = 5
	if d := l.fb.owed(bucketID{tenant: "t", route: "r"}, 100).total(); d != 5 {
		t.Fatalf("owed %d after N went from 2 to 5, want the 5 admitted", d)
	}
}

// TestRepaidCountsWhatLuaCharged (issue 14 item 6): the repaid counter counts what the
// script charged after its -capacity floor, and the rest is counted as written off. The
// shared bucket is already a whole capacity in debt; the fallback admits 10 while Redis
// is behind a black hole; the debt of 10 then sent charges nothing.
func TestRepaidCountsWhatLuaCharged(t *testing.T) {
	p := testenv.Redis(t)
	bh := startBlackHole(t, p.Addr())
	reg := prometheus.NewRegistry()
	clock := newFakeClock()
	l := newTestRedis(t, newClient(t, &testenv.Process{Host: "127.0.0.1", Port: bh.port()}), Options{
		Region: "test", Registerer: reg, Now: clock.Now, Timeout: 100 * time.Millisecond,
		Breaker: BreakerOptions{Failures: 1, FailureSpan: time.Millisecond, OpenFor: 200 * time.Millisecond},
	})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.00001}}
	drain := r
	drain.Cost = 10
	if d := mustDecide(t, l, drain); !d.Allowed { // now empty...
		t.Fatalf("draining take: %+v", d)
	}
	setDebt(t, l, r, 10) // ...and a whole capacity in debt
	repaidBefore := metricValue(t, reg, "ratelimit_fallback_repaid_tokens_total", nil)
	bh.set(true)
	openBreaker(t, l, clock)
	decideN(t, l, r, 1)
	clock.Advance(1e7 * time.Second) // the fallback bucket (the whole 10: N = 1) refills
	if n := decideN(t, l, r, 10); n != 10 {
		t.Fatalf("fallback admitted %d from a full bucket of 10, want 10", n)
	}
	bh.set(false)
	pollUntil(t, 5*time.Second, "redis answers again", func() bool {
		return mustDecide(t, l, r).Source == SourceRedis
	})
	repaid := metricValue(t, reg, "ratelimit_fallback_repaid_tokens_total", nil) - repaidBefore
	off := metricValue(t, reg, "ratelimit_fallback_debt_written_off_tokens_total", nil)
	if repaid != 0 || off != 10 {
		t.Fatalf("repaid %v, written off %v; want 0 charged (the bucket was at -capacity) and 10 written off", repaid, off)
	}
	if owed := metricValue(t, reg, "ratelimit_fallback_owed_tokens_total", nil); owed != 10 {
		t.Fatalf("owed %v, want the 10 tokens the fallback admitted", owed)
	}
}

// setDebt charges n tokens of debt to r's shared bucket, as a fallback's debt would be.
func setDebt(t *testing.T, l *Redis, r Request, n int64) {
	t.Helper()
	l.fb.debts.add(bucketID{tenant: r.Tenant, route: r.Route}, r.Limit, n)
	if d := mustDecide(t, l, r); d.Source != SourceRedis || d.Allowed {
		t.Fatalf("the call that charges the debt: %+v, want refused by redis", d)
	}
}

// TestFlushChargesDebtsAtShutdown (issue 21 item 2): a gateway that stops while its
// fallback owes charges its debts to Redis when Redis answers; when it does not, the
// tokens are counted as lost.
func TestFlushChargesDebtsAtShutdown(t *testing.T) {
	p := testenv.Redis(t)
	bh := startBlackHole(t, p.Addr())
	reg := prometheus.NewRegistry()
	clock := newFakeClock()
	l := newTestRedis(t, newClient(t, &testenv.Process{Host: "127.0.0.1", Port: bh.port()}), Options{
		Region: "test", Registerer: reg, Now: clock.Now, Timeout: 100 * time.Millisecond,
		Breaker: BreakerOptions{Failures: 1, FailureSpan: time.Millisecond, OpenFor: time.Hour},
	})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	a := Request{Tenant: "t", Route: "a", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.001}}
	v := Request{Tenant: "t", Route: "v", Limit: a.Limit, Value: "10.0.0.1", ValueLimit: regions.Limit{Capacity: 4, RefillPerSecond: 0.001}}
	bh.set(true)
	openBreaker(t, l, clock)
	decideN(t, l, a, 1)
	decideN(t, l, v, 1)
	clock.Advance(time.Hour * 3)
	if n := decideN(t, l, a, 20) + decideN(t, l, v, 20); n != 14 {
		t.Fatalf("fallback admitted %d, want 10 + 4", n)
	}
	fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	charged, lost := l.Flush(fctx) // Redis still unreachable
	cancel()
	if charged != 0 || lost != 18 { // a's 10; v's route bucket 4 and its value bucket 4
		t.Errorf("flush with Redis unreachable: charged %d, lost %d; want 0 and 18", charged, lost)
	}
	if v := metricValue(t, reg, "ratelimit_fallback_debt_lost_tokens_total", nil); v != float64(lost) || lost == 0 {
		t.Errorf("lost metric %v for %d tokens lost, want them equal and > 0", v, lost)
	}
	// Another limiter's debts, flushed with Redis answering.
	l2 := newTestRedis(t, newClient(t, p), Options{Region: "test2", Registerer: prometheus.NewRegistry(), Now: clock.Now})
	l2.fb.debts.add(bucketID{tenant: "t", route: "a"}, a.Limit, 6)
	if charged, lost := l2.Flush(ctx); charged != 6 || lost != 0 {
		t.Fatalf("flush with Redis answering: charged %d, lost %d; want 6 and 0", charged, lost)
	}
	if d := mustDecide(t, l2, Request{Tenant: "t", Route: "a", Limit: a.Limit, Cost: 5}); d.Allowed {
		t.Errorf("a cost of 5 after 6 of 10 were charged: %+v, want refused", d)
	}
}
