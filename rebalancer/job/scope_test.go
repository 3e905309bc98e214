package job_test

import (
	"errors"
	"math"
	"strings"
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

// scopeReport finds scope's report in rep.
func scopeReport(t *testing.T, rep job.Report, sc regions.Scope) job.ScopeReport {
	t.Helper()
	for _, s := range rep.Scopes {
		if s.Inputs.Scope == sc.String() {
			return s
		}
	}
	t.Fatalf("no report for scope %s in %+v", sc, rep.Scopes)
	return job.ScopeReport{}
}

func regionInput(t *testing.T, s job.ScopeReport, region string) job.RegionInput {
	t.Helper()
	for _, r := range s.Inputs.Regions {
		if r.Region == region {
			return r
		}
	}
	t.Fatalf("scope %s: no inputs for region %s", s.Inputs.Scope, region)
	return job.RegionInput{}
}

// TestGlobalScopeSplitsTrafficWithoutOwnScope: "*" is split in proportion to the offered
// traffic that "*" actually governs, the region totals minus the pairs with shares of
// their own (written this run, or holding a pair share row such as an override).
// Headroom and the peak reserve play no part: "*" bounds many buckets at once.
func TestGlobalScopeSplitsTrafficWithoutOwnScope(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	shopB := regions.Scope{Tenant: "shop-b", Route: "list"}
	shopC := regions.Scope{Tenant: "shop-c", Route: "list"}
	if err := e.store.SetOverride(t.Context(), shopB, map[string]float64{usEast: 0.5, euWest: 0.5}, "alice", "pinned", time.Hour); err != nil {
		t.Fatal(err)
	}
	e.exp.SetRegion(usEast, 120, 0, 0)
	e.exp.SetRegion(euWest, 70, 0, 0)
	e.exp.SetTenant(usEast, pair.Tenant, pair.Route, 100, 0) // rebalanced and written: its own scope
	e.exp.SetTenant(euWest, pair.Tenant, pair.Route, 10, 0)
	e.exp.SetTenant(euWest, shopB.Tenant, shopB.Route, 30, 0) // not rebalanced (cap 1), but overridden
	e.exp.SetTenant(euWest, shopC.Tenant, shopC.Route, 10, 0) // not rebalanced, no row: "*" governs it
	e.waitHistory(t)
	j := e.newJob(t, nil, func(c *job.Config) { c.MaxScopes = 1 })

	rep, err := j.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// "*" governs us-east 120-100 = 20 rps and eu-west 70-10-30 = 30 rps (shop-c included).
	want := map[string]float64{usEast: 0.4, euWest: 0.6}
	g := scopeReport(t, rep, regions.GlobalScope)
	for r, d := range map[string]float64{usEast: 20, euWest: 30} {
		in := regionInput(t, g, r)
		if math.Abs(in.Demand-d) > 0.05*d || math.Abs(in.OfferedLong-d) > 0.05*d {
			t.Errorf("* %s: demand %v offered %v, want %v (the region total minus the pairs with their own scope)", r, in.Demand, in.OfferedLong, d)
		}
		if in.Basis != job.BasisProportional {
			t.Errorf("* %s: basis %q, want %q", r, in.Basis, job.BasisProportional)
		}
	}
	if !g.Written {
		t.Fatalf("* not written: %+v", g)
	}
	sharesNear(t, "*", e.rebalancerShares(t, regions.GlobalScope), want, 0.02)
}

// TestGlobalScopeWithoutDemandKeepsShares: when every request belongs to a pair with its
// own scope, "*" has nothing to split: its shares stay as they are.
func TestGlobalScopeWithoutDemandKeepsShares(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.exp.SetRegion(usEast, 70, 0, 0)
	e.exp.SetRegion(euWest, 30, 0, 0)
	e.exp.SetTenant(usEast, pair.Tenant, pair.Route, 70, 0)
	e.exp.SetTenant(euWest, pair.Tenant, pair.Route, 30, 0)
	e.waitHistory(t)
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, nil)
	rep, err := j.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if g := scopeReport(t, rep, regions.GlobalScope); g.Written || g.Skipped != job.SkipNoDemand {
		t.Errorf("* report %+v: want skipped %q", g, job.SkipNoDemand)
	}
	if got := e.rebalancerShares(t, regions.GlobalScope); len(got) != 0 {
		t.Errorf("* shares written without demand: %v", got)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_writes_skipped_total", "reason", job.SkipNoDemand); got != 1 {
		t.Errorf("writes skipped no_demand = %v, want 1", got)
	}
}

