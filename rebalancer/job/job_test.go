package job_test

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

func TestRunWritesSharesAndHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemand70_30()
	e.waitHistory(t)
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, nil)

	rep, err := j.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Result != job.ResultOK || rep.Written != 4 {
		t.Fatalf("report = %+v, want ok with 4 shares written", rep)
	}
	for _, sc := range []regions.Scope{regions.GlobalScope, pair} {
		sharesNear(t, sc.String(), e.rebalancerShares(t, sc), expected70_30(t, sc), 0.02)
	}

	// History: one row per region changed, decreases a reload period before increases,
	// each holding the scope's inputs; us-east, which had no row, first gets one at its
	// current share with the decreases (so the scope's rows name every region between
	// the two writes).
	hist, err := e.store.History(t.Context(), store.HistoryFilter{Scope: &pair})
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 3 {
		t.Fatalf("history of %s: %d rows, want 3", pair, len(hist))
	}
	byRegion := map[string]store.HistoryEntry{} // the newest change of each region
	for _, h := range hist {
		if _, ok := byRegion[h.Region]; !ok {
			byRegion[h.Region] = h
		}
		if h.Actor != job.DefaultActor || h.Reason != rebalancer.ReasonInterval || h.Source != regions.SourceRebalancer {
			t.Errorf("history row %+v: want actor %s, reason %s", h, job.DefaultActor, rebalancer.ReasonInterval)
		}
		var in job.ScopeInputs
		if err := json.Unmarshal(h.Inputs, &in); err != nil {
			t.Fatalf("inputs %s: %v", h.Inputs, err)
		}
		if in.Scope != pair.String() || in.RefillPerSecond != 100 || len(in.Regions) != 2 {
			t.Errorf("inputs = %+v", in)
		}
		for _, r := range in.Regions {
			want := map[string]float64{usEast: 70, euWest: 30}[r.Region]
			if r.Status != rebalancer.StatusOK || math.Abs(r.OfferedLong-want) > 0.05*want || r.Previous != 0.5 {
				t.Errorf("inputs of %s = %+v, want ok, offered %v, previous 0.5", r.Region, r, want)
			}
		}
	}
	if gap := byRegion[usEast].At.Sub(byRegion[euWest].At); gap < reloadWait-50*time.Millisecond {
		t.Errorf("increase (us-east) written %s after the decrease (eu-west), want >= %s", gap, reloadWait)
	}

	if got := metric(t, reg, "ratelimit_rebalancer_runs_total", "result", job.ResultOK); got != 1 {
		t.Errorf("runs ok = %v, want 1", got)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_last_success_timestamp_seconds"); time.Since(time.Unix(int64(got), 0)) > time.Minute {
		t.Errorf("last success = %v, want now", got)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_share_ratio", "region", usEast, "scope", pair.String()); math.Abs(got-0.7) > 0.02 {
		t.Errorf("share ratio us-east %s = %v, want ~0.7", pair, got)
	}

	// A second run on the same demand changes nothing (hysteresis).
	rep, err = j.RunOnce(t.Context())
	if err != nil || rep.Written != 0 {
		t.Fatalf("second run: %+v, %v; want nothing written", rep, err)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_writes_skipped_total", "reason", rebalancer.ReasonHysteresis); got != 2 {
		t.Errorf("writes skipped for hysteresis = %v, want 2", got)
	}
}

func TestPrometheusDownKeepsShares(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemand70_30()
	e.waitHistory(t)
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, nil)
	if _, err := j.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := e.rebalancerShares(t, regions.GlobalScope)

	if err := e.prom.Stop(); err != nil {
		t.Fatal(err)
	}
	e.exp.SetRegion(usEast, 1, 0, 0) // would flip the split if it were seen
	rep, err := j.RunOnce(t.Context())
	if !errors.Is(err, demand.ErrUnavailable) || rep.Result != job.ResultSkippedPrometheus {
		t.Fatalf("run with Prometheus stopped: %s, %v; want skipped_prometheus", rep.Result, err)
	}
	sharesNear(t, "after the skipped run", e.rebalancerShares(t, regions.GlobalScope), before, 0)
	if got := metric(t, reg, "ratelimit_rebalancer_runs_total", "result", job.ResultSkippedPrometheus); got != 1 {
		t.Errorf("runs skipped_prometheus = %v, want 1", got)
	}
}

