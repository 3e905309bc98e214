package torture

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// quotaInput is one tenant "x" with an hourly quota of budget, admissions per region,
// I = M = 1 s (S = 4 s).
func quotaInput(budget int64, adm map[string][]Admission) Input {
	return Input{
		Admitted:  map[string]map[string][]Admission{"x": adm},
		Quotas:    []Quota{{Tenant: "x", Band: regions.Band{Name: "hour", Capacity: budget, Period: regions.PeriodHour}}},
		QuotaSync: time.Second, QuotaMargin: time.Second,
	}
}

func onGateway(id string, as []Admission) []Admission {
	for i := range as {
		as[i].Gateway = id
	}
	return as
}

// TestQuotaBound: the budget plus what was admitted within S of the last admission
// holds; one more admitted earlier than that breaks it.
func TestQuotaBound(t *testing.T) {
	// 100 over [10, 30] s in a, then 10 within S before the end in b.
	adm := map[string][]Admission{"a": admissions(100, 10, 30), "b": admissions(10, 40, 42)}
	ps := CheckQuotas(quotaInput(100, adm))
	if len(ps) != 1 {
		t.Fatalf("periods %v, want 1", ps)
	}
	if p := ps[0]; p.Admitted != 110 || p.Stale != 10 || p.Bound() != 110 || p.Breach() {
		t.Errorf("got %v, want 110 admitted, stale 10, bound 110, no breach", p)
	}
	adm["a"] = append(adm["a"], admissions(1, 20, 20)...)
	if p := CheckQuotas(quotaInput(100, adm))[0]; !p.Breach() {
		t.Errorf("got %v, want a breach: 111 admitted, 10 of them within S of the last", p)
	}
}

// TestQuotaFallback: a fallback's admissions count in the slack until its gateway's next
// Redis decision in the same process is S before the count; a fallback's last
// admission was decided with the count of its span's start.
func TestQuotaFallback(t *testing.T) {
	in := quotaInput(100, map[string][]Admission{
		"a": append(onGateway("a-1", admissions(95, 1, 20)), onGateway("a-1", admissions(10, 21, 22))...),
	})
	in.Gateways = []GatewayRun{{ID: "a-1", Region: "a", Lives: []Life{{Span: Span{From: at(0)}}}, Open: []Span{{From: at(20.5), To: at(22.5)}}}}
	p := CheckQuotas(in)[0]
	// The last admission is the fallback's: its count is from 20.5 s, so everything
	// answered after 16.5 s is stale; the fallback's 10 are among them.
	if !p.Count.Equal(at(20.5)) || p.Admitted != 105 || p.Breach() {
		t.Errorf("got %v, want the count at 20.5 s, 105 admitted, no breach", p)
	}
	// A Redis decision of the same gateway at 23 s, 4 s before the last admission at
	// 27 s, charged and synced the fallback's debt: it is in the count, so its 10 are
	// not slack any more and 95 + 10 + 2 > 100 + the stale ones.
	in.Admitted["x"]["a"] = append(in.Admitted["x"]["a"], onGateway("a-1", admissions(1, 23, 23))...)
	in.Admitted["x"]["a"] = append(in.Admitted["x"]["a"], onGateway("a-1", admissions(1, 27.5, 27.5))...)
	if p := CheckQuotas(in)[0]; p.Fallback != 0 || !p.Breach() {
		t.Errorf("got %v, want no fallback slack (charged at 23 s) and a breach", p)
	}
}

// TestQuotaBoundary: admissions within PeriodMargin of an hour boundary go to the
// earlier period while it has room, else to the later; a breach is reported only when
// no split fits.
func TestQuotaBoundary(t *testing.T) {
	// 90 in the first hour, 20 at its last half second (either hour), 90 in the next.
	adm := map[string][]Admission{"a": append(append(admissions(90, 3500, 3590), admissions(20, 3599.5, 3599.6)...), admissions(90, 3610, 3650)...)}
	ps := CheckQuotas(quotaInput(100, adm))
	if len(ps) != 2 {
		t.Fatalf("periods %v, want 2", ps)
	}
	if ps[0].Breach() || ps[1].Breach() || ps[0].Admitted+ps[1].Admitted != 200 || ps[0].Ambiguous+ps[1].Ambiguous != 20 {
		t.Errorf("got %v and %v: want 200 admitted in all, 20 of them ambiguous, no breach", ps[0], ps[1])
	}
	adm["a"] = append(adm["a"], admissions(20, 3620, 3630)...)
	ps = CheckQuotas(quotaInput(100, adm))
	if !ps[1].Breach() {
		t.Errorf("got %v: want a breach of the second hour (no split fits)", ps[1])
	}
}
