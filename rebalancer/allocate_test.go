package rebalancer

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

var (
	t0    = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	limit = regions.Limit{Capacity: 2000, RefillPerSecond: 1000}
)

// ok is an ok region whose short- and long-window offered rate is demand, throttled
// above what its share admits.
func ok(region string, demand, share float64) RegionInput {
	allowed := math.Min(demand, share*limit.RefillPerSecond)
	r := Rates{Allowed: allowed, Throttled: demand - allowed}
	return RegionInput{Region: region, Status: StatusOK, Long: r, Short: r, Share: share}
}

func unknown(region string, share float64) RegionInput {
	return RegionInput{Region: region, Status: StatusUnknown, Share: share}
}

func dark(region string, share float64) RegionInput {
	return RegionInput{Region: region, Status: StatusDark, Share: share}
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		name  string
		in    []RegionInput
		state State
		want  map[string]float64
	}{
		{
			// The example: proportional-to-offered would give eu-west 100/700 of
			// the limit, 143 rps, and throttle its next spike while 150 rps sit idle.
			// Water-filling: demand 600/100, headroom 150/25, the 125 left split equally.
			name: "600/100 under a 1000 limit: the small region keeps headroom",
			in:   []RegionInput{ok("us-east", 600, 0.5), ok("eu-west", 100, 0.5)},
			want: map[string]float64{"us-east": 0.8125, "eu-west": 0.1875},
		},
		{
			name: "overload 70/30: every region admits the same fraction of its demand",
			in:   []RegionInput{ok("us-east", 1400, 0.5), ok("eu-west", 600, 0.5)},
			want: map[string]float64{"us-east": 0.7, "eu-west": 0.3},
		},
		{
			name: "overload with a tiny region: the floor holds",
			in:   []RegionInput{ok("us-east", 1900, 0.5), ok("eu-west", 20, 0.5)},
			want: map[string]float64{"us-east": 0.95, "eu-west": 0.05},
		},
		{
			name: "dark region shrinks to the floor, never 0",
			in:   []RegionInput{dark("us-east", 0.7), ok("eu-west", 800, 0.3)},
			want: map[string]float64{"us-east": 0.05, "eu-west": 0.95},
		},
		{
			// ap-south keeps 0.2; the ok regions water-fill the 0.8 left: demand .3/.1,
			// headroom .075/.025, the .3 left equally.
			name: "unknown keeps its share, the others rescale within the rest",
			in:   []RegionInput{ok("us-east", 300, 0.4), ok("eu-west", 100, 0.4), unknown("ap-south", 0.2)},
			want: map[string]float64{"us-east": 0.525, "eu-west": 0.275, "ap-south": 0.2},
		},
		{
			name: "unknown below the floor is raised to it",
			in:   []RegionInput{ok("us-east", 300, 0.99), unknown("eu-west", 0.01)},
			want: map[string]float64{"us-east": 0.95, "eu-west": 0.05},
		},
		{
			name: "unknown shares that leave no floor are scaled down",
			in:   []RegionInput{ok("us-east", 300, 0), unknown("eu-west", 0.5), unknown("ap-south", 0.5)},
			want: map[string]float64{"us-east": 0.05, "eu-west": 0.475, "ap-south": 0.475},
		},
		{
			name: "unknown and dark only: the unknown absorbs the dark share",
			in:   []RegionInput{unknown("us-east", 0.6), dark("eu-west", 0.4)},
			want: map[string]float64{"us-east": 0.95, "eu-west": 0.05},
		},
		{
			name: "every region dark: shares kept",
			in:   []RegionInput{dark("us-east", 0.6), dark("eu-west", 0.4)},
			want: map[string]float64{"us-east": 0.6, "eu-west": 0.4},
		},
		{
			name: "no traffic anywhere: equal split",
			in:   []RegionInput{ok("us-east", 0, 0.9), ok("eu-west", 0, 0.1)},
			want: map[string]float64{"us-east": 0.5, "eu-west": 0.5},
		},
		{
			// eu-west peaked at 600 rps ten minutes ago: the reserve is 300 rps now.
			// Demand .5/.15, headroom .125/.0375, reserve .1125 to eu-west, the .075 left
			// equally.
			name:  "decayed peak reserve",
			in:    []RegionInput{ok("us-east", 500, 0.5), ok("eu-west", 150, 0.5)},
			state: State{At: t0.Add(-10 * time.Minute), Regions: map[string]RegionState{"eu-west": {Peak: 600, Status: StatusOK}}},
			want:  map[string]float64{"us-east": 0.6625, "eu-west": 0.3375},
		},
		{
			name: "one region",
			in:   []RegionInput{ok("us-east", 5000, 1)},
			want: map[string]float64{"us-east": 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Allocate(DefaultConfig(len(tc.in)), limit, t0, tc.in, tc.state)
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, DefaultConfig(len(tc.in)), tc.in, a)
			for r, want := range tc.want {
				if got := a.Shares[r]; math.Abs(got-want) > 1e-9 {
					t.Errorf("share of %s = %.6f, want %.6f (all: %v)", r, got, want, a.Shares)
				}
			}
		})
	}
}

