package status_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/rebalancer/status"
	"github.com/quotaplane/quotaplane/regions"
)

// fixedDemand is a demand reader with the same answer every time.
type fixedDemand struct{}

func (fixedDemand) Read(_ context.Context, now time.Time) (demand.Demand, error) {
	rt := demand.Rates{Allowed: 10}
	s := demand.Sample{Long: rt, Short: rt, LastSeen: now}
	return demand.Demand{At: now, Scopes: map[regions.Scope]map[string]demand.Sample{
		regions.GlobalScope: {usEast: s, euWest: s}}}, nil
}

// TestStaleRebalancerIsShown (issue 22): a leader whose tick hangs (here: a database call
// that never answers, as a hook that blocks) no longer ticks. The rebalancer logs and
// counts the overdue tick (ratelimit_rebalancer_overdue_total), keeps its last-tick
// timestamp old for an alert, and the status page shows the badge stale. Before, the
// page kept showing the last tick as if nothing were wrong.
func TestStaleRebalancerIsShown(t *testing.T) {
	t.Parallel()
	st := openStore(t, testenv.PostgresDB(t))
	for _, r := range []string{usEast, euWest} {
		if err := st.AddRegion(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		if err := st.Heartbeat(t.Context(), "gw-"+r, r); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu    sync.Mutex
		ticks int
	)
	hang := make(chan struct{})
	reg := prometheus.NewPedanticRegistry()
	j, err := job.New(job.Config{Interval: 200 * time.Millisecond, CheckInterval: 100 * time.Millisecond,
		ReloadWait: 50 * time.Millisecond, InstanceTTL: time.Hour, Registerer: reg,
		Hook: func(ctx context.Context, p string) {
			if p != job.HookLoaded {
				return
			}
			mu.Lock()
			ticks++
			n := ticks
			mu.Unlock()
			if n >= 3 { // the third tick hangs
				select {
				case <-hang:
				case <-ctx.Done():
				}
			}
		}}, st, fixedDemand{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	t.Cleanup(func() {
		close(hang)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	h, err := status.New(status.Config{LastRun: j.Last, StaleAfter: j.StaleAfter()}, st)
	if err != nil {
		t.Fatal(err)
	}
	page := func() status.Status {
		t.Helper()
		_, _, body := get(t, h, "/status.json")
		var s status.Status
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	waitUntil(t, 5*time.Second, "a tick", func() bool { return page().LastRun != nil })
	if s := page(); s.Stale {
		t.Fatalf("stale while ticking: %+v", s)
	}
	took := waitUntil(t, 10*time.Second, "overdue counted", func() bool {
		return gathered(t, reg, "ratelimit_rebalancer_overdue_total") == 1
	})
	t.Logf("overdue counted %v after the wait began (bound %v)", took, j.StaleAfter())
	if s := page(); !s.Stale || s.StaleAfterSeconds != j.StaleAfter().Seconds() {
		t.Errorf("page after the tick hung: stale %v (after %vs), want stale", s.Stale, s.StaleAfterSeconds)
	}
	_, _, body := get(t, h, "/")
	mustContain(t, "page", body, `<span class="badge stale"`, ">stale</span>")
	if last := gathered(t, reg, "ratelimit_rebalancer_last_tick_timestamp_seconds"); last <= 0 || time.Since(time.Unix(int64(last), 0)) < j.StaleAfter()-time.Second {
		t.Errorf("last tick timestamp %v: want an old, non-zero time", last)
	}
}

func waitUntil(t *testing.T, d time.Duration, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// gathered is the value of the single series of name in reg (0 if none).
func gathered(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			m := mf.GetMetric()[0]
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	return 0
}
