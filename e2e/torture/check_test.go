package torture

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// admissions are n admissions spread evenly over [from, to] seconds, each answered 5 ms
// after it was sent.
func admissions(n int, from, to float64) []Admission {
	out := make([]Admission, n)
	for i := range out {
		s := from
		if n > 1 {
			s += (to - from) * float64(i) / float64(n-1)
		}
		out[i] = Admission{Sent: at(s), Recv: at(s + 0.005)}
	}
	return out
}

func one(states []State, adm []Admission) Input {
	return Input{
		Lag:      6 * time.Second,
		States:   map[string]map[string][]State{"x": {"r": states}},
		Admitted: map[string]map[string][]Admission{"x": {"r": adm}},
	}
}

// TestCheckHolds: a bucket of 20 refilling 1/s that admits 20 at once and then one a
// second stays within the bound.
func TestCheckHolds(t *testing.T) {
	adm := append(admissions(20, 0, 0.1), admissions(30, 1.2, 30.2)...)
	res := Check(one([]State{{From: at(0), Capacity: 20, Refill: 1}}, adm))
	if b := res.Breaches(); len(b) != 0 {
		t.Fatalf("a bucket kept to its rule breached: %v", b)
	}
	if res.MaxRatio < 0.9 || res.MaxRatio > 1 {
		t.Errorf("max ratio %.3f, want near 1 (the bucket was drained)", res.MaxRatio)
	}
}

// TestCheckCatchesSecondBucket: the issue-14 stall: capacity 20, refill 0.01/s, and a
// second bucket of 19 handed out 5 s later (39 admitted). The worst window is caught.
func TestCheckCatchesSecondBucket(t *testing.T) {
	adm := append(admissions(20, 0, 0.4), admissions(19, 5, 5.4)...)
	res := Check(one([]State{{From: at(0), Capacity: 20, Refill: 0.01}}, adm))
	b := res.Breaches()
	if len(b) != 1 || b[0].Admitted != 39 {
		t.Fatalf("breaches %v, want the window of all 39", b)
	}
	if res.MaxRatio < 1.9 {
		t.Errorf("max ratio %.3f, want about 39/20", res.MaxRatio)
	}
}

// TestCheckRuleRaised: a rule raised from 2 (refill 1/s) to 1000 admits at most the
// old bucket plus the new refill since the change: 1000 at once is a breach, even
// though windows that start after the change allow the new capacity.
func TestCheckRuleRaised(t *testing.T) {
	states := []State{{From: at(0), Capacity: 2, Refill: 1}, {From: at(10), Capacity: 1000, Refill: 1}}
	ok := admissions(12, 10.1, 20) // the old bucket (2) + ~10 s of refill
	if b := Check(one(states, ok)).Breaches(); len(b) != 0 {
		t.Fatalf("conserving tokens breached: %v", b)
	}
	// The bucket existed before the change (an admission at 1 s): a bucket never used
	// before the change is created at its first call, full (TestCheckBucketCreatedAtFirstAdmission).
	bad := append(admissions(1, 1, 1), admissions(1000, 10.1, 12)...)
	b := Check(one(states, bad)).Breaches()
	if len(b) != 1 || b[0].CapTerm != 2 {
		t.Fatalf("breaches %v, want one from before the change with capacity term 2", b)
	}
}

// TestCheckLag: a rule lowered from 100 to 10 may still be enforced for one lag after
// it was observed; 100 admitted right after the change is within the bound, 100 more
// after the lag are not.
func TestCheckLag(t *testing.T) {
	states := []State{{From: at(0), Capacity: 100, Refill: 0.01}, {From: at(10), Capacity: 10, Refill: 0.01}}
	if b := Check(one(states, admissions(100, 10.5, 11))).Breaches(); len(b) != 0 {
		t.Fatalf("the old rule within the lag breached: %v", b)
	}
	if b := Check(one(states, admissions(11, 17, 18))).Breaches(); len(b) != 1 {
		t.Fatalf("11 admitted after the lag of a rule of 10: breaches %v, want 1", b)
	}
}

