package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// settler is what both limiters offer.
type settler interface {
	Decide(context.Context, Request) (Decision, error)
	Settle(context.Context, Request, int64) error
}

func mustSettle(t testing.TB, l settler, r Request, delta int64) {
	t.Helper()
	if err := l.Settle(context.Background(), r, delta); err != nil {
		t.Fatalf("Settle(%+v, %d): %v", r, delta, err)
	}
}

// within reports whether d is in [want-slack, want].
func within(d, want, slack time.Duration) bool { return d <= want && d >= want-slack }

// settleDebt (issue 24 item 5): a request of estimate 1 admitted by a rule of 10 burst
// refilled 1/s, then settled +50, leaves its bucket 41 tokens in debt, not clipped at
// -10: one more request needs 42 s of refill (41 to pay the debt, 1 for its token).
// slack is what a real clock may have refilled between the calls.
func settleDebt(t *testing.T, l settler, slack time.Duration) Request {
	t.Helper()
	r := Request{Tenant: "settle", Route: "llm", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}}
	if d := mustDecide(t, l, r); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("the estimate: %+v, want admitted, 9 left", d)
	}
	mustSettle(t, l, r, 50)
	d := mustDecide(t, l, r)
	if d.Allowed || !within(d.RetryAfter, 42*time.Second, slack) || d.Remaining != 0 || !within(d.ResetAfter, 51*time.Second, slack) {
		t.Fatalf("after settling +50: %+v, want refused for 42 s (41 in debt, not clipped at -10), full in 51 s", d)
	}
	return r
}

// settleReturn: a settle of -1 right after a decision gives its token back; a return to
// a full bucket stays at its capacity.
func settleReturn(t *testing.T, l settler) {
	t.Helper()
	r := Request{Tenant: "settle", Route: "cheap", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.001}}
	if d := mustDecide(t, l, r); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("the estimate: %+v, want 9 left", d)
	}
	mustSettle(t, l, r, -1)
	if d := mustDecide(t, l, r); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("after settling -1: %+v, want the token back (9 left after one more)", d)
	}
	mustSettle(t, l, r, -5)
	if d := mustDecide(t, l, r); d.Remaining != 9 {
		t.Fatalf("after returning 5 to a bucket of 9: %+v, want it full at 10 (9 left after one more)", d)
	}
	mustSettle(t, l, r, 0) // nothing
	if d := mustDecide(t, l, r); d.Remaining != 8 {
		t.Fatalf("after settling 0: %+v, want 8 left", d)
	}
}

// settleBands: the difference is charged to every bucket of a request: the route's, each
// band's and the value's.
func settleBands(t *testing.T, l settler) {
	t.Helper()
	slow := func(c int64) regions.Limit { return regions.Limit{Capacity: c, RefillPerSecond: 0.001} }
	r := Request{Tenant: "settle", Route: "bands", Limit: slow(1000), Value: "client", ValueLimit: slow(500),
		Bands: []regions.BandLimit{{Name: "minute", Limit: slow(100)}, {Name: "hour", Limit: slow(50)}}}
	if d := mustDecide(t, l, r); !d.Allowed {
		t.Fatalf("the estimate: %+v", d)
	}
	mustSettle(t, l, r, 70) // 1 + 70 taken: the hour band (50) goes 21 into debt
	d := mustDecide(t, l, r)
	if d.Allowed {
		t.Fatalf("after settling +70: %+v, want refused by the hour band, 21 in debt", d)
	}
	want := map[string]int64{regions.PrimaryBand: 500 - 71, "minute": 100 - 71, "hour": 0}
	for _, b := range d.Bands {
		if b.Remaining != want[b.Name] {
			t.Errorf("band %s: %d left, want %d (%+v)", b.Name, b.Remaining, want[b.Name], d.Bands)
		}
	}
	// The hour band needs 22 tokens of refill at 0.001/s.
	if !within(d.RetryAfter, 22000*time.Second, time.Second) {
		t.Errorf("retry after %v, want 22000 s (the hour band 21 in debt)", d.RetryAfter)
	}
	// The route's bucket, alone (a request without bands nor value on it): 1000 - 71.
	plain := Request{Tenant: r.Tenant, Route: r.Route, Limit: r.Limit}
	if d := mustDecide(t, l, plain); d.Remaining != 1000-72 {
		t.Errorf("the route bucket: %+v, want %d left", d, 1000-72)
	}
}

