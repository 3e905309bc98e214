package loadgen

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestCheckLoopback(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"http://127.0.0.1:8080/x", true},
		{"http://127.5.6.7/", true},
		{"http://[::1]:80/", true},
		{"http://localhost:1/", true},
		{"http://10.0.0.1/", false},
		{"http://192.168.1.1/", false},
		{"http://example.com/", false},
		{"http://8.8.8.8/", false},
	} {
		err := CheckLoopback(tc.url)
		if tc.ok != (err == nil) {
			t.Errorf("CheckLoopback(%q) = %v, want ok=%v", tc.url, err, tc.ok)
		}
		if !tc.ok && !errors.Is(err, ErrNotLoopback) {
			t.Errorf("CheckLoopback(%q) = %v, want ErrNotLoopback", tc.url, err)
		}
	}
}

func TestRunRefusesNonLoopbackAndUnboundedRuns(t *testing.T) {
	ctx := context.Background()
	if _, err := Run(ctx, []Stream{{Name: "x", URL: "http://10.1.2.3/", Rate: Constant(1)}}, time.Second, nil); !errors.Is(err, ErrNotLoopback) {
		t.Fatalf("non-loopback target: err = %v", err)
	}
	if _, err := Run(ctx, nil, 0, nil); err == nil {
		t.Fatal("a zero duration was accepted")
	}
	if _, err := Run(ctx, nil, MaxDuration+time.Second, nil); err == nil {
		t.Fatal("a duration over MaxDuration was accepted")
	}
}

func TestRunSendsAboutTheRate(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("X-Api-Key") != "k" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	h := http.Header{"X-Api-Key": []string{"k"}}
	res, err := Run(context.Background(), []Stream{
		{Name: "a", URL: srv.URL, Header: h, Rate: Constant(200)},
		{Name: "b", URL: srv.URL, Rate: Steps([]time.Duration{500 * time.Millisecond}, []float64{0, 100})},
	}, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("got %d results", len(res))
	}
	a, b := res[0], res[1]
	// Open-loop pacing is exact in count; allow a little for the run's edges.
	if a.Requests < 180 || a.Requests > 201 || a.Codes[http.StatusNoContent] != a.Requests {
		t.Errorf("stream a: %d requests, codes %v; want ~200 all 204", a.Requests, a.Codes)
	}
	if b.Requests < 40 || b.Requests > 51 || b.Codes[http.StatusUnauthorized] != b.Requests {
		t.Errorf("stream b: %d requests, codes %v; want ~50 (0/s then 100/s for 0.5 s) all 401", b.Requests, b.Codes)
	}
	if got := uint64(hits.Load()); got != a.Requests+b.Requests {
		t.Errorf("server saw %d, results count %d", got, a.Requests+b.Requests)
	}
}

// TestPaceWaitsOutRateZero: vegeta sends a hit after every wait Pace returns, so while the
// rate is 0 the wait must reach to where the rate is positive again.
func TestPaceWaitsOutRateZero(t *testing.T) {
	t.Parallel()
	rate := Steps([]time.Duration{time.Second}, []float64{0, 100})
	p := &pacer{rate: rate, end: 2 * time.Second}
	for e := time.Duration(0); e < time.Second; e += 10 * time.Millisecond {
		wait, stop := p.Pace(e, 0)
		if stop || e+wait < time.Second {
			t.Fatalf("Pace(%v, 0) = %v, %v: a hit during the zero phase", e, wait, stop)
		}
	}
}

// simulate drives p as vegeta's Attack does (v12 lib/attack.go): ask Pace, sleep the wait,
// send a hit; until Pace stops or the attack's duration is over. It returns when each hit
// went out.
func simulate(t *testing.T, p *pacer) []time.Duration {
	t.Helper()
	var sent []time.Duration
	for elapsed := time.Duration(0); elapsed <= p.end; {
		wait, stop := p.Pace(elapsed, uint64(len(sent)))
		if stop {
			break
		}
		if wait < 0 {
			t.Fatalf("Pace(%v, %d) waits %v", elapsed, len(sent), wait)
		}
		elapsed += wait
		sent = append(sent, elapsed)
		if len(sent) > 1e5 {
			t.Fatal("no end to the hits")
		}
	}
	return sent
}

func TestPaceSchedule(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct {
		name        string
		rate        func(time.Duration) float64
		end         time.Duration
		first, last time.Duration // every hit is in [first, last]
		minN, maxN  int
	}{
		{"constant", Constant(200), time.Second, 5 * ms, time.Second, 199, 200},
		{"zero for 1s, then 100/s", Steps([]time.Duration{time.Second}, []float64{0, 100}), 2 * time.Second, 1010 * ms, 2 * time.Second, 99, 100},
		{"100/s, then zero", Steps([]time.Duration{500 * ms}, []float64{100, 0}), 2 * time.Second, 10 * ms, 500 * ms, 49, 50},
		{"zero, 100/s, zero", Steps([]time.Duration{300 * ms, 600 * ms}, []float64{0, 100, 0}), 2 * time.Second, 310 * ms, 600 * ms, 29, 30},
		// A hit due at 2 s under the rate of 1 s would land in the zero phase.
		{"1/s until 1.5s, then zero", Steps([]time.Duration{1500 * ms}, []float64{1, 0}), 3 * time.Second, 999 * ms, 1001 * ms, 1, 1},
		{"zero throughout", Constant(0), time.Second, 0, 0, 0, 0},
		{"negative", Constant(-5), time.Second, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sent := simulate(t, &pacer{rate: tc.rate, end: tc.end})
			if len(sent) < tc.minN || len(sent) > tc.maxN {
				t.Fatalf("%d hits, want %d-%d", len(sent), tc.minN, tc.maxN)
			}
			for i, at := range sent {
				if at < tc.first || at > tc.last {
					t.Fatalf("hit %d at %v, want every hit in [%v, %v]", i+1, at, tc.first, tc.last)
				}
			}
		})
	}
}
