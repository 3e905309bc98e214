package job_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// staticDemand is a demand.Reader's answer set by the test. The interleaving tests are
// about what PostgreSQL lets through; where the demand comes from plays no part, and a
// real Prometheus would only make each step slower and less predictable.
type staticDemand struct{ d atomic.Pointer[demand.Demand] }

// set makes the region totals offered (allowed, none throttled) per region.
func (s *staticDemand) set(offered map[string]float64) {
	g := map[string]demand.Sample{}
	for r, v := range offered {
		rt := demand.Rates{Allowed: v}
		g[r] = demand.Sample{Long: rt, Short: rt, LastSeen: time.Now()}
	}
	s.d.Store(&demand.Demand{At: time.Now(), Scopes: map[regions.Scope]map[string]demand.Sample{regions.GlobalScope: g}})
}

func (s *staticDemand) Read(context.Context, time.Time) (demand.Demand, error) {
	return *s.d.Load(), nil
}

// world is a migrated database with live regions and no shares.
type world struct {
	url   string
	store *store.Store
	dem   *staticDemand
}

func newWorld(t *testing.T, regs ...string) *world {
	t.Helper()
	url := migratedDB(t)
	st, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	for _, r := range regs {
		if err := st.AddRegion(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		if err := st.Heartbeat(t.Context(), "gw-"+r, r); err != nil {
			t.Fatal(err)
		}
	}
	return &world{url: url, store: st, dem: &staticDemand{}}
}

func (w *world) job(t *testing.T, reg prometheus.Registerer, mod func(*job.Config)) *job.Job {
	t.Helper()
	cfg := job.Config{Interval: time.Hour, CheckInterval: time.Minute, ReloadWait: time.Millisecond,
		InstanceTTL: time.Hour, Registerer: reg}
	if mod != nil {
		mod(&cfg)
	}
	j, err := job.New(cfg, w.store, w.dem)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// globalShares is the "*" rebalancer rows by region.
func (w *world) globalShares(t *testing.T) map[string]float64 {
	t.Helper()
	all, err := w.store.Shares(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, s := range all {
		if s.Scope == regions.GlobalScope && s.Source == regions.SourceRebalancer {
			out[s.Region] = s.Share
		}
	}
	return out
}

func sumOf(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}

// pauseAt returns a Hook that, the first time the job reaches point, reports on reached
// and waits for resume.
func pauseAt(point string, reached chan<- struct{}, resume <-chan struct{}) func(context.Context, string) {
	var once sync.Once
	return func(ctx context.Context, p string) {
		if p != point {
			return
		}
		once.Do(func() {
			close(reached)
			select {
			case <-resume:
			case <-ctx.Done():
			}
		})
	}
}

// terminateLockHolder ends the session holding the rebalancer's advisory lock, as an
// operator ending a stuck session (or a network failure) would.
func terminateLockHolder(t *testing.T, w *world) {
	t.Helper()
	var n int
	if err := w.store.Pool().QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminate the lock holder: %d sessions, %v", n, err)
	}
}

// TestSplitBrainIsFenced (issue 17, item 1): rebalancer A writes its decreases; its lock
// session is terminated while it waits before the increases; B takes the lock and runs a
// full cycle the other way; then A tries its stale increases. They must be refused
// (counted as fenced), or us-east 0.9 + eu-west 0.9 = 1.8.
func TestSplitBrainIsFenced(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "us-east", "eu-west")
	w.dem.set(map[string]float64{"us-east": 90, "eu-west": 10})
	reached, resume := make(chan struct{}), make(chan struct{})
	elA, elB := newElector(t, w.url), newElector(t, w.url)
	regA := prometheus.NewPedanticRegistry()
	a := w.job(t, regA, func(c *job.Config) {
		c.Elector, c.Hook = elA, pauseAt(job.HookDecreasesWritten, reached, resume)
	})
	b := w.job(t, nil, func(c *job.Config) { c.Elector = elB })

	if err := elA.IsLeader(t.Context()); err != nil {
		t.Fatal(err)
	}
	var repA job.Report
	doneA := make(chan struct{})
	go func() {
		defer close(doneA)
		repA, _ = a.RunOnce(t.Context())
	}()
	<-reached // A wrote eu-west 0.1 and waits to write us-east 0.9
	if got := w.globalShares(t); math.Abs(got["eu-west"]-0.1) > 1e-9 {
		t.Fatalf("after A's decreases: %v, want eu-west 0.1", got)
	}
	terminateLockHolder(t, w)
	if err := elB.IsLeader(t.Context()); err != nil {
		t.Fatalf("B could not take the lock after A's session ended: %v", err)
	}
	w.dem.set(map[string]float64{"us-east": 10, "eu-west": 90})
	if rep, err := b.RunOnce(t.Context()); err != nil || rep.Result != job.ResultOK {
		t.Fatalf("B's run: %v %v", rep.Result, err)
	}
	close(resume)
	<-doneA

	got := w.globalShares(t)
	if s := sumOf(got); math.Abs(s-1) > 1e-9 {
		t.Fatalf("shares %v sum to %v after the split-brain interleaving, want 1", got, s)
	}
	if repA.Result != job.ResultFenced || !errors.Is(repA.Err, store.ErrFenced) {
		t.Errorf("A's run: result %q err %v, want %q (store.ErrFenced)", repA.Result, repA.Err, job.ResultFenced)
	}
	if n := metric(t, regA, "ratelimit_rebalancer_writes_refused_total", "reason", job.ResultFenced); n != 1 {
		t.Errorf("A's fenced writes counted %v, want 1", n)
	}
	if n := metric(t, regA, "ratelimit_rebalancer_runs_total", "result", job.ResultFenced); n != 1 {
		t.Errorf("A's fenced runs counted %v, want 1", n)
	}
	// A's decrease (eu-west 0.5 -> 0.1) committed before it was fenced: it is a write.
	if n := metric(t, regA, "ratelimit_rebalancer_share_writes_total"); n != 1 || repA.Written != 1 {
		t.Errorf("A's committed decrease: share_writes_total %v, report %d; want 1", n, repA.Written)
	}
}

// TestStaleIncreaseIsAbandoned (issue 17, item 2): a region removed (--force, which
// renormalises the rest) between a run's decreases and its increases; the increase was
// computed from rows that no longer hold, so it must not land (sum 1.07 otherwise), and
// the run is counted as a conflict.
func TestStaleIncreaseIsAbandoned(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "us-east", "eu-west", "ap-south")
	w.dem.set(map[string]float64{"us-east": 60, "eu-west": 30, "ap-south": 10})
	reached, resume := make(chan struct{}), make(chan struct{})
	reg := prometheus.NewPedanticRegistry()
	j := w.job(t, reg, func(c *job.Config) { c.Hook = pauseAt(job.HookDecreasesWritten, reached, resume) })
	var rep job.Report
	done := make(chan struct{})
	go func() {
		defer close(done)
		rep, _ = j.RunOnce(t.Context())
	}()
	<-reached
	if err := w.store.RemoveRegion(t.Context(), "ap-south", store.DropShares); err != nil {
		t.Fatal(err)
	}
	close(resume)
	<-done
	got := w.globalShares(t)
	if s := sumOf(got); math.Abs(s-1) > 1e-9 || len(got) != 2 {
		t.Fatalf("shares %v (sum %v) after a region removal between the writes, want us-east and eu-west summing to 1", got, s)
	}
	// Issue 22: the run that lost the race decides again at once from a fresh read, so the
	// scope holds what a correct run over the two regions writes (60/30 rps: 2/3, 1/3),
	// not the three-region plan rescaled by the removal, and it says so.
	sharesNear(t, "* after the race", got, map[string]float64{"us-east": 2.0 / 3, "eu-west": 1.0 / 3}, 0.01)
	if rep.Result != job.ResultOK || rep.Retried != job.ResultConflict {
		t.Errorf("run: result %q retried %q err %v, want %q after a retry of a %q", rep.Result, rep.Retried, rep.Err, job.ResultOK, job.ResultConflict)
	}
	if n := metric(t, reg, "ratelimit_rebalancer_writes_refused_total", "reason", job.ResultConflict); n != 1 {
		t.Errorf("conflicts counted %v, want 1", n)
	}
	if n := metric(t, reg, "ratelimit_rebalancer_runs_total", "result", job.ResultConflict); n != 1 {
		t.Errorf("runs_total{result=conflict} = %v, want 1", n)
	}
	if n := metric(t, reg, "ratelimit_rebalancer_retries_total", "reason", job.ResultConflict); n != 1 {
		t.Errorf("retries_total{reason=conflict} = %v, want 1", n)
	}
	// The history's old values are the values replaced, and the stale three-region plan's
	// increase (us-east 0.6 of 60/30/10 rps) never landed; the retry's 2/3 did.
	h, err := w.store.History(t.Context(), store.HistoryFilter{Scope: &regions.GlobalScope})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range h {
		if e.Region == "us-east" && e.Source == regions.SourceRebalancer && e.Old != nil && e.New != nil && *e.New > *e.Old+1e-9 && math.Abs(*e.New-0.6) < 1e-6 {
			t.Errorf("history shows the stale increase landing: %v -> %v", *e.Old, *e.New)
		}
	}
}

