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
