package job_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

var shopB = regions.Scope{Tenant: "shop-b", Route: "list"}

// setDemandTwoPairs offers the 70/30 demand of setDemand70_30 plus a smaller pair,
// shop-b/list, 60/40 rps (pair and shop-b are then the only traffic beside "*").
func (e *env) setDemandTwoPairs() {
	e.exp.SetRegion(usEast, 190, 90, 0)
	e.exp.SetRegion(euWest, 80, 10, 0)
	e.exp.SetTenant(usEast, pair.Tenant, pair.Route, 50, 20)
	e.exp.SetTenant(euWest, pair.Tenant, pair.Route, 30, 0)
	e.exp.SetTenant(usEast, shopB.Tenant, shopB.Route, 6, 0)
	e.exp.SetTenant(euWest, shopB.Tenant, shopB.Route, 4, 0)
}

// waitPairGone polls the demand reader until sc has no sample in any region while both
// regions' totals are fresh (the state a run sees once sc's series vanished).
func (e *env) waitPairGone(t *testing.T, sc regions.Scope) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := e.reader.Read(t.Context(), time.Time{})
		if err == nil {
			_, us := d.Sample(sc, usEast)
			_, eu := d.Sample(sc, euWest)
			_, usTotal := d.Sample(regions.GlobalScope, usEast)
			_, euTotal := d.Sample(regions.GlobalScope, euWest)
			if !us && !eu && usTotal && euTotal {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still has demand (or a region total is missing) 20 s after its series vanished: %v", sc, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// runOnce runs a full tick that must succeed.
func runOnce(t *testing.T, j *job.Job) job.Report {
	t.Helper()
	rep, err := j.RunOnce(t.Context())
	if err != nil || rep.Result != job.ResultOK {
		t.Fatalf("run: %s, %v", rep.Result, err)
	}
	return rep
}

// gateway runs a gateway's reloader (LISTEN/NOTIFY) on the test's database.
func (e *env) gateway(t *testing.T) *store.Reloader {
	t.Helper()
	r := store.NewReloader(store.ReloaderOptions{ListenURL: e.dbURL, Interval: time.Hour,
		Load: func(ctx context.Context) (*regions.Snapshot, error) { return e.store.LoadSnapshot(ctx, time.Hour) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("reloader: %v", err)
		}
	})
	return r
}

// waitEffective polls the gateway's snapshot until region's effective share of sc is
// want from source src.
func waitEffective(t *testing.T, r *store.Reloader, region string, sc regions.Scope, want float64, src regions.Source) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var (
		got    float64
		gotSrc regions.Source
	)
	for time.Now().Before(deadline) {
		if s := r.Current(); s != nil {
			if got, gotSrc = s.Share(region, sc.Tenant, sc.Route); math.Abs(got-want) < 1e-9 && gotSrc == src {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("gateway's effective share of %s in %s = %v (%s) after 10 s, want %v (%s)", sc, region, got, gotSrc, want, src)
}

// TestPairSharesExpireWithoutDemand: a pair whose series vanished loses its rebalancer
// rows on the third full run without demand (with history rows saying why), and the
// gateways fall back to "*" for it; a pair that keeps its demand keeps its rows.
func TestPairSharesExpireWithoutDemand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemandTwoPairs()
	e.waitHistory(t)
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, nil) // ExpireAfterRuns: the default, 3
	gw := e.gateway(t)

	// With demand, runs beyond ExpireAfterRuns keep every row.
	for i := range job.DefaultExpireAfterRuns + 1 {
		if rep := runOnce(t, j); len(rep.Expired) != 0 {
			t.Fatalf("run %d with demand expired %v", i+1, rep.Expired)
		}
	}
	before := e.rebalancerShares(t, pair)
	keptBefore := e.rebalancerShares(t, shopB)
	if len(before) != 2 || len(keptBefore) != 2 {
		t.Fatalf("rows after runs with demand: %s %v, %s %v; want both regions of both", pair, before, shopB, keptBefore)
	}
	waitEffective(t, gw, usEast, pair, before[usEast], regions.SourceRebalancer)

	// pair's series vanish in both regions (the exporter restarts without them).
	e.exp.RemoveRegion(usEast)
	e.exp.RemoveRegion(euWest)
	e.exp.SetRegion(usEast, 140, 90, 0)
	e.exp.SetRegion(euWest, 50, 10, 0)
	e.exp.SetTenant(usEast, shopB.Tenant, shopB.Route, 6, 0)
	e.exp.SetTenant(euWest, shopB.Tenant, shopB.Route, 4, 0)
	e.waitPairGone(t, pair)

	for i := 1; i < job.DefaultExpireAfterRuns; i++ {
		if rep := runOnce(t, j); len(rep.Expired) != 0 {
			t.Fatalf("absent run %d expired %v, want nothing before run %d", i, rep.Expired, job.DefaultExpireAfterRuns)
		}
		sharesNear(t, fmt.Sprintf("%s after %d runs without demand", pair, i), e.rebalancerShares(t, pair), before, 0)
	}
	rep := runOnce(t, j)
	if !slices.Equal(rep.Expired, []regions.Scope{pair}) {
		t.Fatalf("run %d without demand expired %v, want [%s]", job.DefaultExpireAfterRuns, rep.Expired, pair)
	}
	if got := e.rebalancerShares(t, pair); len(got) != 0 {
		t.Errorf("%s rows after expiry: %v, want none", pair, got)
	}
	if got := e.rebalancerShares(t, shopB); len(got) != 2 {
		t.Errorf("%s (with demand) rows after the other pair expired: %v, want both regions", shopB, got)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_expired_scopes_total"); got != 1 {
		t.Errorf("expired scopes = %v, want 1", got)
	}

	// History: one deletion per region, with the reason and the inputs.
	hist, err := e.store.History(t.Context(), store.HistoryFilter{Scope: &pair})
	if err != nil {
		t.Fatal(err)
	}
	wantReason := fmt.Sprintf("expired: no demand for %d runs", job.DefaultExpireAfterRuns)
	deleted := map[string]bool{}
	for _, h := range hist {
		if h.New != nil {
			continue
		}
		deleted[h.Region] = true
		if h.Actor != job.DefaultActor || h.Reason != wantReason || h.Source != regions.SourceRebalancer ||
			h.Old == nil || *h.Old != before[h.Region] {
			t.Errorf("deletion row %+v: want actor %s, reason %q, old %v", h, job.DefaultActor, wantReason, before[h.Region])
		}
		var in job.ScopeInputs
		if err := json.Unmarshal(h.Inputs, &in); err != nil {
			t.Fatalf("inputs %s: %v", h.Inputs, err)
		}
		if in.Reason != job.ReasonExpired || in.Scope != pair.String() || in.AbsentRuns != job.DefaultExpireAfterRuns || len(in.Regions) != 2 {
			t.Errorf("deletion inputs %+v", in)
		}
	}
	if !deleted[usEast] || !deleted[euWest] {
		t.Errorf("deletion history for %v, want both regions: %+v", deleted, hist)
	}

	// The gateways now scale the pair by "*".
	star := e.rebalancerShares(t, regions.GlobalScope)
	if len(star) != 2 {
		t.Fatalf("* rows %v", star)
	}
	for _, r := range []string{usEast, euWest} {
		waitEffective(t, gw, r, pair, star[r], regions.SourceRebalancer)
	}

	// Later runs have nothing left to expire.
	n := len(hist)
	if rep := runOnce(t, j); len(rep.Expired) != 0 {
		t.Errorf("run after the expiry expired %v", rep.Expired)
	}
	if hist, _ := e.store.History(t.Context(), store.HistoryFilter{Scope: &pair}); len(hist) != n {
		t.Errorf("history of %s grew from %d to %d rows after the expiry", pair, n, len(hist))
	}
}

// TestPairSharesKeptWhenExpiryDisabledOrOverridden: ExpireAfterRuns -1 never deletes; an
// operator override covering a pair (here its tenant's) keeps the pair's rows while it is
// in force, and the pair goes on the first run after the override ends (the count is kept
// meanwhile). A pair that is not
// among the MaxScopes busiest counts as without demand.
func TestPairSharesKeptWhenExpiryDisabledOrOverridden(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemandTwoPairs()
	e.waitHistory(t)
	runOnce(t, e.newJob(t, nil, nil)) // rows for both pairs
	before := e.rebalancerShares(t, shopB)
	if len(before) != 2 {
		t.Fatalf("%s rows %v, want both regions", shopB, before)
	}
	capped := func(c *job.Config) { c.MaxScopes = 1 } // shop-b is not rebalanced any more

	never := e.newJob(t, nil, func(c *job.Config) { capped(c); c.ExpireAfterRuns = -1 })
	for i := range job.DefaultExpireAfterRuns + 1 {
		if rep := runOnce(t, never); len(rep.Expired) != 0 {
			t.Fatalf("ExpireAfterRuns -1: run %d expired %v", i+1, rep.Expired)
		}
	}
	sharesNear(t, "ExpireAfterRuns -1", e.rebalancerShares(t, shopB), before, 0)

	tenantB := regions.Scope{Tenant: shopB.Tenant, Route: regions.Wildcard}
	if err := e.store.SetOverride(t.Context(), tenantB, map[string]float64{usEast: 0.5, euWest: 0.5}, "alice", "pinned", time.Hour); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, capped)
	for i := range job.DefaultExpireAfterRuns {
		if rep := runOnce(t, j); len(rep.Expired) != 0 {
			t.Fatalf("overridden: run %d expired %v", i+1, rep.Expired)
		}
	}
	sharesNear(t, "under an override", e.rebalancerShares(t, shopB), before, 0)

	if err := e.store.ClearOverride(t.Context(), tenantB, "alice", "done"); err != nil {
		t.Fatal(err)
	}
	rep := runOnce(t, j)
	if !slices.Equal(rep.Expired, []regions.Scope{shopB}) {
		t.Fatalf("first run after the override ended expired %v, want [%s]", rep.Expired, shopB)
	}
	if got := e.rebalancerShares(t, shopB); len(got) != 0 {
		t.Errorf("%s rows after expiry: %v", shopB, got)
	}
	if got := e.rebalancerShares(t, pair); len(got) != 2 {
		t.Errorf("%s (rebalanced) rows: %v, want both regions", pair, got)
	}
	hist, err := e.store.History(t.Context(), store.HistoryFilter{Scope: &shopB, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("expired: no demand for %d runs", job.DefaultExpireAfterRuns+1)
	for _, h := range hist {
		if h.New != nil || h.Source != regions.SourceRebalancer || h.Reason != want {
			t.Errorf("latest history of %s: %+v, want a rebalancer deletion with reason %q", shopB, h, want)
		}
	}
	if got := metric(t, reg, "ratelimit_rebalancer_expired_scopes_total"); got != 1 {
		t.Errorf("expired scopes = %v, want 1", got)
	}
}
