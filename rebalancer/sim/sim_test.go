package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// overAdmissionBound bounds waterfill's over-admission on any trace: shares never sum
// above 1, so only capacity rounding (regions.Scale rounds each region's burst to a whole
// token) can admit more than one global bucket, at most about a token per region per
// burst of C.
func overAdmissionBound(tr *Trace, cfg Config) float64 {
	return float64(len(tr.Regions)) / float64(cfg.Capacity)
}

// TestTargets is the bar on the shipped traces: water-filling has zero
// over-admission, the lowest unnecessary throttling or within 0.3 points of the lowest,
// and fewer writes than proportional-offered.
func TestTargets(t *testing.T) {
	byTrace := map[string][]Report{}
	var order []string
	for _, r := range runAll(t) {
		if _, ok := byTrace[r.Trace]; !ok {
			order = append(order, r.Trace)
		}
		byTrace[r.Trace] = append(byTrace[r.Trace], r)
	}
	for _, name := range order {
		reps := byTrace[name]
		t.Run(name, func(t *testing.T) {
			wf, po := reps[0], reps[1]
			if wf.Policy != Waterfill || po.Policy != ProportionalOffered {
				t.Fatalf("policies in order %s, %s", wf.Policy, po.Policy)
			}
			if wf.OverAdmission != 0 || wf.WorstMinuteOverAdmission != 0 {
				t.Errorf("waterfill over-admission %v (worst minute %v), want 0", wf.OverAdmission, wf.WorstMinuteOverAdmission)
			}
			best := math.Inf(1)
			for _, r := range reps {
				best = math.Min(best, r.UnnecessaryThrottle)
			}
			if wf.UnnecessaryThrottle > best+0.003 {
				t.Errorf("waterfill unnecessary throttle %.3f%%, the best policy %.3f%%: more than 0.3 points worse", 100*wf.UnnecessaryThrottle, 100*best)
			}
			if wf.Writes >= po.Writes {
				t.Errorf("waterfill wrote %d times, proportional-offered %d: want fewer", wf.Writes, po.Writes)
			}
		})
	}
}

