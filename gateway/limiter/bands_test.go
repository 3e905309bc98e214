package limiter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// proRequest is issue #24's plan in small: 2/s burst 4, and 10 per minute.
func proRequest(route string) Request {
	return Request{Tenant: "t", Route: route, Limit: regions.Limit{Capacity: 4, RefillPerSecond: 2},
		Bands: []regions.BandLimit{{Name: "minute", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 10.0 / 60}}}}
}

// checkBurstRefusal checks the decision after the burst of 4: refused by the rate band
// (its limit on top, Retry-After about 0.5 s), the minute band at 6.
func checkBurstRefusal(t *testing.T, name string, d Decision, minRetry time.Duration) {
	t.Helper()
	if d.Allowed || d.Limit != 4 || d.RefillPerSecond != 2 || d.RetryAfter < minRetry || d.RetryAfter > 500*time.Millisecond {
		t.Errorf("%s: 5th request: %+v, want refused by the rate band (limit 4) with Retry-After about 0.5 s", name, d)
	}
	if len(d.Bands) != 2 || d.Bands[0].Name != regions.PrimaryBand || d.Bands[0].Limit != 4 || d.Bands[0].Remaining != 0 ||
		d.Bands[1].Name != "minute" || d.Bands[1].Limit != 10 || d.Bands[1].Remaining != 6 {
		t.Errorf("%s: 5th request's bands %+v, want rate 4 with 0 left and minute 10 with 6 left", name, d.Bands)
	}
}

// checkMinuteRefusal checks the refusal once the minute band binds (the rate band
// then holding a token when rateToken).
func checkMinuteRefusal(t *testing.T, name string, d Decision, lo, hi time.Duration, rateToken bool) {
	t.Helper()
	if d.Allowed || d.Limit != 10 || d.Remaining != 0 || d.RetryAfter < lo || d.RetryAfter > hi {
		t.Errorf("%s: refusal after 10: %+v, want refused by the minute band (limit 10) with Retry-After in [%v, %v]", name, d, lo, hi)
	}
	if len(d.Bands) != 2 || d.Bands[1].Remaining != 0 || (rateToken && d.Bands[0].Remaining < 1) {
		t.Errorf("%s: bands %+v, want the minute band empty (and the rate band with a token: %v)", name, d.Bands, rateToken)
	}
}

// TestBandsBurstThenMinute (#24): with a rule of 2/s burst 4 and a band of 10 per minute,
// the burst binds first (4 at once, then Retry-After 0.5 s from the rate band), then,
// as the rate band refills, the minute band: 10 admitted within 3 s, then refused with
// the minute band's Retry-After. In Redis (real time: Redis TIME is the clock) and in a
// Local limiter (a fake clock, over the whole first minute).
func TestBandsBurstThenMinute(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		p := testenv.Redis(t)
		l := newTestRedis(t, newClient(t, p), Options{Timeout: time.Second})
		if err := l.Load(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := proRequest("r")
		if n := decideN(t, l, r, 4); n != 4 {
			t.Fatalf("burst: admitted %d, want 4", n)
		}
		d := mustDecide(t, l, r)
		checkBurstRefusal(t, "redis", d, 300*time.Millisecond)
		admitted := 4
		deadline := time.Now().Add(10 * time.Second)
		for {
			if time.Now().After(deadline) {
				t.Fatalf("the minute band never refused; admitted %d", admitted)
			}
			// Waiting for Redis's own clock to refill the rate band: nothing to inject.
			time.Sleep(d.RetryAfter)
			if d = mustDecide(t, l, r); d.Source != SourceRedis {
				t.Fatalf("decision %+v, want one from redis", d)
			}
			if d.Allowed {
				admitted++
				continue
			}
			if d.Limit == 10 {
				break
			}
		}
		if admitted != 10 {
			t.Errorf("admitted %d before the minute band refused, want 10", admitted)
		}
		// Asked at once after the 10th, as the 10th refilled half a token: about 3 s.
		checkMinuteRefusal(t, "redis", d, time.Second, 3100*time.Millisecond, false)
	})
	t.Run("local", func(t *testing.T) {
		clock := newFakeClock()
		l := newTestLocal(t, LocalOptions{Now: clock.Now})
		r := proRequest("r")
		for i := range 4 {
			if d := mustDecide(t, l, r); !d.Allowed || d.Source != SourceLocal {
				t.Fatalf("burst request %d: %+v, want admitted", i+1, d)
			}
		}
		checkBurstRefusal(t, "local", mustDecide(t, l, r), 500*time.Millisecond)
		admitted := 4
		var first Decision                  // the first refusal by the minute band
		for step := 1; step < 120; step++ { // every 0.5 s up to 59.5 s
			clock.Advance(500 * time.Millisecond)
			d := mustDecide(t, l, r)
			switch {
			case d.Allowed:
				admitted++
				if admitted == 10 && step != 6 {
					t.Errorf("the 10th admitted at %v, want at 3 s (one per rate refill)", time.Duration(step)*500*time.Millisecond)
				}
			case first.Limit == 0:
				first = d
				if step != 7 {
					t.Errorf("the minute band first refused at %v, want 3.5 s", time.Duration(step)*500*time.Millisecond)
				}
			}
		}
		// At 3.5 s the minute band holds 7/12 of a token: 2.5 s more to the next one.
		checkMinuteRefusal(t, "local", first, 2500*time.Millisecond, 2500*time.Millisecond+time.Microsecond, true)
		if admitted != 19 { // 10 at once, then the band's refill: 59.5 s x 10/60
			t.Errorf("admitted %d in the first minute, want 19 (the 10 of the band and its refill)", admitted)
		}
	})
}