// TestCheckRedisRestart: a Redis restarted empty hands out its bucket again, which is
// the one slack allowed for it; a second bucket without a restart is a breach.
func TestCheckRedisRestart(t *testing.T) {
	in := one([]State{{From: at(0), Capacity: 20, Refill: 0.01}}, append(admissions(20, 0, 1), admissions(20, 5, 6)...))
	if len(Check(in).Breaches()) != 1 {
		t.Fatal("a second bucket without a restart was not caught")
	}
	in.RedisRestarts = map[string][]Span{"r": {{From: at(3), To: at(4)}}}
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("a bucket again after a restart breached: %v", b)
	}
}

// TestCheckAcrossRegions: two regions at share 0.5 each keep their own halves; a sum
// above C + R·t is caught in the regions-together window as well.
func TestCheckAcrossRegions(t *testing.T) {
	st := []State{{From: at(0), Capacity: 50, Refill: 0.005}}
	in := Input{
		Lag:      6 * time.Second,
		States:   map[string]map[string][]State{"x": {"a": st, "b": st}},
		Admitted: map[string]map[string][]Admission{"x": {"a": admissions(50, 0, 1), "b": admissions(60, 0, 1)}},
	}
	res := Check(in)
	var regions []string
	for _, w := range res.Breaches() {
		regions = append(regions, w.Region)
	}
	if len(regions) != 2 || regions[0] != "b" || regions[1] != "" {
		t.Fatalf("breaches in %q, want region b and the regions together", regions)
	}
}

// TestCheckOutage: a state replaced just before a PostgreSQL outage may be enforced
// until one lag after the outage (no gateway could reload meanwhile).
func TestCheckOutage(t *testing.T) {
	states := []State{{From: at(0), Capacity: 100, Refill: 0.01}, {From: at(10), Capacity: 10, Refill: 0.01}}
	in := one(states, admissions(100, 19, 20))
	if b := Check(in).Breaches(); len(b) != 1 {
		t.Fatalf("100 admitted 9 s after a rule of 10 without an outage: breaches %v, want 1", b)
	}
	in.Outages = []Span{{From: at(11), To: at(15)}}
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("the old rule within a lag after the outage breached: %v", b)
	}
}

// TestCheckCountsTokens: an admission counts for its cost, so cost-5 requests that a
// fallback clipped to a bucket of 4 show as 5 tokens each.
func TestCheckCountsTokens(t *testing.T) {
	costly := admissions(2, 0, 0.1)
	for i := range costly {
		costly[i].Cost = 5
	}
	in := one([]State{{From: at(0), Capacity: 8, Refill: 0.01}}, costly)
	if b := Check(in).Breaches(); len(b) != 1 || b[0].Admitted != 10 {
		t.Fatalf("two cost-5 admissions against a bucket of 8: breaches %v, want one window of 10 tokens", b)
	}
	costly[1].Cost = 3
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("5 + 3 tokens against a bucket of 8: breaches %v, want none", b)
	}
}

// TestCheckBucketCreatedAtFirstAdmission: a share raised from 2 to 20 tokens before the
// tenant's first admission: the bucket is created at its first call, full at 20, so 20
// admitted at once is within the bound; the same 20 after an admission at 1 s (the bucket
// existed, at 2) is a breach.
func TestCheckBucketCreatedAtFirstAdmission(t *testing.T) {
	states := []State{{From: at(0), Capacity: 2, Refill: 0.05}, {From: at(2), Capacity: 20, Refill: 0.5}}
	in := one(states, admissions(20, 5, 5.5))
	in.Lag = 6 * time.Second // the 2-token state may be in force until 8 s
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("20 admitted at 5 s, the first admissions: breaches %v, want none", b)
	}
	in.Admitted["x"]["r"] = append(admissions(1, 1, 1), admissions(20, 5, 5.5)...)
	if b := Check(in).Breaches(); len(b) == 0 {
		t.Fatalf("an admission at 1 s, then 20 at 5 s while 2 tokens may be in force: no breach, want one")
	}
}

