package sim

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

const smallTrace = `# a comment
# regions,us-east,eu-west
# event,20,*,eu-west dark
# event,40,shop,back
time_seconds,region,tenant,offered_rps

0,us-east,shop,700
0,eu-west,shop,300
0,us-east,blog,5
20,us-east,shop,1000
40, us-east , shop , 700.5
40,eu-west,shop,300
59,eu-west,blog,1
`

func TestParseTrace(t *testing.T) {
	tr, err := ParseTrace(strings.NewReader(smallTrace))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tr.Regions, ","); got != "us-east,eu-west" {
		t.Errorf("regions = %s", got)
	}
	if got := strings.Join(tr.Tenants, ","); got != "shop,blog" {
		t.Errorf("tenants = %s", got)
	}
	if tr.Seconds() != 60 {
		t.Errorf("seconds = %d, want 60", tr.Seconds())
	}
	wantEvents := []Event{{20, "*", "eu-west dark"}, {40, "shop", "back"}}
	if len(tr.Events) != 2 || tr.Events[0] != wantEvents[0] || tr.Events[1] != wantEvents[1] {
		t.Errorf("events = %+v, want %+v", tr.Events, wantEvents)
	}
	// Rows hold until the next time point; a region without rows is dark; a tenant
	// without a row in a live region offers 0.
	r := newRun(tr, Policy{kind: Static}, DefaultConfig(), []float64{0.5, 0.5})
	for _, c := range []struct {
		t      int
		region int
		live   bool
	}{{0, 1, true}, {19, 1, true}, {20, 1, false}, {39, 1, false}, {40, 1, true}, {58, 0, true}, {59, 0, false}} {
		if r.live[c.region][c.t] != c.live {
			t.Errorf("region %s live at %d s = %v, want %v", tr.Regions[c.region], c.t, r.live[c.region][c.t], c.live)
		}
	}
}

func TestParseTraceRegionsFromRows(t *testing.T) {
	tr, err := ParseTrace(strings.NewReader(Header + "\r\n0,b,x,1\r\n0,a,x,2\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tr.Regions, ","); got != "b,a" {
		t.Fatalf("regions = %s, want the order of first appearance b,a", got)
	}
}

func TestParseTraceErrors(t *testing.T) {
	h := Header + "\n"
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", "no header"},
		{"comments only", "# x\n# y\n", "no header"},
		{"no rows", h, "no rows"},
		{"wrong header", "time,region,tenant,rps\n", "line 1: want the header"},
		{"row before header", "# c\n0,us-east,shop,1\n", "line 2: want the header"},
		{"three fields", h + "0,us-east,shop\n", "line 2: want 4 fields"},
		{"five fields", h + "0,us-east,shop,1,2\n", "line 2: want 4 fields"},
		{"fractional time", h + "0.5,us-east,shop,1\n", "line 2: time_seconds"},
		{"negative time", h + "-1,us-east,shop,1\n", "line 2: time_seconds"},
		{"time too large", h + "999999999,us-east,shop,1\n", "line 2: time_seconds"},
		{"time goes back", h + "10,us-east,shop,1\n5,us-east,shop,1\n", "line 3: time 5 is before the previous row's 10"},
		{"duplicate row", h + "0,us-east,shop,1\n0,us-east,shop,2\n", "line 3: second row for region us-east tenant shop"},
		{"bad region id", h + "0,us east,shop,1\n", "line 2: invalid region id"},
		{"bad tenant id", h + "0,us-east,*,1\n", "line 2: invalid tenant id"},
		{"region not listed", "# regions,us-east\n" + h + "0,eu-west,shop,1\n", "line 3: region \"eu-west\" is not in the # regions line"},
		{"regions twice", "# regions,a\n# regions,b\n" + h, "line 2: # regions must come once"},
		{"regions after rows", h + "0,a,shop,1\n# regions,a\n", "line 3: # regions must come once"},
		{"region listed twice", "# regions,a,a\n", "line 1: region a listed twice"},
		{"empty region in list", "# regions,a,,b\n", "line 1: invalid region id"},
		{"NaN offered", h + "0,a,shop,NaN\n", "line 2: offered_rps"},
		{"negative offered", h + "0,a,shop,-3\n", "line 2: offered_rps"},
		{"infinite offered", h + "0,a,shop,+Inf\n", "line 2: offered_rps"},
		{"text offered", h + "0,a,shop,lots\n", "line 2: offered_rps"},
		{"event without label", "# event,5,*\n" + h + "0,a,shop,1\n", "line 1: want # event"},
		{"event empty label", "# event,5,*, \n" + h + "0,a,shop,1\n", "line 1: event label"},
		{"event bad time", "# event,soon,*,x\n" + h + "0,a,shop,1\n", "line 1: event time"},
		{"event bad tenant", "# event,0,a b,x\n" + h + "0,a,shop,1\n", "line 1: event: invalid tenant id"},
		{"untracked bad tenant", "# untracked,a b\n" + h + "0,a,shop,1\n", "line 1: untracked: invalid tenant id"},
		{"untracked without rows", "# untracked,ghost\n" + h + "0,a,shop,1\n", "untracked tenant ghost has no rows"},
		{"region change without region", "# region-added,5\n" + h + "0,a,shop,1\n", "line 1: want # region-added,TIME_SECONDS,REGION"},
		{"region change bad time", "# region-removed,soon,a\n" + h + "0,a,shop,1\n", "line 1: region-removed time"},
		{"region change bad region", "# region-added,0,a b\n" + h + "0,a,shop,1\n", "line 1: invalid region id"},
		{"region change not in the regions line", "# regions,a\n# region-added,0,b\n" + h + "0,a,shop,1\n", "line 2: region \"b\" is not in the # regions line"},
		{"region changes out of order", "# region-added,9,b\n# region-removed,5,b\n" + h + "0,a,shop,1\n", "line 2: region changes must be in time order"},
		{"region change after the end", "# region-added,50,b\n" + h + "0,a,shop,1\n", "region b changes at 50 s, after the trace ends"},
		{"event unknown tenant", "# event,0,blog,x\n" + h + "0,a,shop,1\n", "event \"x\" names tenant blog, which has no rows"},
		{"event after the end", "# event,10,*,x\n" + h + "0,a,shop,1\n", "event \"x\" at 10 s is after the trace ends (1 s)"},
		{"line too long", h + strings.Repeat("9", 5000) + "\n", "line 2: longer than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(tc.in))
			if err == nil || !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want an ErrTrace containing %q", err, tc.want)
			}
		})
	}
}