// TestBandsOneScriptCall: a request with bands (and a value) is one script call, on the
// route's, each band's and the value's key; Bands[0] folds the value in as the top-level
// fields of a request without bands do. A request without bands has no Bands.
func TestBandsOneScriptCall(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	l := newTestRedis(t, rdb, Options{Timeout: time.Second})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	r := proRequest("r")
	r.Bands = append(r.Bands, regions.BandLimit{Name: "hour", Limit: regions.Limit{Capacity: 100, RefillPerSecond: 100.0 / 3600}})
	r.Value, r.ValueLimit = "198.51.100.1", regions.Limit{Capacity: 3, RefillPerSecond: 0.001}
	before := scriptCalls(t, rdb)
	const n = 5
	admitted := decideN(t, l, r, n)
	if calls := scriptCalls(t, rdb) - before; calls != n {
		t.Errorf("%d decisions with 2 bands and a value made %d script calls, want %d", n, calls, n)
	}
	if admitted != 3 {
		t.Errorf("admitted %d, want the value's 3", admitted)
	}
	k := lua.Keys{}
	for _, key := range []string{k.Bucket("t", "r"), k.Band("t", "r", "minute"), k.Band("t", "r", "hour"), k.Value("t", "r", r.Value)} {
		if ok, err := rdb.Exists(ctx, key).Result(); err != nil || ok != 1 {
			t.Errorf("key %s: exists %d, %v; want it written", key, ok, err)
		}
	}
	d := mustDecide(t, l, r)
	if d.Allowed || len(d.Bands) != 3 || d.Bands[0].Limit != 3 || d.Bands[0].Remaining != 0 ||
		d.Bands[1].Remaining != 7 || d.Bands[2].Name != "hour" || d.Bands[2].Remaining != 97 {
		t.Errorf("after the value's 3: %+v, want refused, rate folded with the value's (3, 0 left), minute 7 left, hour 97", d)
	}
	if d.Limit != 3 || d.RetryAfter < 900*time.Second {
		t.Errorf("top-level %+v, want the value's bucket, which refuses longest (1000 s)", d)
	}
	if d := mustDecide(t, l, Request{Tenant: "t", Route: "plain", Limit: r.Limit}); d.Bands != nil {
		t.Errorf("a request without bands: Bands %+v, want nil", d.Bands)
	}
}

