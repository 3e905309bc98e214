package limiter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// unreachableRedis is a limiter whose Redis closes every connection at once (so every
// call fails fast, without go-redis's background redial), with a frozen clock (no
// refill) and n instances: every decision comes from the fallback.
func unreachableRedis(t *testing.T, n int, reg prometheus.Registerer) *Redis {
	t.Helper()
	return unreachableRedisWith(t, Options{Region: "test", Registerer: reg, Instances: func() int { return n }})
}

// unreachableRedisWith is unreachableRedis with opts (its Now, Timeout and breaker are
// set here).
func unreachableRedisWith(t *testing.T, opts Options) *Redis {
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
	opts.Now, opts.Timeout, opts.Breaker = clock.Now, time.Second, BreakerOptions{Failures: 1 << 30}
	return newTestRedis(t, rdb, opts)
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
		l := unreachableRedis(t, int(tt.n), reg)
		r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: tt.capacity, RefillPerSecond: 1}}
		got := int64(decideN(t, l, r, 100))
		if got != tt.want {
			t.Errorf("capacity %d over %d instances: a fallback bucket admitted %d, want floor = %d", tt.capacity, tt.n, got, tt.want)
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
	l := unreachableRedis(t, 4, reg)
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 100, RefillPerSecond: 1}, Cost: 50}
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
	if d := mustDecide(t, l, r); !d.Allowed {
		t.Errorf("cost 25 = the fallback bucket: %+v, want allowed", d)
	}
}

// TestRepaidCountsWhatLuaCharged (issue 14 item 6): the repaid counter counts what the
// script charged after its -capacity floor, and the rest is counted as written off.
// The shared bucket is already a whole capacity in debt; the fallback admits 10 while
// Redis is behind a black hole; the debt of 10 then sent charges nothing.
func TestRepaidCountsWhatLuaCharged(t *testing.T) {
	p := testenv.Redis(t)
	bh := startBlackHole(t, p.Addr())
	reg := prometheus.NewRegistry()
	clock := newFakeClock()
	l := newTestRedis(t, newClient(t, &testenv.Process{Host: "127.0.0.1", Port: bh.port()}), Options{
		Region: "test", Registerer: reg, Now: clock.Now, Timeout: 100 * time.Millisecond, Breaker: BreakerOptions{Failures: 1 << 30},
	})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.00001}}
	rdb := newClient(t, p)
	key := l.keys.Bucket("t", "r")
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, key.Key, "tokens", -10, "ts", tm.UnixMicro(), "c", 10, "r", 0.00001).Err(); err != nil {
		t.Fatal(err)
	}
	bh.set(true)
	if n := decideN(t, l, r, 10); n != 10 {
		t.Fatalf("fallback admitted %d with an unknown (full) fallback bucket of 10, want 10", n)
	}
	bh.set(false)
	pollUntil(t, 5*time.Second, "redis answers again", func() bool {
		return mustDecide(t, l, r).Source == SourceRedis
	})
	repaid := metricValue(t, reg, "ratelimit_fallback_repaid_tokens_total", nil)
	off := metricValue(t, reg, "ratelimit_fallback_debt_written_off_tokens_total", nil)
	if repaid != 0 || off != 10 {
		t.Fatalf("repaid %v, written off %v; want 0 charged (the bucket was at -capacity) and 10 written off", repaid, off)
	}
	if owed := metricValue(t, reg, "ratelimit_fallback_owed_tokens_total", nil); owed != 10 {
		t.Fatalf("owed %v, want the 10 tokens the fallback admitted", owed)
	}
}

// TestDroppedDebtIsCounted (issue 14 item 6): the one path that still drops a debt, a
// fallback bucket evicted past MaxFallbackBuckets while it owes, counts what it dropped.
func TestDroppedDebtIsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := unreachableRedisWith(t, Options{Region: "test", Registerer: reg, MaxFallbackBuckets: 64}) // one bucket a shard
	for i := range 1000 {
		r := Request{Tenant: "t", Route: fmt.Sprintf("r%d", i), Limit: regions.Limit{Capacity: 5, RefillPerSecond: 0.001}}
		if !mustDecide(t, l, r).Allowed {
			t.Fatalf("first request of %s rejected", r.Route)
		}
	}
	kept := 0
	for i := range 1000 {
		r := Request{Tenant: "t", Route: fmt.Sprintf("r%d", i), Limit: regions.Limit{Capacity: 5, RefillPerSecond: 0.001}}
		kept += int(l.fb.owed(r, r.Limit))
	}
	dropped := metricValue(t, reg, "ratelimit_fallback_debt_dropped_tokens_total", nil)
	if dropped == 0 || int(dropped)+kept != 1000 {
		t.Fatalf("dropped %v + still owed %d, want 1000 tokens of debt in all, some dropped", dropped, kept)
	}
	if owed := metricValue(t, reg, "ratelimit_fallback_owed_tokens_total", nil); owed != 1000 {
		t.Fatalf("ratelimit_fallback_owed_tokens_total %v, want the 1000 tokens the fallback admitted", owed)
	}
}

// TestFallbackAfterRaiseStartsFromTheChange: the torture checker's find. A cost-5 route
// in a region at 2 tokens over 2 instances: every request is refused before Redis is
// asked (no bucket of 2 can hold 5), so the fallback holds nothing for the key, and a
// missing bucket reads as full. The share is then raised to 12 tokens while Redis
// cannot be reached: the missing bucket used to read as full at the new size, 6, and
// each instance admitted a cost-5 request, 10 tokens where Redis held 2. With the
// change's time (Options.ChangedAt) it starts from what refilled since.
func TestFallbackAfterRaiseStartsFromTheChange(t *testing.T) {
	p := testenv.Redis(t)
	bh := startBlackHole(t, p.Addr())
	clock := newFakeClock()
	changed := map[string]time.Time{} // tenant -> when a raise was seen (Options.ChangedAt)
	l := newTestRedis(t, newClient(t, &testenv.Process{Host: "127.0.0.1", Port: bh.port()}), Options{
		Region: "test", Now: clock.Now, Timeout: 100 * time.Millisecond, Breaker: BreakerOptions{Failures: 1 << 30},
		Instances: func() int { return 2 },
		ChangedAt: func(tenant string) time.Time { return changed[tenant] },
	})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 2, RefillPerSecond: 0.05}, Cost: 5}
	if _, err := l.Decide(ctx, r); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("cost 5 against a capacity of 2: %v, want ErrInvalidRequest", err)
	}
	bh.set(true)
	r.Limit, changed["t"] = regions.Limit{Capacity: 12, RefillPerSecond: 0.29}, clock.Now()
	clock.Advance(time.Second)
	if d := mustDecide(t, l, r); d.Source != SourceFallback || d.Allowed {
		t.Fatalf("a cost-5 request 1 s after a raise to 12 tokens (6 per instance, 0.145/s): %+v; want the fallback to refuse it", d)
	}
	clock.Advance(40 * time.Second) // 5.8 tokens have refilled since the change
	if d := mustDecide(t, l, r); !d.Allowed {
		t.Fatalf("a cost-5 request 41 s after the raise: %+v; want it admitted", d)
	}
	r.Tenant = "u" // a tenant whose limits did not change: full, as before
	if d := mustDecide(t, l, r); !d.Allowed {
		t.Fatalf("a cost-5 request of an unchanged tenant: %+v; want it admitted from a full bucket", d)
	}
}