func TestDatabaseDownSkipsAndRetries(t *testing.T) {
	t.Parallel()
	pg := testenv.PostgresServer(t)
	dbURL, err := pg.CreateDatabase(t.Context(), "rebalancer")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, dbURL)
	e.setDemand70_30()
	e.waitHistory(t)
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, nil)

	stopPostgres(t, pg, dbURL)
	rep, _ := j.RunOnce(t.Context())
	if rep.Result != job.ResultSkippedDatabase {
		t.Fatalf("run with PostgreSQL stopped: %+v, want skipped_database", rep)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_runs_total", "result", job.ResultSkippedDatabase); got != 1 {
		t.Errorf("runs skipped_database = %v, want 1", got)
	}

	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Heartbeats older than the TTL would make both regions dark; the TTL is an hour.
	rep, err = j.RunOnce(t.Context())
	if err != nil || rep.Result != job.ResultOK || rep.Written != 4 {
		t.Fatalf("run after PostgreSQL came back: %+v, %v; want ok with 4 writes", rep, err)
	}
	sharesNear(t, "*", e.rebalancerShares(t, regions.GlobalScope), expected70_30(t, regions.GlobalScope), 0.02)
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemand70_30()
	e.waitHistory(t)
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, func(c *job.Config) { c.DryRun = true })
	rep, err := j.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Written != 0 || len(rep.Scopes) != 2 {
		t.Fatalf("dry run report = %+v, want 2 scopes and nothing written", rep)
	}
	for _, s := range rep.Scopes {
		if s.Skipped != job.SkipDryRun || s.Written {
			t.Errorf("scope %s: skipped %q written %v, want dry_run", s.Inputs.Scope, s.Skipped, s.Written)
		}
		// The computed shares are reported even though nothing is written.
		got := map[string]float64{}
		for _, r := range s.Inputs.Regions {
			got[r.Region] = r.Share
		}
		sc, _ := regions.ParseScope(s.Inputs.Scope)
		sharesNear(t, "dry run "+s.Inputs.Scope, got, expected70_30(t, sc), 0.02)
	}
	all, err := e.store.Shares(t.Context())
	if err != nil || len(all) != 0 {
		t.Fatalf("shares after a dry run: %v, %v; want none", all, err)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_writes_skipped_total", "reason", job.SkipDryRun); got != 2 {
		t.Errorf("writes skipped dry_run = %v, want 2", got)
	}
}

func TestOverrideWins(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemand70_30()
	pinned := map[string]float64{usEast: 0.2, euWest: 0.8}
	if err := e.store.SetOverride(t.Context(), pair, pinned, "alice", "incident 7", time.Hour); err != nil {
		t.Fatal(err)
	}
	e.waitHistory(t)
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, nil)
	rep, err := j.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := e.rebalancerShares(t, pair); len(got) != 0 {
		t.Errorf("rebalancer wrote %v for an overridden scope", got)
	}
	sharesNear(t, "*", e.rebalancerShares(t, regions.GlobalScope), expected70_30(t, regions.GlobalScope), 0.02)
	if rep.Written != 2 {
		t.Errorf("written = %d, want 2 (the * scope only)", rep.Written)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_writes_skipped_total", "reason", job.SkipOverride); got != 1 {
		t.Errorf("writes skipped override = %v, want 1", got)
	}
}

// TestDarkAndUnknownRegions: a region with no live gateway shrinks to the floor; a live
// region without fresh series keeps its share.
func TestDarkAndUnknownRegions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemand70_30()
	e.waitHistory(t)
	j := e.newJob(t, nil, nil)
	if _, err := j.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := e.rebalancerShares(t, pair)

	// eu-west's series vanish (its gateways still heartbeat): unknown, share kept.
	e.exp.RemoveRegion(euWest)
	e.exp.SetTenant(usEast, pair.Tenant, pair.Route, 100, 200)
	deadline := time.Now().Add(15 * time.Second)
	for {
		d, err := e.reader.Read(t.Context(), time.Time{})
		if _, known := d.Sample(pair, euWest); err == nil && !known {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("eu-west still known 15 s after its series vanished")
		}
		time.Sleep(250 * time.Millisecond)
	}
	rep, err := j.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Scopes {
		for _, r := range s.Inputs.Regions {
			if r.Region == euWest && r.Status != rebalancer.StatusUnknown {
				t.Errorf("scope %s: eu-west status %s, want unknown", s.Inputs.Scope, r.Status)
			}
		}
	}
	if got := e.rebalancerShares(t, pair)[euWest]; math.Abs(got-before[euWest]) > 1e-9 {
		t.Errorf("unknown eu-west share = %v, want kept at %v", got, before[euWest])
	}

	// eu-west's gateways stop heartbeating (their rows age past the TTL): dark, floor
	// share.
	if _, err := e.store.Pool().Exec(t.Context(), `UPDATE gateway_instance SET last_seen = now() - interval '2 hours' WHERE region = $1`, euWest); err != nil {
		t.Fatal(err)
	}
	if _, err := j.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	floor := rebalancer.DefaultConfig(2).Floor
	for _, sc := range []regions.Scope{regions.GlobalScope, pair} {
		got := e.rebalancerShares(t, sc)
		if math.Abs(got[euWest]-floor) > 1e-9 || math.Abs(got[usEast]-(1-floor)) > 1e-9 {
			t.Errorf("%s with eu-west dark: %v, want eu-west at the floor %v", sc, got, floor)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	r, err := demand.New(demand.Config{Sources: []demand.Source{{URL: "http://127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]job.Config{
		"negative interval": {Interval: -time.Second},
		"bad actor":         {Actor: "a b"},
		"negative cap":      {MaxScopes: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := job.New(cfg, &store.Store{}, r); !errors.Is(err, regions.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
	if _, err := job.New(job.Config{}, nil, r); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("no store: err = %v, want ErrInvalid", err)
	}
}