// FuzzParseTrace: the parser never panics, and whatever it accepts is well formed and
// simulates (short traces) with waterfill's guarantees: valid shares and no
// over-admission.
func FuzzParseTrace(f *testing.F) {
	f.Add(smallTrace)
	f.Add(Header + "\n0,a,x,1\n")
	f.Add("# regions,a,b\n# event,0,*,go\n" + Header + "\n0,a,x,5000\n0,b,x,10\n30,b,x,3000\n")
	f.Add("#regions,a\n" + Header + "\n0,a,x,1e9\n")
	f.Fuzz(func(t *testing.T, in string) {
		tr, err := ParseTrace(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrTrace) {
				t.Fatalf("error %v does not wrap ErrTrace", err)
			}
			return
		}
		if tr.Seconds() < 1 || len(tr.Regions) == 0 || len(tr.Tenants) == 0 {
			t.Fatalf("accepted an empty trace: %d s, %d regions, %d tenants", tr.Seconds(), len(tr.Regions), len(tr.Tenants))
		}
		prev := -1
		for _, p := range tr.points {
			if p.t <= prev {
				t.Fatalf("time points out of order: %d after %d", p.t, prev)
			}
			prev = p.t
			for _, r := range p.rows {
				if r.region >= len(tr.Regions) || r.tenant >= len(tr.Tenants) || math.IsNaN(r.offered) || r.offered < 0 {
					t.Fatalf("bad row %+v", r)
				}
			}
		}
		for _, e := range tr.Events {
			if e.At < 0 || e.At >= tr.Seconds() {
				t.Fatalf("event %+v outside the trace", e)
			}
		}
		if tr.Seconds() > 900 || len(tr.Tenants) > 3 {
			return
		}
		cfg := DefaultConfig()
		cfg.Interval, cfg.CheckInterval = 2*time.Minute, time.Minute
		rep, err := Run(tr, Policy{kind: Waterfill}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rep.OverAdmission > overAdmissionBound(tr, cfg) || math.IsNaN(rep.UnnecessaryThrottle) {
			t.Fatalf("waterfill over-admitted %v (unnecessary %v)", rep.OverAdmission, rep.UnnecessaryThrottle)
		}
	})
}