// TestCheckRegionBackIsNew: a region removed at 10 s (capacity 0) and added back at 16 s
// with 5 tokens is new again: 5 sent just before and answered after it is back are within
// the bound (seed 15 of make torture read them as 8.8x of a bound of 0.57); a sixth at
// once, or the 5 again 0.1 s later, is a breach, and so are 5 admitted while it is out.
func TestCheckRegionBackIsNew(t *testing.T) {
	states := []State{{From: at(0), Capacity: 50, Refill: 10}, {From: at(10), Capacity: 0, Refill: 0}, {From: at(16), Capacity: 5, Refill: 0.01}}
	// Sent while the region was still out, answered once it was back (the seed's shape:
	// a window from a send before the add).
	back := make([]Admission, 5)
	for i := range back {
		back[i] = Admission{Sent: at(15.8), Recv: at(16.2 + 0.01*float64(i))}
	}
	in := one(states, append(admissions(50, 1, 1.5), back...))
	in.Lag = 100 * time.Millisecond
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("5 admitted as the region is back: breaches %v, want none", b)
	}
	for name, adm := range map[string][]Admission{
		"6 at once":         append(admissions(50, 1, 1.5), admissions(6, 16.2, 16.3)...),
		"5 twice":           append(admissions(50, 1, 1.5), append(admissions(5, 16.2, 16.3), admissions(5, 16.4, 16.5)...)...),
		"5 while it is out": append(admissions(50, 1, 1.5), admissions(5, 12, 12.1)...),
	} {
		in.Admitted["x"]["r"] = adm
		if b := Check(in).Breaches(); len(b) == 0 {
			t.Errorf("%s: no breach, want one", name)
		}
	}
}

// life is a gateway process alive over [from, to] seconds; stopped at to when stopped.
func life(from, to float64, stopped bool) Life {
	return Life{Span: Span{From: at(from), To: at(to)}, Stopped: stopped}
}

func sp(from, to float64) Span { return Span{From: at(from), To: at(to)} }

// pair is region r's two gateways alive over the whole of [0, 100] s, a with its breaker
// open over aOpen and b over bOpen.
func pair(aOpen, bOpen []Span) []GatewayRun {
	return []GatewayRun{
		{ID: "r-1", Region: "r", Lives: []Life{life(-100, 100, false)}, Open: aOpen},
		{ID: "r-2", Region: "r", Lives: []Life{life(-100, 100, false)}, Open: bOpen},
	}
}

// TestCheckNoSlackWithoutSpan: with no breaker open anywhere the bound is C·s + R·s·t
// and nothing more: 5 % over it (21 of 20, 105 of 100) is a breach. (The checker used to
// tolerate 5 % for fallback overlap no fault explained.)
func TestCheckNoSlackWithoutSpan(t *testing.T) {
	for _, c := range []float64{20, 100} {
		in := one([]State{{From: at(0), Capacity: c, Refill: 0.001}}, admissions(int(c*1.05), 0, 1))
		in.Gateways, in.Expected = pair(nil, nil), 2
		b := Check(in).Breaches()
		if len(b) != 1 || b[0].Bound > c+0.01 {
			t.Fatalf("%d admitted against %v with no breaker open: breaches %v, want one with a bound of %v", int(c*1.05), c, b, c)
		}
	}
}