func TestRedisSettle(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, rdb, Options{KeyPrefix: "st", Timeout: time.Second, Region: "test", Registerer: reg})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	settleDebt(t, l, 200*time.Millisecond)
	settleReturn(t, l)
	settleBands(t, l)
	// A return to a bucket that does not exist creates none (a missing bucket is full).
	gone := Request{Tenant: "settle", Route: "gone", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}}
	mustSettle(t, l, gone, -3)
	if n := rdb.Exists(context.Background(), l.keys.Bucket("settle", "gone")).Val(); n != 0 {
		t.Errorf("a return created a bucket")
	}
	// A sharded rule is settled on shard 0: 4 tokens of shard 0's 5 (the rule's 10 / 2).
	sharded := Request{Tenant: "settle", Route: "sharded", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.001}, Shards: 2}
	mustSettle(t, l, sharded, 4)
	o, err := lua.NewTokenBucket(rdb).Decide(context.Background(), lua.Decision{Op: lua.OpCharge, Buckets: []lua.Bucket{{Key: l.keys.Shard("settle", "sharded", 0), Capacity: 5, Refill: 0.0005, Cap: lua.NoCap}}})
	if err != nil || o[0].Buckets[0].Remaining != 1 {
		t.Errorf("shard 0 after settling 4: %+v %v, want 1 left of 5", o, err)
	}
	for dir, want := range map[string]float64{"charged": 50 + 70 + 4, "returned": 1 + 5 + 3} {
		if got := metricValue(t, reg, "ratelimit_settled_tokens_total", map[string]string{"direction": dir}); got != want {
			t.Errorf("ratelimit_settled_tokens_total{direction=%q} = %v, want %v", dir, got, want)
		}
	}
	// Bad input.
	for _, delta := range []int64{MaxSettle + 1, -MaxSettle - 1} {
		if err := l.Settle(context.Background(), gone, delta); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Settle %d: %v, want ErrInvalidRequest", delta, err)
		}
	}
	if err := l.Settle(context.Background(), Request{Tenant: "t", Route: "r"}, 1); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("Settle without a limit: %v, want ErrInvalidRequest", err)
	}
}

func TestLocalSettle(t *testing.T) {
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	l := newTestLocal(t, LocalOptions{Now: clock.Now, Region: "test", Registerer: reg})
	r := settleDebt(t, l, 0)
	// Exactly 42 s of refill: 41 s is not enough, 42 s is.
	clock.Advance(41 * time.Second)
	if d := mustDecide(t, l, r); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("41 s later: %+v, want refused for 1 s more", d)
	}
	clock.Advance(time.Second)
	if d := mustDecide(t, l, r); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("42 s later: %+v, want admitted", d)
	}
	settleReturn(t, l)
	settleBands(t, l)
	// The depth bound: a bucket refilled once in 1e9 s holds at most ~1.1 tokens of debt.
	deep := Request{Tenant: "settle", Route: "deep", Limit: regions.Limit{Capacity: 1, RefillPerSecond: 1e-9}}
	mustSettle(t, l, deep, 1000)
	d := mustDecide(t, l, deep)
	if max := time.Duration(lua.MaxDebtSeconds * float64(time.Second)); d.Allowed || d.ResetAfter > max || d.ResetAfter < max-time.Second {
		t.Errorf("settled 1000 at 1e-9/s: %+v, want it at the depth bound, full in %v", d, max)
	}
	for dir, want := range map[string]float64{"charged": 50 + 70 + 1000, "returned": 1 + 5} {
		if got := metricValue(t, reg, "ratelimit_settled_tokens_total", map[string]string{"direction": dir}); got != want {
			t.Errorf("ratelimit_settled_tokens_total{direction=%q} = %v, want %v", dir, got, want)
		}
	}
	if err := l.Settle(context.Background(), r, MaxSettle+1); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("Settle above MaxSettle: %v, want ErrInvalidRequest", err)
	}
}

