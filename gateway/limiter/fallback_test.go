package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// TestFallbackTrustsNoAnswer (issue 21 item 2): while Redis is frozen the fallback
// admits nothing it has not earned since the episode began, whatever Redis last said
// (an answer from a while ago, made before other gateways emptied the bucket, is exactly
// what let 29 to 32 through where the bound was 20); and what it admits is charged to
// the shared bucket once Redis answers again, into debt if need be. Two instances (N =
// 2) on one Redis, a fake clock for the fallback.
func TestFallbackTrustsNoAnswer(t *testing.T) {
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	clock := newFakeClock()
	// One failure opens the breaker for a second: the decisions counted below are then
	// never sent (a call sent to a paused Redis runs when it resumes).
	opts := Options{
		Now: clock.Now, Timeout: 50 * time.Millisecond,
		Breaker:   BreakerOptions{Failures: 1, OpenFor: time.Second, FailureSpan: time.Nanosecond},
		Instances: func() int { return 2 },
	}
	a := newTestRedis(t, newClient(t, p), opts)
	opts.Region, opts.Registerer = "test", reg
	b := newTestRedis(t, newClient(t, p), opts)
	for _, l := range []*Redis{a, b} {
		if err := l.Load(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	lim := regions.Limit{Capacity: 10, RefillPerSecond: 0.1} // 0.05/s for each fallback bucket
	req := func(route string) Request { return Request{Tenant: "t", Route: route, Limit: lim} }

	// "old": b saw it full long ago, then a emptied it. "fresh": b just saw it with 10.
	mustDecide(t, b, req("old"))
	for range 9 {
		mustDecide(t, a, req("old"))
	}
	mustDecide(t, b, req("fresh"))

	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Resume() })
	for range 3 {
		if mustDecide(t, b, req("trip")); b.FallbackActive() {
			break
		}
		clock.Advance(time.Millisecond)
	}
	if !b.FallbackActive() {
		t.Fatal("the breaker did not open with Redis frozen")
	}
	count := func(route string, n int) (admitted int) {
		t.Helper()
		for range n {
			d := mustDecide(t, b, req(route))
			if d.Source != SourceFallback {
				t.Fatalf("%s with Redis frozen: %+v, want a fallback decision", route, d)
			}
			if d.Allowed {
				admitted++
			}
		}
		return admitted
	}
	if n := count("old", 5) + count("fresh", 5); n != 0 {
		t.Errorf("fallback admitted %d at the start of the episode, want 0: it trusts no answer", n)
	}
	clock.Advance(40 * time.Second) // 2 tokens each at 0.05/s
	if n := count("old", 5); n != 2 {
		t.Errorf("fallback admitted %d on old after 40 s, want 2 (its refill share)", n)
	}
	if n := count("fresh", 5); n != 2 {
		t.Errorf("fallback admitted %d on fresh after 40 s, want 2", n)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "redis decisions after resume", func() bool {
		return mustDecide(t, b, req("probe")).Source == SourceRedis
	})
	// Redis refilled only what real time gave it (a second or so at 0.1/s); the next
	// call of each charges the fallback's 2: "old" is then at about -2 and refuses,
	// "fresh" admits from its 9 - 2 and keeps about 6.
	if d := mustDecide(t, b, req("old")); d.Allowed || d.Source != SourceRedis {
		t.Errorf("old after the episode: %+v, want refused by redis (in debt)", d)
	}
	if d := mustDecide(t, b, req("fresh")); !d.Allowed || d.Source != SourceRedis {
		t.Errorf("fresh after the episode: %+v, want admitted by redis", d)
	}
	tb := lua.NewTokenBucket(newClient(t, p))
	for route, want := range map[string]float64{"old": -2, "fresh": 6} {
		st, err := tb.Inspect(context.Background(), lua.Keys{}.Bucket("t", route), lim.Capacity, lim.RefillPerSecond, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.Tokens < want-0.1 || st.Tokens > want+1 {
			t.Errorf("%s holds %v tokens after the episode, want about %v (the fallback's 2 charged)", route, st.Tokens, want)
		}
	}
	if v := metricValue(t, reg, "ratelimit_fallback_repaid_tokens_total", nil); v < 4 {
		t.Errorf("repaid %v, want the 4 tokens the fallback admitted", v)
	}
}

// TestFallbackDebtIsWhatExceedsItsRefill: in an outage longer than a bucket's fill time
// the fallback's refill covers most of what it admits, which the shared bucket would
// have admitted for this instance anyway; only what the fallback bucket is short of full
// is charged. (Charging every admission would leave Redis a bucket of debt per instance
// after a long outage, refusing a tenant that kept to its limit.)
func TestFallbackDebtIsWhatExceedsItsRefill(t *testing.T) {
	n := 2
	l, clock := unreachableRedisWith(t, Options{Region: "test", Instances: func() int { return n }})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}} // 5 tokens at 0.5/s
	admitted := 0
	for range 40 { // 20 s of fake time, two requests a second: more than it may admit
		for range 2 {
			d := mustDecide(t, l, r)
			if d.Source != SourceFallback {
				t.Fatalf("Redis down: %+v, want a fallback decision", d)
			}
			if d.Allowed {
				admitted++
			}
		}
		clock.Advance(500 * time.Millisecond)
	}
	if admitted < 9 || admitted > 10 { // 0.5/s x 20 s, from empty
		t.Errorf("fallback admitted %d in 20 s, want about 10", admitted)
	}
	clock.Advance(2 * time.Second) // the bucket refills 1 of its 5
	owing := l.fb.owing()          // what ratelimit_fallback_debt_tokens shows, the episode in progress included
	debt := l.fb.owed(bucketID{tenant: "t", route: "r"}, 100).total()
	if owing != debt {
		t.Errorf("the fallback says it owes %d while an outage is in progress, and a charge takes %d", owing, debt)
	}
	if debt < 3 || debt > 5 {
		t.Errorf("debt after a 20 s outage = %d, want what the 5-token fallback bucket is short of full (about 4), not the %d it admitted", debt, admitted)
	}
	if l.fb.owed(bucketID{tenant: "t", route: "r"}, 100).total() != 0 {
		t.Errorf("a debt taken once is still owed")
	}
}
