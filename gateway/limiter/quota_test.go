package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// quotaClock is a fake clock two seconds before the end of January 2027: in the future,
// as a counter's expiry must be (Redis expires it on its own clock: a gateway clock in
// the past would expire every counter at once).
func quotaClock() *fakeClock {
	c := newFakeClock()
	c.ns.Store(time.Date(2027, 1, 31, 23, 59, 58, 0, time.UTC).UnixNano())
	return c
}

// quotaRequest is a rule of 100/s burst 100 with a quota band "q" of budget per period,
// as a region of share enforces it at now with usage u.
func quotaRequest(route string, period regions.Period, now time.Time, budget int64, share float64, u regions.QuotaUsage) Request {
	rule := regions.Rule{Tenant: "t", Route: route, Capacity: 100, RefillPerSecond: 100, Shards: 1,
		Bands: []regions.Band{{Name: "q", Capacity: budget, Period: period}}}
	return Request{Tenant: "t", Route: route, Limit: regions.Limit{Capacity: 100, RefillPerSecond: 100},
		Bands: rule.ScaledBands(share, now, func(string, time.Time) regions.QuotaUsage { return u })}
}

// TestQuotaCrossesPeriod (#24): a monthly quota of 10 admits 10, then refuses until the
// month ends (Retry-After: the time to midnight on the 1st), and admits 10 again in the
// next month, whose counter is a new one. On Redis and on a Local, with a fake clock two
// seconds before the boundary (the counter's key is named by the period the gateway's
// clock is in; Redis's own clock does not enter).
func TestQuotaCrossesPeriod(t *testing.T) {
	clock := quotaClock()
	redisLim := func(t *testing.T) interface {
		Decide(context.Context, Request) (Decision, error)
	} {
		l := newTestRedis(t, newClient(t, testenv.Redis(t)), Options{Timeout: time.Second, Now: clock.Now})
		if err := l.Load(context.Background()); err != nil {
			t.Fatal(err)
		}
		return l
	}
	for name, l := range map[string]func(*testing.T) interface {
		Decide(context.Context, Request) (Decision, error)
	}{
		"redis": redisLim,
		"local": func(t *testing.T) interface {
			Decide(context.Context, Request) (Decision, error)
		} {
			return newTestLocal(t, LocalOptions{Now: clock.Now})
		},
	} {
		t.Run(name, func(t *testing.T) {
			clock.ns.Store(quotaClock().ns.Load())
			lim := l(t)
			r := quotaRequest("month", regions.PeriodMonth, clock.Now(), 10, 1, regions.QuotaUsage{})
			for i := range 10 {
				d := mustDecide(t, lim, r)
				if !d.Allowed || d.Bands[1].Remaining != int64(9-i) {
					t.Fatalf("request %d: %+v, want admitted with %d left of the quota", i+1, d, 9-i)
				}
				if name == "redis" && d.Bands[1].Used != int64(i+1) {
					t.Fatalf("request %d: the counter shows %d used, want %d", i+1, d.Bands[1].Used, i+1)
				}
			}
			d := mustDecide(t, lim, r)
			if d.Allowed || d.RetryAfter != 2*time.Second || d.Limit != 10 || d.Remaining != 0 || d.Bands[1].Name != "q" {
				t.Fatalf("11th request: %+v, want refused by the quota until the month ends, in 2 s", d)
			}
			clock.Advance(3 * time.Second) // 1 February
			r = quotaRequest("month", regions.PeriodMonth, clock.Now(), 10, 1, regions.QuotaUsage{})
			if want := time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC); !r.Bands[0].Quota.Start.Equal(want) {
				t.Fatalf("period starts %v, want %v", r.Bands[0].Quota.Start, want)
			}
			admitted := 0
			for range 11 {
				if mustDecide(t, lim, r).Allowed {
					admitted++
				}
			}
			if admitted != 10 {
				t.Errorf("in February: admitted %d of 11, want the new month's 10", admitted)
			}
		})
	}
}

