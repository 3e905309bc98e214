package job_test

import (
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
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