// TestBandsFallbackAndDebts: the fallback keeps a bucket per band (1/N each) and refuses
// when either band is empty; what it admitted is charged to each band's own key once
// Redis answers, and a flush at shutdown charges a band's debt to its key too.
func TestBandsFallbackAndDebts(t *testing.T) {
	p := testenv.Redis(t)
	bh := startBlackHole(t, p.Addr())
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, newClient(t, &testenv.Process{Host: "127.0.0.1", Port: bh.port()}), Options{
		Region: "test", Registerer: reg, Now: clock.Now, Timeout: 100 * time.Millisecond,
		Breaker: BreakerOptions{Failures: 1, FailureSpan: time.Millisecond, OpenFor: 200 * time.Millisecond},
	})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	slow := func(c int64) regions.Limit { return regions.Limit{Capacity: c, RefillPerSecond: 0.00001} }
	req := func(route string, hour, day int64) Request {
		return Request{Tenant: "t", Route: route, Limit: slow(10),
			Bands: []regions.BandLimit{{Name: "hour", Limit: slow(hour)}, {Name: "day", Limit: slow(day)}}}
	}
	a, b := req("a", 3, 5), req("b", 5, 2) // a's hour band binds, b's day band
	bh.set(true)
	openBreaker(t, l, clock)
	for _, r := range []Request{a, b} {
		d := mustDecide(t, l, r) // the fallback buckets start empty...
		if d.Allowed || d.Source != SourceFallback || len(d.Bands) != 3 {
			t.Fatalf("%s at the start of the episode: %+v, want refused by the fallback with 3 bands", r.Route, d)
		}
	}
	clock.Advance(1e7 * time.Second) // ...and fill (N = 1: the whole rule)
	for _, tt := range []struct {
		r    Request
		want int
		band string
	}{{a, 3, "hour"}, {b, 2, "day"}} {
		if n := decideN(t, l, tt.r, 10); n != tt.want {
			t.Errorf("fallback admitted %d on %s, want %d (its %s band)", n, tt.r.Route, tt.want, tt.band)
		}
		d := mustDecide(t, l, tt.r)
		if d.Allowed || d.Source != SourceFallback || d.Limit != int64(tt.want) {
			t.Errorf("%s after %d: %+v, want refused by the fallback's %s band (limit %d)", tt.r.Route, tt.want, d, tt.band, tt.want)
		}
	}
	bh.set(false)
	pollUntil(t, 5*time.Second, "redis answers again", func() bool {
		return mustDecide(t, l, a).Source == SourceRedis
	})
	if d := mustDecide(t, l, b); d.Source != SourceRedis || d.Allowed {
		t.Errorf("b after the episode: %+v, want refused by redis (its day band charged 2 of 2)", d)
	}
	tb := lua.NewTokenBucket(newClient(t, p))
	k := lua.Keys{}
	for _, tt := range []struct {
		key  string
		lim  regions.Limit
		want float64
	}{
		{k.Bucket("t", "a"), slow(10), 7}, {k.Band("t", "a", "hour"), slow(3), 0}, {k.Band("t", "a", "day"), slow(5), 2},
		{k.Bucket("t", "b"), slow(10), 8}, {k.Band("t", "b", "hour"), slow(5), 3}, {k.Band("t", "b", "day"), slow(2), 0},
	} {
		st, err := tb.Inspect(ctx, tt.key, tt.lim.Capacity, tt.lim.RefillPerSecond, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.Tokens < tt.want-0.01 || st.Tokens > tt.want+0.01 {
			t.Errorf("%s holds %v tokens after the episode, want %v (the fallback's admissions charged to it)", tt.key, st.Tokens, tt.want)
		}
	}
	if owing := l.fb.owing(); owing != 0 {
		t.Errorf("the fallback still owes %d after both routes were charged", owing)
	}
	// Owed once for each bucket a token went to, as each is repaid: 3 and 2 admitted, on
	// three buckets each, 15 owed; every one repaid or written off, none twice.
	owed, repaid, off := metricValue(t, reg, "ratelimit_fallback_owed_tokens_total", nil),
		metricValue(t, reg, "ratelimit_fallback_repaid_tokens_total", nil),
		metricValue(t, reg, "ratelimit_fallback_debt_written_off_tokens_total", nil)
	if owed != 15 || repaid+off != owed {
		t.Errorf("owed %v, repaid %v, written off %v: want 15 owed, all of it repaid or written off", owed, repaid, off)
	}

	l2 := newTestRedis(t, newClient(t, p), Options{Region: "test2", Registerer: prometheus.NewRegistry(), Now: clock.Now})
	l2.fb.debts.add(bucketID{tenant: "t", route: "f", band: "hour"}, slow(4), 3)
	if charged, lost := l2.Flush(ctx); charged != 3 || lost != 0 {
		t.Fatalf("flush of a band's debt: charged %d, lost %d; want 3 and 0", charged, lost)
	}
	if st, err := tb.Inspect(ctx, k.Band("t", "f", "hour"), 4, 0.00001, 0); err != nil || st.Tokens < 0.99 || st.Tokens > 1.01 {
		t.Errorf("the band's key after the flush: %+v, %v; want 1 token left of 4", st, err)
	}
}