// TestQuotaBoundaryRealClock (#24): an hourly quota on a real Redis with the gateway's
// clock set so that the hour ends two seconds from now: exhausted, refused with
// Retry-After of about 2 s, then admitted again once the clock has passed the boundary,
// on a new counter whose key expires an hour after its period (QuotaGrace).
func TestQuotaBoundaryRealClock(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	now0 := time.Now()
	band := regions.Band{Name: "q", Capacity: 5, Period: regions.PeriodHour}
	_, end := band.Window(now0)
	shift := end.Add(-2 * time.Second).Sub(now0)
	clock := func() time.Time { return time.Now().Add(shift) }
	l := newTestRedis(t, rdb, Options{Timeout: time.Second, Now: clock})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	r := quotaRequest("hour", regions.PeriodHour, clock(), 5, 1, regions.QuotaUsage{})
	if n := decideN(t, l, r, 5); n != 5 {
		t.Fatalf("admitted %d, want the hour's 5", n)
	}
	d := mustDecide(t, l, r)
	if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > 2*time.Second {
		t.Fatalf("6th request: %+v, want refused until the hour ends, within 2 s", d)
	}
	pollUntil(t, 5*time.Second, "the gateway's clock past the hour", func() bool { return !clock().Before(end) })
	r = quotaRequest("hour", regions.PeriodHour, clock(), 5, 1, regions.QuotaUsage{})
	if d := mustDecide(t, l, r); !d.Allowed || d.Bands[1].Used != 1 {
		t.Fatalf("first request of the next hour: %+v, want admitted on a new counter", d)
	}
	key := l.keys.Quota("t", "hour", "q", end.Unix())
	ttl, err := rdb.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Redis expires it on its own clock, from which the gateway's is shift apart.
	if want := time.Hour + QuotaGrace + shift; ttl > want || ttl < want-10*time.Second {
		t.Errorf("the new counter %s expires in %v, want about %v", key, ttl, want)
	}
}

// TestQuotaAllowanceAndFloor: a region's counter may reach its allowance, its usage plus
// its share of what the fleet has left (regions.Allowance), and holds at least the usage
// the store counted: a counter Redis lost comes back at that floor, not at zero.
func TestQuotaAllowanceAndFloor(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	clock := quotaClock()
	l := newTestRedis(t, rdb, Options{Timeout: time.Second, Now: clock.Now})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// 100 a month at share 0.5; this region has used 30 and the fleet 80: 30 + 10.
	r := quotaRequest("floor", regions.PeriodMonth, clock.Now(), 100, 0.5, regions.QuotaUsage{Mine: 30, Total: 80})
	if r.Bands[0].Limit.Capacity != 40 || r.Bands[0].Quota.Floor != 30 || r.Bands[0].Quota.Policy != 50 {
		t.Fatalf("quota band %+v %+v, want allowance 40, floor 30, policy 50", r.Bands[0], r.Bands[0].Quota)
	}
	r.Bands[0].Quota.Retry = 400 * time.Millisecond // the gateway's two syncs
	if n := decideN(t, l, r, 20); n != 10 {
		t.Fatalf("admitted %d, want 10 (from the floor of 30 to the allowance of 40)", n)
	}
	d := mustDecide(t, l, r)
	if d.Bands[1].Used != 40 || d.Bands[1].Remaining != 0 {
		t.Fatalf("after the allowance: %+v, want 40 used and none left", d.Bands[1])
	}
	// The fleet has 20 left, its share 10: the allowance grows at the next count.
	if d.RetryAfter != 400*time.Millisecond {
		t.Errorf("refused on the allowance with budget left: Retry-After %v, want the two syncs' 400ms", d.RetryAfter)
	}
	// The store has counted the 40 (and the fleet 90); Redis loses the counter.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	r = quotaRequest("floor", regions.PeriodMonth, clock.Now(), 100, 0.5, regions.QuotaUsage{Mine: 40, Total: 90})
	if n := decideN(t, l, r, 20); n != 5 {
		t.Errorf("after Redis lost the counter: admitted %d, want 5 (from the floor of 40 to 40 + 0.5 x 10)", n)
	}
	// Nothing left for the fleet: refused without a call, Retry-After to the month's end.
	r = quotaRequest("floor", regions.PeriodMonth, clock.Now(), 100, 0.5, regions.QuotaUsage{Mine: 45, Total: 100})
	r.Bands[0].Quota.Retry = 400 * time.Millisecond // nothing to grow into: not used
	d = mustDecide(t, l, r)
	if end := r.Bands[0].Quota.End; d.Allowed || d.RetryAfter != end.Sub(clock.Now()) {
		t.Errorf("with the budget spent: %+v, want refused until %v", d, end)
	}
}

