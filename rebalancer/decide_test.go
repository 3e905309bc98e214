package rebalancer

import (
	"maps"
	"math"
	"testing"
)

func TestShouldWrite(t *testing.T) {
	tests := []struct {
		name     string
		in       []RegionInput
		proposed map[string]float64
		want     bool
	}{
		{
			name:     "no change",
			in:       []RegionInput{ok("us-east", 600, 0.8), ok("eu-west", 100, 0.2)},
			proposed: map[string]float64{"us-east": 0.8, "eu-west": 0.2},
		},
		{
			name:     "small change, nobody throttled",
			in:       []RegionInput{ok("us-east", 600, 0.8), ok("eu-west", 100, 0.2)},
			proposed: map[string]float64{"us-east": 0.81, "eu-west": 0.19},
		},
		{
			name:     "large change toward a throttled region",
			in:       []RegionInput{ok("us-east", 700, 0.6), ok("eu-west", 300, 0.4)},
			proposed: map[string]float64{"us-east": 0.7, "eu-west": 0.3},
			want:     true,
		},
		{
			// 0.01 absolute, but 0.05 -> 0.056 is +12% for a region that throttles.
			name:     "small change, a throttled region gains 10%",
			in:       []RegionInput{ok("us-east", 100, 0.95), ok("eu-west", 56, 0.05)},
			proposed: map[string]float64{"us-east": 0.944, "eu-west": 0.056},
			want:     true,
		},
		{
			name:     "small change, a throttled region gains under 10%",
			in:       []RegionInput{ok("us-east", 100, 0.95), ok("eu-west", 56, 0.05)},
			proposed: map[string]float64{"us-east": 0.946, "eu-west": 0.054},
		},
		{
			// Both regions have demand plus headroom before and after: moving spare
			// capacity between them changes no admission.
			name:     "large change that only moves spare capacity",
			in:       []RegionInput{ok("us-east", 400, 0.6), ok("eu-west", 100, 0.4)},
			proposed: map[string]float64{"us-east": 0.7, "eu-west": 0.3},
		},
		{
			name:     "large change to a region short of headroom",
			in:       []RegionInput{ok("us-east", 550, 0.6), ok("eu-west", 100, 0.4)},
			proposed: map[string]float64{"us-east": 0.72, "eu-west": 0.28},
			want:     true,
		},
		{
			name:     "dark region above the floor",
			in:       []RegionInput{dark("us-east", 0.7), ok("eu-west", 300, 0.3)},
			proposed: map[string]float64{"us-east": 0.05, "eu-west": 0.95},
			want:     true,
		},
		{
			name:     "unknown region rescaled",
			in:       []RegionInput{unknown("us-east", 0.5), unknown("eu-west", 0.45), ok("ap-south", 10, 0.05)},
			proposed: map[string]float64{"us-east": 0.45, "eu-west": 0.5, "ap-south": 0.05},
			want:     true,
		},
		{
			name:     "current shares do not sum to 1",
			in:       []RegionInput{ok("us-east", 100, 0.5), ok("eu-west", 100, 0.4)},
			proposed: map[string]float64{"us-east": 0.5, "eu-west": 0.5},
			want:     true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ShouldWrite(DefaultConfig(len(tc.in)), limit, tc.in, tc.proposed); got != tc.want {
				t.Fatalf("ShouldWrite = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFastPathTrigger(t *testing.T) {
	wasDark := State{Regions: map[string]RegionState{"eu-west": {Status: StatusDark}}}
	tests := []struct {
		name string
		in   []RegionInput
		st   State
		want Trigger
	}{
		{
			name: "throttling with spare refill",
			in:   []RegionInput{ok("us-east", 400, 0.7), ok("eu-west", 450, 0.3)},
			want: Trigger{ReasonThrottling, "eu-west"},
		},
		{
			name: "throttling without spare refill (overload)",
			in:   []RegionInput{ok("us-east", 900, 0.7), ok("eu-west", 450, 0.3)},
		},
		{
			name: "throttling under 5%",
			in:   []RegionInput{ok("us-east", 400, 0.7), ok("eu-west", 310, 0.3)},
		},
		{
			name: "an unknown region counts as using its share",
			in:   []RegionInput{unknown("us-east", 0.7), ok("eu-west", 450, 0.3)},
		},
		{
			name: "dark region above the floor",
			in:   []RegionInput{dark("us-east", 0.7), ok("eu-west", 300, 0.3)},
			want: Trigger{ReasonDark, "us-east"},
		},
		{
			name: "dark region at the floor",
			in:   []RegionInput{dark("us-east", 0.05), ok("eu-west", 300, 0.95)},
		},
		{
			name: "region back from dark",
			in:   []RegionInput{ok("us-east", 300, 0.95), ok("eu-west", 40, 0.05)},
			st:   wasDark,
			want: Trigger{ReasonReturned, "eu-west"},
		},
		{
			name: "region back from dark but still unknown",
			in:   []RegionInput{ok("us-east", 300, 0.95), unknown("eu-west", 0.05)},
			st:   wasDark,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, fired := FastPathTrigger(DefaultConfig(len(tc.in)), limit, tc.in, tc.st)
			if got != tc.want || fired != (tc.want != Trigger{}) {
				t.Fatalf("FastPathTrigger = %+v, %v, want %+v", got, fired, tc.want)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	old := map[string]float64{"us-east": 0.5, "eu-west": 0.3, "ap-south": 0.2}
	new := map[string]float64{"us-east": 0.3, "eu-west": 0.3, "ap-south": 0.35, "sa-east": 0.05}
	first, second := Plan(old, new)
	if want := map[string]float64{"us-east": 0.3}; !maps.Equal(first, want) {
		t.Errorf("first = %v, want %v", first, want)
	}
	if want := map[string]float64{"ap-south": 0.35, "sa-east": 0.05}; !maps.Equal(second, want) {
		t.Errorf("second = %v, want %v", second, want)
	}
	checkPlan(t, old, new, first, second)
}

// checkPlan asserts that whichever step each region's gateways have loaded, the
// enforced shares never sum above 1, and that the two steps reach new.
func checkPlan(t *testing.T, old, new, first, second map[string]float64) {
	t.Helper()
	mid := maps.Clone(old)
	maps.Copy(mid, first)
	end := maps.Clone(mid)
	maps.Copy(end, second)
	for r, want := range new {
		if end[r] != want {
			t.Fatalf("after both steps %s = %v, want %v", r, end[r], want)
		}
	}
	// During step 1 a region enforces old or mid, during step 2 mid or end.
	step1, step2 := 0.0, 0.0
	for r := range end {
		step1 += math.Max(old[r], mid[r])
		step2 += math.Max(mid[r], end[r])
	}
	if step1 > 1+1e-9 || step2 > 1+1e-9 {
		t.Fatalf("enforced shares can sum to %v (step 1) and %v (step 2), want <= 1; old %v new %v", step1, step2, old, new)
	}
}

func TestDecide(t *testing.T) {
	cfg := DefaultConfig(2)
	steady := []RegionInput{ok("us-east", 600, 0.8125), ok("eu-west", 100, 0.1875)}
	d, err := Decide(cfg, limit, t0, steady, State{}, CheckTick)
	if err != nil {
		t.Fatal(err)
	}
	if d.Write || d.Reason != ReasonNoTrigger {
		t.Fatalf("check tick at the answer: write %v reason %q, want no write, %q", d.Write, d.Reason, ReasonNoTrigger)
	}
	if d.Allocation.State.Regions["eu-west"].Peak != 100 {
		t.Fatalf("check tick did not update the peak state: %+v", d.Allocation.State)
	}
	d, err = Decide(cfg, limit, t0, steady, State{}, FullRun)
	if err != nil {
		t.Fatal(err)
	}
	if d.Write || d.Reason != ReasonHysteresis {
		t.Fatalf("full tick at the answer: write %v reason %q, want no write, %q", d.Write, d.Reason, ReasonHysteresis)
	}
	// A flash crowd in eu-west on a check tick: the fast path writes, decreases first.
	crowd := []RegionInput{ok("us-east", 600, 0.8125), ok("eu-west", 350, 0.1875)}
	d, err = Decide(cfg, limit, t0, crowd, State{}, CheckTick)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Write || d.Reason != ReasonThrottling || d.Region != "eu-west" {
		t.Fatalf("flash crowd: write %v reason %q region %q, want a %q write for eu-west", d.Write, d.Reason, d.Region, ReasonThrottling)
	}
	if _, ok := d.First["us-east"]; !ok || len(d.First) != 1 || len(d.Second) != 1 || d.Second["eu-west"] <= 0.1875 {
		t.Fatalf("plan first %v second %v, want us-east shrinking first, eu-west growing second", d.First, d.Second)
	}
	if _, err := Decide(cfg, limit, t0, nil, State{}, FullRun); err == nil {
		t.Fatal("Decide with no regions: want an error")
	}
}

// TestQuietScopeHealsAfterDark (issue 22): a dark episode moves a quiet scope (the dark
// region to the floor); once the region is ok again the scope goes back to the equal
// split, from the State or from DarkFloor (a new leader), and only then. Before, quiet
// kept the floor until demand came back: eu-west held 0.05 of "*" for good.
func TestQuietScopeHealsAfterDark(t *testing.T) {
	cfg := DefaultConfig(2)
	trickle := func(region string, share float64) RegionInput { return ok(region, 2, share) } // 2 rps < 0.1 x 1000
	back := []RegionInput{trickle("us-east", 0.95), trickle("eu-west", 0.05)}
	wasDark := State{Regions: map[string]RegionState{"eu-west": {Status: StatusDark}, "us-east": {Status: StatusOK}}}
	withMark := []RegionInput{back[0], back[1]}
	withMark[1].DarkFloor = true
	for name, tc := range map[string]struct {
		in []RegionInput
		st State
	}{"state": {back, wasDark}, "dark floor row": {withMark, State{}}} {
		t.Run(name, func(t *testing.T) {
			for _, tick := range []Tick{CheckTick, FullRun} {
				d, err := Decide(cfg, limit, t0, tc.in, tc.st, tick)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Write || d.Reason != ReasonReturned || d.Region != "eu-west" ||
					math.Abs(d.Allocation.Shares["eu-west"]-0.5) > 1e-9 || math.Abs(d.Allocation.Shares["us-east"]-0.5) > 1e-9 {
					t.Fatalf("tick %v: write %v reason %q region %q shares %v, want %q for eu-west to 0.5/0.5",
						tick, d.Write, d.Reason, d.Region, d.Allocation.Shares, ReasonReturned)
				}
				if st := d.Allocation.State.Regions["eu-west"].Status; st != StatusOK {
					t.Fatalf("state after the heal: eu-west %s, want ok (healed once)", st)
				}
			}
		})
	}
	// Without a dark episode a quiet scope at the floor keeps its shares (noise never
	// moves it), and so does one whose region is still dark or unknown.
	for name, in := range map[string][]RegionInput{
		"never dark":    back,
		"still unknown": {trickle("us-east", 0.95), unknown("eu-west", 0.05)},
		"still dark":    {trickle("us-east", 0.95), dark("eu-west", 0.05)},
	} {
		st := State{Regions: map[string]RegionState{"eu-west": {Status: StatusOK}}}
		if name != "never dark" {
			st = wasDark
		}
		for _, tick := range []Tick{CheckTick, FullRun} {
			d, err := Decide(cfg, limit, t0, in, st, tick)
			if err != nil {
				t.Fatal(err)
			}
			if d.Write {
				t.Errorf("%s, tick %v: wrote %v (%s), want shares kept", name, tick, d.Allocation.Shares, d.Reason)
			}
		}
	}
}