// TestCheckHealsHalfWrittenRun: the decreases committed, the increases were refused (a
// concurrent change); the scope sums below 1, and the next fast-path check — not only the
// next full run — writes it back to 1.
func TestCheckHealsHalfWrittenRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "us-east", "eu-west", "ap-south")
	w.dem.set(map[string]float64{"us-east": 60, "eu-west": 30, "ap-south": 10})
	reached, resume := make(chan struct{}), make(chan struct{})
	j := w.job(t, nil, func(c *job.Config) {
		c.Hook, c.NoRetry = pauseAt(job.HookDecreasesWritten, reached, resume), true
	})
	done := make(chan struct{})
	var rep job.Report
	go func() {
		defer close(done)
		rep, _ = j.RunOnce(t.Context())
	}()
	<-reached
	// Another writer lowers a row the run wrote: its increase no longer applies.
	if _, err := w.store.Pool().Exec(t.Context(), `UPDATE region_share SET share = share - 0.01 WHERE scope = '*' AND region = 'eu-west'`); err != nil {
		t.Fatal(err)
	}
	close(resume)
	<-done
	if rep.Result != job.ResultConflict {
		t.Fatalf("run: %q %v, want conflict", rep.Result, rep.Err)
	}
	if rep.Retried != "" {
		t.Fatalf("run retried (%q) although NoRetry is set", rep.Retried)
	}
	if s := sumOf(w.globalShares(t)); s > 1-0.01 {
		t.Fatalf("after the refused increase the shares sum to %v; the test needs them below 1", s)
	}
	if rep, err := j.Check(t.Context()); err != nil || rep.Result != job.ResultOK {
		t.Fatalf("check: %q %v", rep.Result, err)
	}
	got := w.globalShares(t)
	if s := sumOf(got); math.Abs(s-1) > 1e-9 || len(got) != 3 {
		t.Fatalf("after the next check: %v sums to %v, want 1 over 3 regions", got, s)
	}
}