// TestShadowTrafficIsNotThrottling: requests a shadow rule would have rejected were
// forwarded. They are offered demand, but not throttling: they must not fire the fast
// path (nor count as "throttled" for the hysteresis).
func TestShadowTrafficIsNotThrottling(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.exp.SetRegion(usEast, 20, 0, 30)
	e.exp.SetRegion(euWest, 10, 0, 0)
	e.exp.SetTenant(usEast, pair.Tenant, pair.Route, 20, 0)
	e.exp.SetTenantShadow(usEast, pair.Tenant, pair.Route, 30)
	e.exp.SetTenant(euWest, pair.Tenant, pair.Route, 10, 0)
	e.waitHistory(t)
	j := e.newJob(t, nil, nil)

	rep, err := j.Check(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	s := scopeReport(t, rep, pair)
	if s.Inputs.Reason != rebalancer.ReasonNoTrigger || s.Written || rep.Written != 0 {
		t.Errorf("check with shadow rejections only: reason %q, written %v (%d shares); want no_trigger and nothing written",
			s.Inputs.Reason, s.Written, rep.Written)
	}
	us := regionInput(t, s, usEast)
	if us.Throttled != 0 || math.Abs(us.OfferedLong-50) > 2.5 {
		t.Errorf("us-east inputs %+v: want throttled 0 and offered ~50 (shadow traffic is offered)", us)
	}
}

// TestAllocationErrorIsResultError: a scope whose allocation refuses its input makes the
// tick's result "error" (the other scopes are still decided), not a silent "ok".
func TestAllocationErrorIsResultError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemand70_30()
	e.waitHistory(t)
	reg := prometheus.NewPedanticRegistry()
	j := e.newJob(t, reg, func(c *job.Config) {
		c.Allocation = func(n int) rebalancer.Config {
			cfg := rebalancer.DefaultConfig(n)
			cfg.Floor = 0.9 // more than 1/n: refused
			return cfg
		}
	})
	rep, err := j.RunOnce(t.Context())
	if rep.Result != job.ResultError || !errors.Is(err, rebalancer.ErrInvalid) {
		t.Fatalf("run with a refused allocation: result %q, err %v; want %q wrapping rebalancer.ErrInvalid", rep.Result, err, job.ResultError)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_runs_total", "result", job.ResultError); got != 1 {
		t.Errorf("runs error = %v, want 1", got)
	}
	if got := metric(t, reg, "ratelimit_rebalancer_last_success_timestamp_seconds"); got != 0 {
		t.Errorf("last success = %v after a failed run, want 0", got)
	}
	if all, err := e.store.Shares(t.Context()); err != nil || len(all) != 0 {
		t.Errorf("shares = %v, %v; want none", all, err)
	}
}

// TestNewTwiceOnOneRegistry: a second Job on the same registry is a configuration error,
// not a panic.
func TestNewTwiceOnOneRegistry(t *testing.T) {
	t.Parallel()
	r, err := demand.New(demand.Config{Sources: []demand.Source{{URL: "http://127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if _, err := job.New(job.Config{Registerer: reg}, &store.Store{}, r); err != nil {
		t.Fatal(err)
	}
	var second error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("second New on the same registry panicked: %v", p)
			}
		}()
		_, second = job.New(job.Config{Registerer: reg}, &store.Store{}, r)
	}()
	if second == nil || !strings.Contains(second.Error(), "ratelimit_rebalancer_runs_total") {
		t.Fatalf("second New on the same registry: %v, want an error naming the metric", second)
	}
}
