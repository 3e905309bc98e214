package job_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestCleanRestartIsNotDark (issue 22): every gateway of eu-west stops cleanly (a
// rolling deploy, a restart together) and the new processes have not beaten yet. A clean
// stop deleted the heartbeat row, so the region read dark and the next check cut its
// share to the floor (0.857 -> 0.05 in 3 of 3 runs). Now the stopped row keeps the region
// seen for the instance TTL: nothing moves.
func TestCleanRestartIsNotDark(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemand70_30()
	e.waitHistory(t)
	j := e.newJob(t, nil, func(c *job.Config) { c.InstanceTTL = 15 * time.Second })
	if _, err := j.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := e.rebalancerShares(t, regions.GlobalScope)
	if err := e.store.RemoveInstance(t.Context(), "gw-"+euWest); err != nil {
		t.Fatal(err)
	}
	rep, err := j.Check(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Scopes {
		if in := regionInput(t, s, euWest); in.Status != "ok" {
			t.Errorf("scope %s: eu-west %s after a clean stop, want ok (its gateways are restarting)", s.Inputs.Scope, in.Status)
		}
	}
	after := e.rebalancerShares(t, regions.GlobalScope)
	if math.Abs(after[euWest]-before[euWest]) > 1e-9 {
		t.Errorf("eu-west's * share %v -> %v across a clean restart, want kept", before[euWest], after[euWest])
	}
	// The gateways' own fallback count drops the stopped instance at once.
	snap, err := e.store.LoadSnapshot(t.Context(), 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n := snap.LiveInstances(euWest); n != 0 {
		t.Errorf("eu-west live instances for the fallback %d after the stop, want 0", n)
	}
}

// TestOverrideExpiryIsRecorded (issue 22): an override's end left no history or audit
// row. The rebalancer's tick deletes the expired rows, each leaving both.
func TestOverrideExpiryIsRecorded(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "us-east", "eu-west")
	ctx := store.WithAudit(t.Context(), "alice", "incident")
	if err := w.store.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.1, "eu-west": 0.9}, "alice", "eu-west incident", 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for {
		var passed bool
		if err := w.store.Pool().QueryRow(ctx, `SELECT bool_and(expires_at <= now()) FROM region_share WHERE source = 'override'`).Scan(&passed); err != nil {
			t.Fatal(err)
		}
		if passed {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.dem.set(map[string]float64{"us-east": 50, "eu-west": 50})
	reg := prometheus.NewPedanticRegistry()
	if _, err := w.job(t, reg, nil).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := w.store.History(ctx, store.HistoryFilter{Scope: &regions.GlobalScope})
	if err != nil {
		t.Fatal(err)
	}
	ended := 0
	for _, e := range h {
		if e.Source == regions.SourceOverride && e.New == nil && strings.HasPrefix(e.Reason, store.ReasonOverrideExpired) && e.Actor == job.DefaultActor {
			ended++
		}
	}
	if ended != 2 {
		t.Errorf("history rows of the override's end: %d, want one per region (history %+v)", ended, h)
	}
	audit, err := w.store.Audit(ctx, store.AuditFilter{Actor: job.DefaultActor})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(audit); n != 2 || audit[0].Object != "region_share" || !strings.HasPrefix(audit[0].Reason, store.ReasonOverrideExpired) {
		t.Errorf("audit rows of the override's end: %+v, want 2 of region_share", audit)
	}
	if n := metric(t, reg, "ratelimit_rebalancer_overrides_expired_total"); n != 2 {
		t.Errorf("overrides_expired_total = %v, want 2", n)
	}
}
