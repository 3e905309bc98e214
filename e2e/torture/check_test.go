package torture

import (
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

// TestOverlapSlack: a window over its bound by at most OverlapSlack is a breach the run
// tolerates (the fallback overlap); one further over fails the run.
func TestOverlapSlack(t *testing.T) {
	for _, tc := range []struct {
		admitted        int
		bound           float64
		breach, exceeds bool
	}{
		{20, 20, false, false},
		{21, 20, true, false},
		{22, 20, true, true},
		{105, 100, true, false},
		{106, 100, true, true},
	} {
		w := Window{Admitted: tc.admitted, Bound: tc.bound}
		if w.Breach() != tc.breach || w.Exceeds() != tc.exceeds {
			t.Errorf("%d of %v: breach %v exceeds %v, want %v %v", tc.admitted, tc.bound, w.Breach(), w.Exceeds(), tc.breach, tc.exceeds)
		}
	}
}

// TestCheckCountsTokensAndTheFloor: an admission counts for its cost, so cost-5 requests
// that a fallback clipped to a bucket of 4 show as 5 tokens each; and a regional
// capacity below the instance count allows the fallback's one-token floor per
// instance, no more.
func TestCheckCountsTokensAndTheFloor(t *testing.T) {
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

	small := []State{{From: at(0), Capacity: 1, Refill: 0.01}}
	in = one(small, admissions(2, 0, 0.1))
	if b := Check(in).Breaches(); len(b) != 1 {
		t.Fatalf("2 admitted against a capacity of 1 without instances: breaches %v, want one", b)
	}
	in.Instances = 2
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("2 admitted against a capacity of 1 over 2 instances (one-token floor each): breaches %v, want none", b)
	}
	in = one(small, admissions(3, 0, 0.1))
	in.Instances = 2
	if b := Check(in).Breaches(); len(b) != 1 || b[0].FloorTerm != 1 {
		t.Fatalf("3 admitted against a capacity of 1 over 2 instances: breaches %v, want one with a floor term of 1", b)
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

// TestCheckOverlapTerm: during a Redis fault of the region (and its recovery), one
// gateway's fallback bucket (capacity / N) plus its share of the refill may overlap the
// others' Redis answers; outside one, the same admissions are a breach, and a second
// bucket (the stall of issue 14) is a breach even inside one.
func TestCheckOverlapTerm(t *testing.T) {
	states := []State{{From: at(0), Capacity: 20, Refill: 0.01}}
	in := one(states, append(admissions(20, 10, 10.2), admissions(10, 11, 11.2)...))
	in.Instances = 2
	if b := Check(in).Breaches(); len(b) == 0 {
		t.Fatalf("30 admitted against 20 with no fault: no breach, want one")
	}
	in.RedisFaults = map[string][]Span{"r": {{From: at(10.5), To: at(12)}}}
	if b := Check(in).Breaches(); len(b) != 0 {
		t.Fatalf("20 + one fallback bucket of 10 during a fault: breaches %v, want none", b)
	}
	in.Admitted["x"]["r"] = append(admissions(20, 10, 10.2), admissions(19, 11, 11.2)...)
	if b := Check(in).Breaches(); len(b) != 1 || b[0].OverlapTerm > 10.1 {
		t.Fatalf("39 admitted against 20 during a fault (a second bucket): breaches %v, want one with an overlap term of about 10", b)
	}
}