// TestCheckFreeBucketPerFaultIsBreach: issue 21's figure: capacity 20, refill 0.01/s in
// a region of 2 gateways. A fallback bucket that starts full at C·s/N = 10 in each of
// three stalls (one gateway open 3 s each, the other still answered by Redis) admits 30
// more than the shared bucket: a breach, since a fallback bucket starts empty and earns
// R·s/N, 0.015 tokens in 3 s. The old per-fault term (a bucket per fault, and 5 % on
// top) accepted 52 where C + R·t is about 20.1.
func TestCheckFreeBucketPerFaultIsBreach(t *testing.T) {
	adm := admissions(20, 0, 0.2)
	var open []Span
	for _, f := range []float64{2, 6, 10} {
		adm = append(adm, admissions(10, f+2.5, f+3)...)
		open = append(open, sp(f, f+3))
	}
	in := one([]State{{From: at(0), Capacity: 20, Refill: 0.01}}, adm)
	in.Gateways, in.Expected = pair(open, nil), 2
	b := Check(in).Breaches()
	if len(b) != 1 || b[0].Admitted != 50 || b[0].Bound > 20.2 {
		t.Fatalf("a free fallback bucket in each of 3 stalls: breaches %v, want the window of all 50 against a bound of about 20.1", b)
	}
	if w := b[0]; w.OverlapTerm < 0.04 || w.OverlapTerm > 0.05 {
		t.Errorf("overlap term %.4f, want 3 spans x 3 s x 0.01/2 = 0.045", w.OverlapTerm)
	}
	// With every gateway open over the stalls, nothing answers from Redis meanwhile:
	// no overlap at all.
	in.Gateways = pair(open, open)
	if b := Check(in).Breaches(); len(b) != 1 || b[0].OverlapTerm != 0 {
		t.Fatalf("both gateways open: breaches %v, want one with an overlap term of 0", b)
	}
	// 21 where C + R·t is 20.09 is a breach too, however long the breakers were open.
	in = one([]State{{From: at(0), Capacity: 20, Refill: 0.01}}, append(admissions(20, 0, 0.1), admissions(1, 9, 9)...))
	in.Gateways, in.Expected = pair([]Span{sp(0, 9)}, []Span{sp(0, 9)}), 2
	if b := Check(in).Breaches(); len(b) != 1 || b[0].Admitted != 21 {
		t.Fatalf("21 admitted where C + R·t is 20.09, both gateways open: breaches %v, want one", b)
	}
}

// TestCheckOverlapIsTheRefillShare: one gateway's breaker open for 10 s while the other
// is closed buys exactly R·s/N per second of it (1/s over 2 gateways: 5 tokens), no
// more: 35 tokens (the bucket of 10, one a second for 20 s, and 5 more at the end of the
// span) hold, 36 are a breach. Where the other
// gateway is open too, or not running, it buys nothing.
func TestCheckOverlapIsTheRefillShare(t *testing.T) {
	states := []State{{From: at(0), Capacity: 10, Refill: 1}}
	run := func(extra int, gws []GatewayRun) Result {
		adm := append(append(admissions(10, 0, 0), admissions(20, 1, 20)...), admissions(5+extra, 15, 15)...)
		in := one(states, adm)
		in.Gateways, in.Expected = gws, 2
		return Check(in)
	}
	res := run(0, pair([]Span{sp(5, 15)}, nil))
	if b := res.Breaches(); len(b) != 0 {
		t.Fatalf("35 tokens against 10 + 20 refill + 5 overlap: breaches %v, want none", b)
	}
	if w := res.Worst[0]; w.OverlapTerm < 5-1e-9 || w.OverlapTerm > 5+1e-9 {
		t.Errorf("worst window %v: overlap term %v, want exactly 5", w, w.OverlapTerm)
	}
	if b := run(1, pair([]Span{sp(5, 15)}, nil)).Breaches(); len(b) != 1 {
		t.Fatalf("36 tokens against 10 + 20 refill + 5 overlap: breaches %v, want one", b)
	}
	if b := run(0, pair([]Span{sp(5, 15)}, []Span{sp(5, 15)})).Breaches(); len(b) != 1 || b[0].OverlapTerm != 0 {
		t.Fatalf("both open: breaches %v, want one without overlap", b)
	}
	gone := pair([]Span{sp(5, 15)}, nil)
	gone[1].Lives = []Life{life(-100, 5, true), life(15, 100, false)}
	if b := run(0, gone).Breaches(); len(b) != 1 || b[0].OverlapTerm != 0 {
		t.Fatalf("the other gateway not running: breaches %v, want one without overlap", b)
	}
}