// TestBandsInvalid: a cost above a band's capacity, and bands no bucket can answer, are
// ErrInvalidRequest for both limiters.
func TestBandsInvalid(t *testing.T) {
	p := testenv.Redis(t)
	rl := newTestRedis(t, newClient(t, p), Options{Timeout: time.Second})
	loc := newTestLocal(t, LocalOptions{Now: newFakeClock().Now})
	band := func(name string, c int64, r float64) regions.BandLimit {
		return regions.BandLimit{Name: name, Limit: regions.Limit{Capacity: c, RefillPerSecond: r}}
	}
	nine := make([]regions.BandLimit, regions.MaxBands+1)
	for i := range nine {
		nine[i] = band("b"+string(rune('a'+i)), 10, 1)
	}
	tests := []struct {
		name  string
		cost  int64
		bands []regions.BandLimit
	}{
		{"cost above a band's capacity", 5, []regions.BandLimit{band("hour", 100, 1), band("minute", 4, 1)}},
		{"band without refill", 1, []regions.BandLimit{band("hour", 10, 0)}},
		{"band without capacity", 1, []regions.BandLimit{band("hour", 0, 1)}},
		{"band without a name", 1, []regions.BandLimit{band("", 10, 1)}},
		{"band named as the rule's own", 1, []regions.BandLimit{band(regions.PrimaryBand, 10, 1)}},
		{"band twice", 1, []regions.BandLimit{band("hour", 10, 1), band("hour", 20, 1)}},
		{"too many bands", 1, nine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}, Cost: tt.cost, Bands: tt.bands}
			for name, l := range map[string]interface {
				Decide(context.Context, Request) (Decision, error)
			}{"redis": rl, "local": loc} {
				if _, err := l.Decide(context.Background(), r); !errors.Is(err, ErrInvalidRequest) {
					t.Errorf("%s: err %v, want ErrInvalidRequest", name, err)
				}
			}
		})
	}
}

// TestLocalBandsConcurrent (-race): requests sharing band buckets in different orders,
// with and without a value, decided concurrently, neither deadlock nor admit more than
// the tightest shared band (all of them take from band "a", 20 tokens; the clock stands
// still); in a standalone Local and in a fallback's, whose debts are then exactly what
// each bucket admitted.
func TestLocalBandsConcurrent(t *testing.T) {
	lim := func(c int64) regions.Limit { return regions.Limit{Capacity: c, RefillPerSecond: 1} }
	a, b := regions.BandLimit{Name: "a", Limit: lim(20)}, regions.BandLimit{Name: "b", Limit: lim(30)}
	reqs := []Request{
		{Tenant: "t", Route: "r", Limit: lim(50), Bands: []regions.BandLimit{a, b}},
		{Tenant: "t", Route: "r", Limit: lim(50), Bands: []regions.BandLimit{b, a}},
		{Tenant: "t", Route: "r", Limit: lim(50), Bands: []regions.BandLimit{a}, Value: "v", ValueLimit: lim(100)},
	}
	for _, fallback := range []bool{false, true} {
		clock := newFakeClock()
		l := newLocal(LocalOptions{Now: clock.Now}, fallback)
		if fallback {
			for _, r := range reqs {
				l.takeBands(clock.Now(), r, 1, 1, true) // the buckets start empty...
			}
			clock.Advance(time.Hour) // ...and fill
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					if l.takeBands(clock.Now(), reqs[(g+i)%len(reqs)], 1, 1, fallback).Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if n := admitted.Load(); n != 20 {
			t.Errorf("fallback %v: admitted %d, want band a's 20", fallback, n)
		}
		d := l.takeBands(clock.Now(), reqs[0], 1, 1, false)
		if d.Allowed || d.Bands[0].Remaining != 30 || d.Bands[1].Remaining != 0 || d.Bands[2].Remaining < 10 || d.Bands[2].Remaining > 30 {
			t.Errorf("fallback %v: after the run: %+v, want rate 30 left, a 0, b 10 to 30 (taken only by the requests that name it)", fallback, d)
		}
		if owed := l.owedTotal(clock.Now()); fallback && owed != 60 {
			t.Errorf("the fallback owes %d, want 60: 20 each for the route and band a, 20 over band b and the value", owed)
		}
	}
}

// TestPipelinedBandsExact: decisions with bands share pipelined script calls with
// decisions of one bucket, and each still gets its own buckets' answer: 128 callers
// admit exactly a band's 300 on one route and a plain rule's 100 on another.
func TestPipelinedBandsExact(t *testing.T) {
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, newClient(t, p), Options{Region: "test", Registerer: reg, Timeout: 2 * time.Second})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	slow := func(c int64) regions.Limit { return regions.Limit{Capacity: c, RefillPerSecond: 0.001} }
	banded := Request{Tenant: "t", Route: "banded", Limit: slow(1000),
		Bands: []regions.BandLimit{{Name: "hour", Limit: slow(300)}, {Name: "day", Limit: slow(500)}}}
	plain := Request{Tenant: "t", Route: "plain", Limit: slow(100)}
	sources, allowed := decideConcurrently(t, l, 128, 8, func(i int) Request {
		if i%2 == 0 {
			return banded
		}
		return plain
	})
	if allowed != 400 || sources[SourceRedis] != 1024 {
		t.Errorf("128 x 8 decisions: %d allowed (want 300 + 100), sources %v (want all redis)", allowed, sources)
	}
	if calls := metricValue(t, reg, "ratelimit_redis_pipelined_calls_total", nil); calls == 0 {
		t.Errorf("no call was pipelined: the test did not batch decisions with bands")
	}
	d := mustDecide(t, l, banded)
	if d.Allowed || d.Limit != 300 || len(d.Bands) != 3 || d.Bands[0].Remaining != 700 || d.Bands[2].Remaining != 200 {
		t.Errorf("after the run: %+v, want refused by hour (300), rate 700 left, day 200", d)
	}
}