func TestAllocateExplains(t *testing.T) {
	in := []RegionInput{ok("us-east", 600, 0.5), unknown("eu-west", 0.3), dark("ap-south", 0.2)}
	a, err := Allocate(DefaultConfig(3), limit, t0, in, State{})
	if err != nil {
		t.Fatal(err)
	}
	want := []RegionAllocation{
		{Region: "us-east", Status: StatusOK, Demand: 600, Peak: 600, Previous: 0.5, Share: 0.65, Basis: BasisWaterfill},
		{Region: "eu-west", Status: StatusUnknown, Previous: 0.3, Share: 0.3, Basis: BasisKept},
		{Region: "ap-south", Status: StatusDark, Previous: 0.2, Share: 0.05, Basis: BasisFloor},
	}
	for i, w := range want {
		g := a.Regions[i]
		if g.Region != w.Region || g.Status != w.Status || g.Basis != w.Basis ||
			math.Abs(g.Demand-w.Demand) > 1e-9 || math.Abs(g.Peak-w.Peak) > 1e-9 ||
			g.Previous != w.Previous || math.Abs(g.Share-w.Share) > 1e-9 {
			t.Errorf("region %d = %+v, want %+v", i, g, w)
		}
	}
}

func TestPeakReserveState(t *testing.T) {
	cfg := DefaultConfig(2)
	st := State{}
	step := func(at time.Duration, euDemand float64) State {
		t.Helper()
		a, err := Allocate(cfg, limit, t0.Add(at), []RegionInput{ok("us-east", 100, 0.5), ok("eu-west", euDemand, 0.5)}, st)
		if err != nil {
			t.Fatal(err)
		}
		return a.State
	}
	st = step(0, 400)
	if got := st.Regions["eu-west"].Peak; got != 400 {
		t.Fatalf("peak after first sample = %v, want 400 (fast attack)", got)
	}
	st = step(10*time.Minute, 50)
	if got := st.Regions["eu-west"].Peak; math.Abs(got-200) > 1e-9 {
		t.Fatalf("peak one half-life later = %v, want 200", got)
	}
	st = step(10*time.Minute+time.Second, 900)
	if got := st.Regions["eu-west"].Peak; got != 900 {
		t.Fatalf("peak after a spike = %v, want 900 (fast attack)", got)
	}
	// A clock that steps back does not grow the peak or move At backwards.
	before := st
	st = step(0, 10)
	if st.At != before.At || st.Regions["eu-west"].Peak != 900 {
		t.Fatalf("state after a clock step back = %+v, want peak 900 at %v", st, before.At)
	}
	// Unknown is no news: the last known status is kept.
	a, err := Allocate(cfg, limit, t0.Add(time.Hour), []RegionInput{dark("us-east", 0.5), unknown("eu-west", 0.5)}, st)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.State.Regions; got["us-east"].Status != StatusDark || got["eu-west"].Status != StatusOK {
		t.Fatalf("statuses = %+v, want us-east dark, eu-west still ok", got)
	}
}

// TestOverloadConverges closes the loop: 70/30 demand above the limit, shares starting at
// 50/50, each region admitting what its share allows. Water-filling reaches the weighted
// max-min answer in one write and then stays put.
func TestOverloadConverges(t *testing.T) {
	cfg := DefaultConfig(2)
	shares := map[string]float64{"us-east": 0.5, "eu-west": 0.5}
	var st State
	writes := 0
	for run := range 5 {
		in := []RegionInput{ok("us-east", 1400, shares["us-east"]), ok("eu-west", 600, shares["eu-west"])}
		d, err := Decide(cfg, limit, t0.Add(time.Duration(run)*5*time.Minute), in, st, FullRun)
		if err != nil {
			t.Fatal(err)
		}
		st = d.Allocation.State
		if d.Write {
			writes++
			for r, s := range d.First {
				shares[r] = s
			}
			for r, s := range d.Second {
				shares[r] = s
			}
		}
	}
	if math.Abs(shares["us-east"]-0.7) > 1e-9 || math.Abs(shares["eu-west"]-0.3) > 1e-9 || writes != 1 {
		t.Fatalf("after 5 runs: shares %v with %d writes, want 0.7/0.3 with 1 write", shares, writes)
	}
}