// TestCheckFallbackN: the refill share divides by the fewest gateways alive in the last
// lag: after a scale-out from 2 to 5 at 10 s an open gateway earns R·s/2 until one lag
// later, R·s/5 after.
func TestCheckFallbackN(t *testing.T) {
	gws := pair([]Span{sp(10, 30)}, nil)
	for i := 3; i <= 5; i++ {
		gws = append(gws, GatewayRun{ID: fmt.Sprintf("r-%d", i), Region: "r", Lives: []Life{life(10, 100, false)}})
	}
	rg := newRegion(gws, 6*time.Second, 2)
	for _, c := range []struct {
		at   float64
		want float64
	}{{5, 2}, {10, 2}, {15.9, 2}, {16, 5}, {50, 5}} {
		if got := rg.n(at(c.at)); got != c.want {
			t.Errorf("N at %vs = %v, want %v", c.at, got, c.want)
		}
	}
	s := newSeries([]State{{From: at(0), Capacity: 10, Refill: 1}}, 6*time.Second, nil, nil, rg)
	if got, want := s.overlapTerm(at(10), at(30)), 6.0/2+14.0/5; math.Abs(got-want) > 1e-9 {
		t.Errorf("overlap over the open span = %v, want 6 s x 1/2 + 14 s x 1/5 = %v", got, want)
	}
}

// TestCheckFloorOnlyWhileOpen: a regional capacity of 1 over 2 gateways gives each
// fallback bucket the one-token floor, so the region may admit 2, but only while some
// gateway's breaker is open; otherwise 2 is a breach.
func TestCheckFloorOnlyWhileOpen(t *testing.T) {
	small := []State{{From: at(0), Capacity: 1, Refill: 0.001}}
	in := one(small, admissions(2, 0, 0.1))
	in.Gateways, in.Expected = pair(nil, nil), 2
	if b := Check(in).Breaches(); len(b) != 1 || b[0].FloorTerm != 0 {
		t.Fatalf("2 admitted against a capacity of 1, no breaker open: breaches %v, want one without a floor term", b)
	}
	in.Gateways = pair([]Span{sp(-1, 1)}, nil)
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("2 admitted against a capacity of 1 over 2 gateways, one open: breaches %v, want none", b)
	}
	in.Gateways = pair([]Span{sp(5, 6)}, nil)
	if b := Check(in).Breaches(); len(b) != 1 {
		t.Fatalf("2 admitted against a capacity of 1, a breaker open only later: breaches %v, want one", b)
	}
	in = one(small, admissions(3, 0, 0.1))
	in.Gateways, in.Expected = pair([]Span{sp(-1, 1)}, nil), 2
	if b := Check(in).Breaches(); len(b) != 1 || b[0].FloorTerm != 1 {
		t.Fatalf("3 admitted against a capacity of 1 over 2 gateways: breaches %v, want one with a floor term of 1", b)
	}
}

// TestCheckLostDebt: a gateway stopped while its breaker is open loses what its fallback
// admitted in that span (R·s/N per second of it) and Redis hands it out again; one
// stopped after its breaker closed, owing nothing, loses nothing.
func TestCheckLostDebt(t *testing.T) {
	states := []State{{From: at(0), Capacity: 10, Refill: 1}}
	adm := append(append(admissions(10, 0, 0), admissions(20, 1, 20)...), admissions(5, 15, 15)...)
	gws := []GatewayRun{
		// r-1 is open from 5 s until it is stopped at 15 s, while r-2 is open too (no
		// overlap), and comes back at 16 s.
		{ID: "r-1", Region: "r", Lives: []Life{life(-100, 15, true), life(16, 100, false)}, Open: []Span{sp(5, 15)}},
		{ID: "r-2", Region: "r", Lives: []Life{life(-100, 100, false)}, Open: []Span{sp(5, 16)}},
	}
	in := one(states, adm)
	in.Gateways, in.Expected = gws, 2
	res := Check(in)
	if b := res.Breaches(); len(b) != 0 {
		t.Fatalf("35 tokens against 10 + 20 refill + 5 lost: breaches %v, want none", b)
	}
	if w := res.Worst[0]; math.Abs(w.LostDebtTerm-5) > 1e-9 || w.OverlapTerm != 0 {
		t.Errorf("worst window %v: lost debt %v, overlap %v, want 5 and 0", w, w.LostDebtTerm, w.OverlapTerm)
	}
	gws[0].Open = []Span{sp(5, 14)} // closed a second before its stop
	if b := Check(in).Breaches(); len(b) != 1 || b[0].LostDebtTerm != 0 {
		t.Fatalf("stopped after its breaker closed: breaches %v, want one without lost debt", b)
	}
	gws[0].Lives[0].Owing = true // but it still owed (a key it never called again)
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("stopped owing: breaches %v, want none", b)
	}
}