// TestRedisSettleWhileDown: a settle Redis does not answer is recorded, and charged once
// by the first call that reaches Redis again: not lost, not twice. A return then is
// dropped.
func TestRedisSettleWhileDown(t *testing.T) {
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, newClient(t, p), Options{Region: "test", Registerer: reg, Timeout: 200 * time.Millisecond,
		Breaker: BreakerOptions{OpenFor: 100 * time.Millisecond}})
	// Refilled 0.01/s: the fallback earns no token during the outage, so it admits (and
	// owes) nothing.
	r := Request{Tenant: "settle", Route: "down", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.01}}
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := mustDecide(t, l, r); !d.Allowed || d.Source != SourceRedis {
		t.Fatalf("before the outage: %+v", d)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	mustSettle(t, l, r, 30) // Redis down: owed
	mustSettle(t, l, r, -5) // dropped
	for i := range 5 {      // the breaker opens; nothing is charged meanwhile
		if d := mustDecide(t, l, r); d.Source != SourceFallback || d.Allowed {
			t.Fatalf("decision %d with Redis dead: %+v, want the fallback's refusal", i, d)
		}
	}
	metric := func(dir string) float64 {
		return metricValue(t, reg, "ratelimit_settled_tokens_total", map[string]string{"direction": dir})
	}
	if metric("owed") < 30 || metric("dropped") != 5 || metric("charged") != 0 {
		t.Fatalf("settled owed %v, dropped %v, charged %v: want 30, 5, 0", metric("owed"), metric("dropped"), metric("charged"))
	}
	if err := p.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Redis came back empty: the bucket is a full 10, less the 30 owed = -20, so 21
	// tokens at 0.01/s before one more request: 2100 s (charged twice: 5100 s).
	var d Decision
	pollUntil(t, 10*time.Second, "a decision from redis after the restart", func() bool {
		d = mustDecide(t, l, r)
		return d.Source == SourceRedis
	})
	for i := range 2 {
		if d.Allowed || !within(d.RetryAfter, 2100*time.Second, 5*time.Second) {
			t.Fatalf("decision %d from redis after the outage: %+v, want refused for 2100 s (30 owed charged once)", i, d)
		}
		d = mustDecide(t, l, r)
	}
	if metric("charged") != 30 {
		t.Errorf("settled charged %v, want the 30 owed", metric("charged"))
	}
	if l.fb.unsettled.total() != 0 {
		t.Errorf("still owed: %d", l.fb.unsettled.total())
	}
}

// TestFlushSettles: Flush charges what settles owe too, with no floor at -capacity.
func TestFlushSettles(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	l := newTestRedis(t, rdb, Options{KeyPrefix: "fs", Timeout: time.Second})
	r := Request{Tenant: "settle", Route: "flush", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.001}}
	l.fb.unsettled.add(bucketID{tenant: r.Tenant, route: r.Route}, r.Limit, 25)
	if charged, lost := l.Flush(context.Background()); charged != 25 || lost != 0 {
		t.Fatalf("flush: charged %d, lost %d, want 25 and 0", charged, lost)
	}
	if d := mustDecide(t, l, r); d.Allowed || !within(d.RetryAfter, 16000*time.Second, time.Second) {
		t.Errorf("after the flush: %+v, want refused for 16000 s (15 in debt)", d)
	}
}