func parseTrace(t *testing.T, s string) *Trace {
	t.Helper()
	tr, err := ParseTrace(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func mustPolicy(t *testing.T, s string) Policy {
	t.Helper()
	p, err := ParsePolicy(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// spikyTrace is the example: 600/100 rps under a 1000 rps limit, with eu-west
// spiking to 200 rps for a minute every 5 minutes.
func spikyTrace() string {
	var b strings.Builder
	b.WriteString("# regions,us-east,eu-west\n" + Header + "\n")
	for t := 0; t < 3600; t += 10 {
		eu := 100
		if t%300 >= 200 && t%300 < 260 {
			eu = 200
		}
		fmt.Fprintf(&b, "%d,us-east,shop,600\n%d,eu-west,shop,%d\n", t, t, eu)
	}
	return b.String()
}

// TestProportionalUnderServesSmallRegion: proportional-to-offered gives eu-west
// 100/700 of the limit (143 rps) and throttles its spikes while 150 rps sit idle;
// water-filling leaves it headroom.
func TestProportionalUnderServesSmallRegion(t *testing.T) {
	tr := parseTrace(t, spikyTrace())
	wf, err := Run(tr, mustPolicy(t, Waterfill), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	po, err := Run(tr, mustPolicy(t, ProportionalOffered), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if po.WorstRegionUnnecessaryThrottle < 0.02 {
		t.Errorf("proportional-offered: eu-west unnecessary throttle %.2f%%; the premise is that it throttles its spikes", 100*po.WorstRegionUnnecessaryThrottle)
	}
	if wf.WorstRegionUnnecessaryThrottle > 0.01 {
		t.Errorf("waterfill: worst region unnecessary throttle %.2f%%, want under 1%%", 100*wf.WorstRegionUnnecessaryThrottle)
	}
}

// TestAllowedNeverRecovers: a region whose share fell to ~0 while dark shows no allowed
// traffic when it returns, so proportional-allowed never gives it back a share.
func TestAllowedNeverRecovers(t *testing.T) {
	tr := loadTraces(t)[3]
	if tr.Name != "dark-failover" {
		t.Fatalf("trace %s, want dark-failover", tr.Name)
	}
	cfg := DefaultConfig()
	for _, c := range []struct {
		policy    string
		recovered bool
	}{{ProportionalAllowed, false}, {ProportionalOffered, true}, {Waterfill, true}} {
		rep, err := Run(tr, mustPolicy(t, c.policy), cfg)
		if err != nil {
			t.Fatal(err)
		}
		back := rep.ConvergenceSeconds[1]
		if back.Label != "us-east back" || (back.Seconds != nil) != c.recovered {
			t.Errorf("%s: convergence after %q = %v, want recovered %v", c.policy, back.Label, back.Seconds, c.recovered)
		}
	}
}

// TestShrinkBeforeGrow: the same allocation written in one step (both regions reloading
// at their worst moments) over-admits; written in two steps it does not.
func TestShrinkBeforeGrow(t *testing.T) {
	// 70/30 demand above the limit, shares starting at 50/50: the first write moves 0.2.
	var b strings.Builder
	b.WriteString("# regions,us-east,eu-west\n" + Header + "\n")
	for t := 0; t < 600; t += 10 {
		fmt.Fprintf(&b, "%d,us-east,shop,1400\n%d,eu-west,shop,600\n", t, t)
	}
	tr := parseTrace(t, b.String())
	wf, err := Run(tr, mustPolicy(t, Waterfill), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	po, err := Run(tr, mustPolicy(t, ProportionalOffered), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if wf.OverAdmission != 0 {
		t.Errorf("waterfill over-admission %v, want 0", wf.OverAdmission)
	}
	// One-step write: eu-west keeps 0.5 for 20 s while us-east has 0.7: 0.2 x 1000 rps x 19 s.
	if po.WorstMinuteOverAdmission < 0.04 {
		t.Errorf("proportional-offered worst-minute over-admission %v; the premise is that a one-step write over-admits", po.WorstMinuteOverAdmission)
	}
}

func TestRunDeterministicJSON(t *testing.T) {
	tr := loadTraces(t)[2]
	a, err := Run(tr, mustPolicy(t, Waterfill), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(tr, mustPolicy(t, Waterfill), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Fatalf("two runs differ:\n%s\n%s", ja, jb)
	}
	var m map[string]any
	if err := json.Unmarshal(ja, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"convergence_seconds", "over_admission", "policy", "trace", "unnecessary_throttle", "utilisation",
		"worst_minute_over_admission", "worst_region_unnecessary_throttle", "writes"}
	if !slices.Equal(keys, want) {
		t.Fatalf("JSON fields %v, want %v", keys, want)
	}
	conv := m["convergence_seconds"].([]any)[0].(map[string]any)
	for _, k := range []string{"time_seconds", "tenant", "label", "seconds"} {
		if _, ok := conv[k]; !ok {
			t.Errorf("convergence entry %v lacks %q", conv, k)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	for _, s := range []string{"waterfill", "proportional-offered", "proportional-allowed", "static", "static:0.7,0.3", "static:0.5,0.25,0.25"} {
		p, err := ParsePolicy(s)
		if err != nil {
			t.Errorf("ParsePolicy(%q): %v", s, err)
			continue
		}
		if p.String() != s {
			t.Errorf("ParsePolicy(%q).String() = %q", s, p)
		}
	}
	for _, s := range []string{"", "water", "waterfill:1", "static:", "static:0.7,0.4", "static:a,b", "static:-0.5,1.5", "static:NaN,1"} {
		if _, err := ParsePolicy(s); err == nil {
			t.Errorf("ParsePolicy(%q): want an error", s)
		}
	}
}

func TestRunErrors(t *testing.T) {
	tr := parseTrace(t, "# regions,a,b\n"+Header+"\n0,a,x,1\n")
	bad := DefaultConfig()
	bad.ScrapeLag = 1500 * time.Millisecond
	zeroRefill := DefaultConfig()
	zeroRefill.Refill = 0
	floor := DefaultConfig()
	floor.Rebalancer.Floor = 0.9
	for _, c := range []struct {
		name   string
		tr     *Trace
		policy Policy
		cfg    Config
	}{
		{"nil trace", nil, Policy{kind: Waterfill}, DefaultConfig()},
		{"zero policy", tr, Policy{}, DefaultConfig()},
		{"static for 3 regions on 2", tr, mustPolicy(t, "static:0.5,0.25,0.25"), DefaultConfig()},
		{"fractional seconds", tr, Policy{kind: Waterfill}, bad},
		{"zero refill", tr, Policy{kind: Waterfill}, zeroRefill},
		{"bad rebalancer config", tr, Policy{kind: Waterfill}, floor},
	} {
		if _, err := Run(c.tr, c.policy, c.cfg); err == nil {
			t.Errorf("%s: want an error", c.name)
		}
	}
}

func TestWriteTableForPeople(t *testing.T) {
	s := 95
	reps := []Report{{Trace: "t", Policy: "waterfill", Utilisation: 0.9876, UnnecessaryThrottle: 0.0123, Writes: 3,
		ConvergenceSeconds: []Convergence{{Event: Event{At: 1}, Seconds: &s}, {Event: Event{At: 2}}}}}
	var b bytes.Buffer
	if err := WriteTable(&b, reps); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"waterfill", "98.76", "1.23", "95 / never", "writes"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestUntrackedTail (issue 22): on the untracked-tail trace (tenants without a scope of
// their own, single-region tenants, sub-threshold noise, a tenant arriving, a region
// added and removed) water-filling leaves no tenant below its equal split where its
// traffic is and never moves "*" towards the noise; proportional-offered, which reads
// any demand, hands "*" to the noise once solo has left, and the tenant arriving after
// it is throttled below its equal split.
func TestUntrackedTail(t *testing.T) {
	var tail *Trace
	for _, tr := range loadTraces(t) {
		if tr.Name == "untracked-tail" {
			tail = tr
		}
	}
	if tail == nil {
		t.Fatal("no untracked-tail trace")
	}
	run := func(p Policy) Report {
		rep, err := Run(tail, p, DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	wf := run(Policy{kind: Waterfill})
	for _, tr := range wf.TenantRegions {
		t.Logf("waterfill %s in %s: admitted %.0f of %.0f offered, equal split %.0f", tr.Tenant, tr.Region, tr.Admitted, tr.Offered, tr.EqualSplit)
		if tr.Admitted < 0.99*tr.EqualSplit {
			t.Errorf("waterfill: %s in %s admitted %.0f, below its equal split %.0f", tr.Tenant, tr.Region, tr.Admitted, tr.EqualSplit)
		}
	}
	if got := wf.GlobalMaxShare["eu-west"]; got > 0.5+1e-9 {
		t.Errorf("waterfill moved * to eu-west's noise: its share reached %v", got)
	}
	po := run(Policy{kind: ProportionalOffered})
	t.Logf("* max share in eu-west: waterfill %.3f, proportional-offered %.3f", wf.GlobalMaxShare["eu-west"], po.GlobalMaxShare["eu-west"])
	if got := po.GlobalMaxShare["eu-west"]; got < 0.9 {
		t.Errorf("proportional-offered's * reached only %v in eu-west: the trace no longer shows the flip on noise", got)
	}
	for _, tr := range po.TenantRegions {
		if tr.Tenant == "late" && tr.Admitted >= 0.99*tr.EqualSplit {
			t.Errorf("proportional-offered admitted late %.0f of its equal split %.0f: the trace no longer shows the cost of the flip", tr.Admitted, tr.EqualSplit)
		}
	}
}

// TestRegionAbsentAtStart: a trace whose only region is added later runs (nothing is
// decided while no region exists), and a region removed stops being served.
func TestRegionAbsentAtStart(t *testing.T) {
	tr := parseTrace(t, "# region-added,60,a\n# region-removed,120,a\n"+Header+"\n0,a,x,10\n179,a,x,10\n")
	for _, p := range ComparePolicies(len(tr.Regions)) {
		rep, err := Run(tr, p, DefaultConfig())
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if len(rep.TenantRegions) != 1 || rep.TenantRegions[0].Offered != 600 {
			t.Errorf("%s: %+v, want 60 s of 10 rps offered while a exists", p, rep.TenantRegions)
		}
	}
}