// TestAllowedFreezes shows why offered demand is used: with shares from allowed traffic,
// a region throttled at its share never shows more than its share.
func TestAllowedFreezes(t *testing.T) {
	in := []RegionInput{ok("us-east", 1400, 0.5), ok("eu-west", 600, 0.5)}
	allowed := in[0].Short.Allowed / (in[0].Short.Allowed + in[1].Short.Allowed)
	if allowed != 0.5 {
		t.Fatalf("proportional-to-allowed share = %v; the test premise is a fixed point at 0.5", allowed)
	}
	a, err := Allocate(DefaultConfig(2), limit, t0, in, State{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Shares["us-east"] != 0.7 {
		t.Fatalf("water-filling share = %v, want 0.7", a.Shares["us-east"])
	}
}

func TestAllocateErrors(t *testing.T) {
	good := func() []RegionInput { return []RegionInput{ok("us-east", 100, 0.5), ok("eu-west", 100, 0.5)} }
	tests := []struct {
		name  string
		cfg   func(*Config)
		limit regions.Limit
		in    func([]RegionInput) []RegionInput
	}{
		{name: "no regions", in: func([]RegionInput) []RegionInput { return nil }},
		{name: "duplicate region", in: func(in []RegionInput) []RegionInput { in[1].Region = "us-east"; return in }},
		{name: "bad region id", in: func(in []RegionInput) []RegionInput { in[0].Region = "us east"; return in }},
		{name: "bad status", in: func(in []RegionInput) []RegionInput { in[0].Status = "stale"; return in }},
		{name: "NaN share", in: func(in []RegionInput) []RegionInput { in[0].Share = math.NaN(); return in }},
		{name: "share above 1", in: func(in []RegionInput) []RegionInput { in[0].Share = 1.5; return in }},
		{name: "negative rate", in: func(in []RegionInput) []RegionInput { in[0].Short.Throttled = -1; return in }},
		{name: "infinite rate", in: func(in []RegionInput) []RegionInput { in[0].Long.Allowed = math.Inf(1); return in }},
		{name: "offered overflows", in: func(in []RegionInput) []RegionInput {
			in[0].Short = Rates{Allowed: math.MaxFloat64, Throttled: math.MaxFloat64}
			return in
		}},
		{name: "zero refill", limit: regions.Limit{Capacity: 1}},
		{name: "NaN refill", limit: regions.Limit{Capacity: 1, RefillPerSecond: math.NaN()}},
		{name: "floor too big", cfg: func(c *Config) { c.Floor = 0.6 }},
		{name: "zero floor", cfg: func(c *Config) { c.Floor = 0 }},
		{name: "negative headroom", cfg: func(c *Config) { c.Headroom = -0.1 }},
		{name: "zero half-life", cfg: func(c *Config) { c.PeakHalfLife = 0 }},
		{name: "fast-path threshold 1", cfg: func(c *Config) { c.FastPathThrottle = 1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig(2)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			l := limit
			if tc.limit != (regions.Limit{}) {
				l = tc.limit
			}
			in := good()
			if tc.in != nil {
				in = tc.in(in)
			}
			if _, err := Allocate(cfg, l, t0, in, State{}); !errors.Is(err, ErrInvalid) && !errors.Is(err, regions.ErrInvalid) {
				t.Fatalf("err = %v, want an invalid-input error", err)
			}
		})
	}
}

func TestDefaultConfig(t *testing.T) {
	for n, want := range map[int]float64{1: 0.05, 2: 0.05, 10: 0.05, 11: 0.5 / 11, 40: 0.0125} {
		cfg := DefaultConfig(n)
		if math.Abs(cfg.Floor-want) > 1e-15 {
			t.Errorf("DefaultConfig(%d).Floor = %v, want %v", n, cfg.Floor, want)
		}
		if err := cfg.Validate(n); err != nil {
			t.Errorf("DefaultConfig(%d): %v", n, err)
		}
	}
}

func TestRegionStatus(t *testing.T) {
	if RegionStatus(false, true) != StatusDark || RegionStatus(true, false) != StatusUnknown || RegionStatus(true, true) != StatusOK {
		t.Fatal("RegionStatus: want dark without heartbeat, unknown without a fresh sample, else ok")
	}
}

// checkInvariants asserts what every allocation guarantees.
func checkInvariants(t *testing.T, cfg Config, in []RegionInput, a Allocation) {
	t.Helper()
	if len(a.Shares) != len(in) || len(a.Regions) != len(in) {
		t.Fatalf("%d shares and %d explanations for %d regions", len(a.Shares), len(a.Regions), len(in))
	}
	sum := 0.0
	for _, r := range in {
		s, ok := a.Shares[r.Region]
		if !ok || math.IsNaN(s) || s < cfg.Floor-1e-12 || s > 1 {
			t.Fatalf("share of %s = %v (present %v), want in [%v, 1]", r.Region, s, ok, cfg.Floor)
		}
		sum += s
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Fatalf("shares %v sum to %.12f, want 1 within 1e-9", a.Shares, sum)
	}
	if err := regions.ValidateShares(a.Shares, regionNames(in)); err != nil {
		t.Fatal(err)
	}
}

func regionNames(in []RegionInput) []string {
	out := make([]string, len(in))
	for i, r := range in {
		out[i] = r.Region
	}
	return out
}
