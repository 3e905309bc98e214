package job_test

import (
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// ageHeartbeats makes region's gateways look as if they stopped heartbeating 2 h ago
// (past every TTL): what a gateway cut off from PostgreSQL looks like to the rebalancer.
func (e *env) ageHeartbeats(t *testing.T, region string) {
	t.Helper()
	if _, err := e.store.Pool().Exec(t.Context(), `UPDATE gateway_instance SET last_seen = now() - interval '2 hours' WHERE region = $1`, region); err != nil {
		t.Fatal(err)
	}
}

// waitDemand waits until the reader's answer satisfies ok (15 s at most).
func (e *env) waitDemand(t *testing.T, what string, ok func(demand.Demand) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		d, err := e.reader.Read(t.Context(), time.Time{})
		if err == nil && ok(d) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("demand: not %s after 15 s (err %v, targets %v)", what, err, d.Targets)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestDarkRegionReturnsInQuietScope (issue 22): "*" carries only a trickle (below the
// minimum demand, so quiet); eu-west goes dark and its "*" share is cut to the floor.
// When it is back, a new leader (no memory of the episode but the rows) gives "*" back
// the equal split; a trickle afterwards moves nothing. Before, quiet kept eu-west at
// 0.05 until new demand arrived (the attacked stack: 80 s and more, a tenant without
// rows advertised q=1 of its 10).
func TestDarkRegionReturnsInQuietScope(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.exp.SetRegion(usEast, 0.2, 0, 0)
	e.exp.SetRegion(euWest, 0.2, 0, 0)
	e.waitHistory(t)
	j := e.newJob(t, nil, nil)
	if _, err := j.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}

	e.exp.RemoveRegion(euWest)
	e.ageHeartbeats(t, euWest)
	e.waitDemand(t, "without eu-west targets", func(d demand.Demand) bool { return d.Targets[euWest] == 0 })
	if _, err := j.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	floor := rebalancer.DefaultConfig(2).Floor
	if got := e.rebalancerShares(t, regions.GlobalScope); math.Abs(got[euWest]-floor) > 1e-9 {
		t.Fatalf("* %v with eu-west dark, want eu-west at the floor %v", got, floor)
	}

	// eu-west is back: its gateway beats and is scraped again, with the same trickle.
	if err := e.store.Heartbeat(t.Context(), "gw-"+euWest, euWest); err != nil {
		t.Fatal(err)
	}
	e.exp.SetRegion(euWest, 0.2, 0, 0)
	e.waitDemand(t, "with eu-west back", func(d demand.Demand) bool {
		_, ok := d.Sample(regions.GlobalScope, euWest)
		return ok && d.Targets[euWest] >= 1
	})
	j2 := e.newJob(t, nil, nil) // a new leader: the episode is only in the rows
	rep, err := j2.Check(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	g := scopeReport(t, rep, regions.GlobalScope)
	got := e.rebalancerShares(t, regions.GlobalScope)
	if math.Abs(got[euWest]-0.5) > 1e-9 || math.Abs(got[usEast]-0.5) > 1e-9 || g.Inputs.Reason != rebalancer.ReasonReturned {
		t.Fatalf("* %v (reason %q) once eu-west is back in a quiet scope, want 0.5/0.5, %q", got, g.Inputs.Reason, rebalancer.ReasonReturned)
	}
	h, err := e.store.History(t.Context(), store.HistoryFilter{Scope: &regions.GlobalScope, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 1 || h[0].Reason != rebalancer.ReasonReturned+": "+euWest {
		t.Errorf("newest * history %+v, want reason %q", h, rebalancer.ReasonReturned+": "+euWest)
	}

	// Quiet again: the trickle, shifted to eu-west, moves nothing.
	e.exp.SetRegion(euWest, 0.6, 0, 0)
	e.exp.SetRegion(usEast, 0, 0, 0)
	for range 2 {
		if _, err := j2.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := j2.Check(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if after := e.rebalancerShares(t, regions.GlobalScope); math.Abs(after[euWest]-0.5) > 1e-9 {
		t.Errorf("* %v after the heal on a trickle, want kept at 0.5/0.5", after)
	}
}