// TestQuotaFallback: while Redis does not answer each of N gateways may take 1/N of what
// is left of the region's allowance above its floor, and owes it: the counter is
// charged once Redis answers again.
func TestQuotaFallback(t *testing.T) {
	p := testenv.Redis(t)
	bh := startBlackHole(t, p.Addr())
	clock := quotaClock()
	clock.Advance(-15 * 24 * time.Hour) // mid-month
	l := newTestRedis(t, newClient(t, &testenv.Process{Host: "127.0.0.1", Port: bh.port()}), Options{
		Region: "test", Now: clock.Now, Timeout: 100 * time.Millisecond, Instances: func() int { return 2 },
		Breaker: BreakerOptions{Failures: 1, FailureSpan: time.Millisecond, OpenFor: 200 * time.Millisecond},
	})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// Allowance 40 (30 used + 0.5 x 20), floor 30: 10 left for the region, 5 per gateway.
	r := quotaRequest("fb", regions.PeriodMonth, clock.Now(), 100, 0.5, regions.QuotaUsage{Mine: 30, Total: 80})
	bh.set(true)
	openBreaker(t, l, clock)
	if d := mustDecide(t, l, r); d.Allowed || d.Source != SourceFallback {
		t.Fatalf("at the start of the episode: %+v, want the fallback's refusal (its rate bucket starts empty)", d)
	}
	clock.Advance(10 * time.Second) // the rate bucket fills (50 of 100); the quota has no refill
	if n := decideN(t, l, r, 20); n != 5 {
		t.Fatalf("the fallback admitted %d, want 5 (half of the 10 left)", n)
	}
	d := mustDecide(t, l, r)
	if d.Allowed || d.Source != SourceFallback || d.RetryAfter != r.Bands[0].Quota.End.Sub(clock.Now()) {
		t.Fatalf("after 5: %+v, want refused by the fallback's part of the quota until the month ends", d)
	}
	bh.set(false)
	pollUntil(t, 5*time.Second, "redis answers again", func() bool {
		d = mustDecide(t, l, r)
		return d.Source == SourceRedis
	})
	// The floor of 30, the fallback's 5 owed and charged with this call, and this one.
	if !d.Allowed || d.Bands[1].Used != 36 {
		t.Errorf("first decision from redis: %+v, want admitted with 36 used (floor, debts, this one)", d.Bands[1])
	}
}

// TestQuotaDebtsReachASpentCounter (F4 of the attack): what the fallback admitted on a
// quota is charged to its counter even when the quota is spent by the time Redis answers
// again (refused without a decision in Redis: a charge still goes), so the region's usage
// counts it.
func TestQuotaDebtsReachASpentCounter(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	bh := startBlackHole(t, p.Addr())
	clock := quotaClock()
	clock.Advance(-15 * 24 * time.Hour)
	l := newTestRedis(t, newClient(t, &testenv.Process{Host: "127.0.0.1", Port: bh.port()}), Options{
		Region: "test", Now: clock.Now, Timeout: 100 * time.Millisecond, Instances: func() int { return 2 },
		Breaker: BreakerOptions{Failures: 1, FailureSpan: time.Millisecond, OpenFor: 200 * time.Millisecond},
	})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	r := quotaRequest("spent", regions.PeriodMonth, clock.Now(), 100, 0.5, regions.QuotaUsage{Mine: 30, Total: 80})
	bh.set(true)
	openBreaker(t, l, clock)
	mustDecide(t, l, r) // the episode's rate bucket starts empty
	clock.Advance(10 * time.Second)
	if n := decideN(t, l, r, 20); n != 5 {
		t.Fatalf("the fallback admitted %d, want 5", n)
	}
	bh.set(false)
	// Meanwhile the other region spent the rest: nothing is left, the quota refuses.
	spent := quotaRequest("spent", regions.PeriodMonth, clock.Now(), 100, 0.5, regions.QuotaUsage{Mine: 30, Total: 100})
	key := l.keys.Quota("t", "spent", "q", spent.Bands[0].Quota.Start.Unix())
	pollUntil(t, 5*time.Second, "the fallback's 5 charged to the counter", func() bool {
		clock.Advance(200 * time.Millisecond)
		if d := mustDecide(t, l, spent); d.Allowed {
			t.Fatalf("a spent quota admitted: %+v", d)
		}
		v, _ := rdb.Get(ctx, key).Int64()
		return v == 35 // the floor of 30 and the 5 owed
	})
}
