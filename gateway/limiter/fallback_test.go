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

// TestFallbackKnowsWhatRedisAdmitted: while Redis is frozen, the fallback refuses a
// tenant Redis had already emptied (it does not start full), and what it admits is
// charged to the shared bucket once Redis answers again, into debt if need be, so the
// episode does not hand out a second allowance. Two instances (N = 2) on one Redis.
func TestFallbackKnowsWhatRedisAdmitted(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	reg := prometheus.NewRegistry()
	// One failure opens the breaker for a second: the decisions counted below are then
	// never sent. (A call sent to a paused Redis runs when it resumes, and the limiter
	// rightly does not count what the fallback admits for it as owed; that would make
	// the figures below depend on which calls were out.)
	opts := Options{
		Timeout: 50 * time.Millisecond, Breaker: BreakerOptions{Failures: 1, OpenFor: time.Second, FailureSpan: time.Nanosecond},
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
	// Refill slow enough that neither clock adds a token during the test.
	lim := regions.Limit{Capacity: 10, RefillPerSecond: 0.001}
	req := func(route string) Request { return Request{Tenant: "t", Route: route, Limit: lim} }
	keys := lua.Keys{}

	// "empty": b empties it through Redis. "some": a takes 5 of 10, b one more and sees
	// 4 left. "fresh": a empties it; b never asked Redis about it.
	for range 10 {
		mustDecide(t, b, req("empty"))
		mustDecide(t, a, req("fresh"))
	}
	for range 5 {
		mustDecide(t, a, req("some"))
	}
	if d := mustDecide(t, b, req("some")); !d.Allowed || d.Source != SourceRedis || d.Remaining != 4 {
		t.Fatalf("6th token of some: %+v, want allowed by redis with 4 left", d)
	}

	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Resume() })
	if d := mustDecide(t, b, req("trip")); d.Source != SourceFallback || !b.FallbackActive() {
		t.Fatalf("first decision with Redis frozen: %+v, breaker open %v; want a fallback decision and the breaker open", d, b.FallbackActive())
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
	if n := count("empty", 3); n != 0 {
		t.Errorf("fallback admitted %d on a rule Redis had emptied, want 0", n)
	}
	if n := count("some", 4); n != 2 {
		t.Errorf("fallback admitted %d on a rule with 4 tokens left, want 2 (b's half of them)", n)
	}
	if n := count("fresh", 8); n != 5 {
		t.Errorf("fallback admitted %d on a rule b had not seen, want 5 (its 1/2 of capacity 10)", n)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "redis decisions after resume", func() bool {
		return mustDecide(t, b, req("probe")).Source == SourceRedis
	})
	probes := metricValue(t, reg, "ratelimit_fallback_repaid_tokens_total", nil) // the probes' own debt

	// "some": the fallback's 2 tokens are charged, so Redis admits the 2 left of 4:
	// 10 admitted in all.
	for i, want := range []bool{true, true, false} {
		if d := mustDecide(t, b, req("some")); d.Allowed != want || d.Source != SourceRedis {
			t.Errorf("some after the episode, decision %d: %+v, want allowed %v by redis", i, d, want)
		}
	}
	// "fresh": a had emptied it, the fallback admitted 5 more: Redis holds 5 tokens of
	// debt and refuses until it has refilled them.
	if d := mustDecide(t, b, req("fresh")); d.Allowed || d.Source != SourceRedis {
		t.Errorf("fresh after the episode: %+v, want refused by redis", d)
	}
	if got, err := rdb.HGet(context.Background(), keys.Bucket("t", "fresh").Key, "tokens").Float64(); err != nil || got > -4.99 || got < -5 {
		t.Errorf("fresh's tokens in Redis = %v, %v; want -5 (the fallback's admissions, charged as debt)", got, err)
	}
	if v := metricValue(t, reg, "ratelimit_fallback_repaid_tokens_total", nil) - probes; v != 7 {
		t.Errorf("tokens repaid for some and fresh = %v, want 7", v)
	}
	// A debt is charged once.
	if d := mustDecide(t, b, req("some")); d.Allowed {
		t.Errorf("some, again: %+v, want refused", d)
	}
	if v := metricValue(t, reg, "ratelimit_fallback_repaid_tokens_total", nil) - probes; v != 7 {
		t.Errorf("tokens repaid for some and fresh = %v after more decisions, want still 7", v)
	}
}

// TestFallbackDebtIsWhatExceedsItsRefill: in an outage longer than a bucket's fill time
// the fallback's refill covers most of what it admits, which the shared bucket would
// have admitted for this instance anyway; only what the fallback bucket is short of full
// is charged. (Charging every admission would leave Redis a bucket of debt per instance
// after a long outage, refusing a tenant that kept to its limit.)
func TestFallbackDebtIsWhatExceedsItsRefill(t *testing.T) {
	p := testenv.Redis(t)
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, newClient(t, p), Options{
		Region: "test", Registerer: reg, Now: clock.Now, Timeout: time.Second,
		Breaker:   BreakerOptions{Failures: 1, OpenFor: time.Hour, FailureSpan: time.Nanosecond},
		Instances: func() int { return 2 },
	})
	// The fallback holds 5 tokens refilled at 0.5/s.
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
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
	if admitted < 14 || admitted > 16 { // 5 + 0.5/s x 20 s
		t.Errorf("fallback admitted %d in 20 s, want about 15", admitted)
	}
	// Take the debt as the next call to Redis would (TestFallbackKnowsWhatRedisAdmitted
	// shows that call charging it).
	debt := l.fb.owed(r, r.Limit)
	if debt < 4 || debt > 6 {
		t.Errorf("debt after a 20 s outage = %d, want what the 5-token fallback bucket is short of full (about 5), not the %d it admitted", debt, admitted)
	}
	if l.fb.owed(r, r.Limit) != 0 {
		t.Errorf("a debt taken once is still owed")
	}
}