// TestLocalAllocations: bands cost a request without them nothing: a Local decision of
// one bucket, or of a route and a value, allocates nothing; one with bands allocates
// only its Decision.Bands.
func TestLocalAllocations(t *testing.T) {
	l := newTestLocal(t, LocalOptions{Now: newFakeClock().Now})
	lim := regions.Limit{Capacity: 1 << 40, RefillPerSecond: 1}
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		r    Request
		want float64
	}{
		{"route", Request{Tenant: "t", Route: "r", Limit: lim}, 0},
		{"route and value", Request{Tenant: "t", Route: "r", Limit: lim, Value: "v", ValueLimit: lim}, 0},
		{"bands", Request{Tenant: "t", Route: "r", Limit: lim, Value: "v", ValueLimit: lim,
			Bands: []regions.BandLimit{{Name: "a", Limit: lim}, {Name: "b", Limit: lim}}}, 1},
	} {
		if n := testing.AllocsPerRun(100, func() { _, _ = l.Decide(ctx, tt.r) }); n != tt.want {
			t.Errorf("%s: %v allocations a decision, want %v", tt.name, n, tt.want)
		}
	}
}

// TestBandRaiseHoldsItsBandOnly: a raise of the rule's own capacity (RaisedAgo,
// RaiseRatio) holds the route's bucket, not the bands'; a band's own raise (BandRaises)
// holds that band. Before, one ratio held every bucket, and a raise of a route's default
// rule held a slow band it did not raise for the band's whole fill time.
func TestBandRaiseHoldsItsBandOnly(t *testing.T) {
	req := func(bandRaise *Raise) Request {
		r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1e-6},
			Bands:     []regions.BandLimit{{Name: "month", Limit: regions.Limit{Capacity: 6, RefillPerSecond: 1e-6}}},
			RaisedAgo: time.Millisecond, RaiseRatio: 0.5}
		if bandRaise != nil {
			r.BandRaises = []Raise{*bandRaise}
		}
		return r
	}
	admitted := func(t *testing.T, l interface {
		Decide(context.Context, Request) (Decision, error)
	}, r Request) int {
		t.Helper()
		n := 0
		for range 20 {
			d, err := l.Decide(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	p := testenv.Redis(t)
	rl := newTestRedis(t, newClient(t, p), Options{Timeout: time.Second})
	if err := rl.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		raise *Raise
		route string
		want  int
	}{
		{"the route raised (0.5 of 10): the month band (6) not held to 3", nil, "r1", 5},
		{"the month band raised too (0.2 of 6)", &Raise{Ago: time.Millisecond, Ratio: 0.2}, "r2", 1},
	} {
		r := req(tc.raise)
		r.Route = tc.route
		if got := admitted(t, rl, r); got != tc.want {
			t.Errorf("redis: %s: %d admitted, want %d", tc.name, got, tc.want)
		}
		clock := newFakeClock()
		ll := newTestLocal(t, LocalOptions{Now: clock.Now})
		if got := admitted(t, ll, r); got != tc.want {
			t.Errorf("local: %s: %d admitted, want %d", tc.name, got, tc.want)
		}
	}
	bad := req(&Raise{Ago: time.Second, Ratio: 2})
	if _, err := rl.Decide(context.Background(), bad); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("band raise ratio 2: %v, want ErrInvalidRequest", err)
	}
}