// TestBreakerSpans: the spans come from the gateway's own log: open (or half-open) to
// closed, a process stopped while open ends its span at its stop, one killed while open
// (its next start without a stop line) at the end of its life.
func TestBreakerSpans(t *testing.T) {
	ts := func(sec float64) string { return at(sec).Format(time.RFC3339Nano) }
	log := strings.Join([]string{
		`{"time":"` + ts(0) + `","level":"INFO","msg":"gateway starting","region":"r"}`,
		`not json: a panic or go-redis before the logger`,
		`{"time":"` + ts(1) + `","level":"WARN","msg":"redis circuit breaker state changed; decisions from local fallback","from":"closed","to":"open"}`,
		`{"time":"` + ts(2) + `","level":"WARN","msg":"redis circuit breaker state changed; decisions from local fallback","from":"open","to":"half-open"}`,
		`{"time":"` + ts(2.5) + `","level":"WARN","msg":"redis circuit breaker state changed; decisions from local fallback","from":"half-open","to":"open"}`,
		`{"time":"` + ts(3) + `","level":"INFO","msg":"redis circuit breaker closed; decisions from redis again","from":"half-open"}`,
		`{"time":"` + ts(4) + `","level":"WARN","msg":"redis circuit breaker state changed; decisions from local fallback","from":"closed","to":"open"}`,
		`{"time":"` + ts(5) + `","level":"INFO","msg":"gateway stopped","region":"r"}`,
		`{"time":"` + ts(6) + `","level":"INFO","msg":"gateway starting","region":"r"}`,
		`{"time":"` + ts(7) + `","level":"WARN","msg":"redis circuit breaker state changed; decisions from local fallback","from":"closed","to":"open"}`,
		`{"time":"` + ts(9) + `","level":"INFO","msg":"gateway starting","region":"r"}`,
		`{"time":"` + ts(10) + `","level":"WARN","msg":"redis circuit breaker state changed; decisions from local fallback","from":"closed","to":"open"}`,
		// The messages are matched by their first words, and a change to closed under
		// the first one ends a span too.
		`{"time":"` + ts(11) + `","level":"INFO","msg":"redis circuit breaker closed","from":"half-open"}`,
		`{"time":"` + ts(12) + `","level":"WARN","msg":"redis circuit breaker state changed","from":"closed","to":"half-open"}`,
		`{"time":"` + ts(13) + `","level":"INFO","msg":"redis circuit breaker state changed","from":"half-open","to":"closed"}`,
		`{"time":"` + ts(14) + `","level":"WARN","msg":"redis circuit breaker state changed; decisions from local fallback","from":"closed","to":"open"}`,
	}, "\n")
	events, err := ParseBreakerLog(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	lives := []Life{life(-1, 5.2, true), life(6, 8, true), life(9, 20, false)}
	got := BreakerSpans(events, lives)
	want := []Span{sp(1, 3), sp(4, 5.2), sp(7, 8), sp(10, 11), sp(12, 13), sp(14, 20)}
	if len(got) != len(want) {
		t.Fatalf("spans %v, want %v", got, want)
	}
	for i := range want {
		if !got[i].From.Equal(want[i].From) || !got[i].To.Equal(want[i].To) {
			t.Errorf("span %d = [%v, %v], want [%v, %v]", i, got[i].From, got[i].To, want[i].From, want[i].To)
		}
	}
	if _, err := ParseBreakerLog(strings.NewReader(`{"time":"yesterday","msg":"gateway starting"}`)); err == nil {
		t.Error("a line of ours with a time that does not parse: no error")
	}
}
