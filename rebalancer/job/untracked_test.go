package job_test

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestSingleRegionTenantFollowsGlobal is issue 22's demo: tenant shop-a sends all its
// 30 rps to us-east and has no rows of its own (its eu-west series does not exist, so its
// pair is never written); a brand-new tenant sends 0.5 rps in eu-west, counted in the
// region total but not yet in a series of its own. "*" governs both, so it must follow
// shop-a's traffic to us-east. Before the fix the pair was subtracted from "*" because it
// was merely rebalanced, and "*" went to us-east 0.05 on the newcomer's trickle.
func TestSingleRegionTenantFollowsGlobal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.exp.SetRegion(usEast, 30, 0, 0)
	e.exp.SetRegion(euWest, 0.5, 0, 0)
	e.exp.SetTenant(usEast, pair.Tenant, pair.Route, 30, 0)
	e.waitHistory(t)
	j := e.newJob(t, nil, nil)
	rep, err := j.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if s := scopeReport(t, rep, pair); s.Written {
		t.Fatalf("pair %s written (%+v): this test needs a pair that follows *", pair, s)
	}
	got := e.rebalancerShares(t, regions.GlobalScope)
	if got[usEast] < 0.9 {
		t.Fatalf("* shares %v: us-east carries all the untracked traffic (shop-a's 30 rps), want >= 0.9", got)
	}
	us := regionInput(t, scopeReport(t, rep, regions.GlobalScope), usEast)
	if us.OfferedLong < 27 {
		t.Errorf("* us-east offered %v, want ~30 (shop-a has no rows: * governs it)", us.OfferedLong)
	}
}

// TestTrickleNeverMovesGlobal: untracked demand below the minimum (0.5 rps against a
// default rule of 10/s) is noise; "*" keeps its shares however it is spread.
func TestTrickleNeverMovesGlobal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.exp.SetRegion(usEast, 0, 0, 0)
	e.exp.SetRegion(euWest, 0.4, 0, 0)
	e.waitHistory(t)
	j := e.newJob(t, nil, nil)
	for range 2 {
		rep, err := j.RunOnce(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if g := scopeReport(t, rep, regions.GlobalScope); g.Written || g.Skipped != job.SkipNoDemand {
			t.Errorf("* on a trickle: written %v, skipped %q; want skipped %q", g.Written, g.Skipped, job.SkipNoDemand)
		}
		if _, err := j.Check(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.rebalancerShares(t, regions.GlobalScope); len(got) != 0 {
		t.Errorf("* shares written on a trickle: %v", got)
	}
}

// TestNewRegionStartsAtTheFloor: store.AddRegion starts a region at the floor the
// allocation keeps for it, so the first run after an add does not move it.
func TestNewRegionStartsAtTheFloor(t *testing.T) {
	for n := 1; n <= 12; n++ {
		want := rebalancer.DefaultConfig(n).Floor
		if n == 1 {
			want = 1
		}
		if got := store.NewRegionShare(n); got != want {
			t.Errorf("NewRegionShare(%d) = %v, want the allocation's floor %v", n, got, want)
		}
	}
}

// TestSingleRegionTenantGetsItsLimit (issue 22): shop-a sends its 30 rps all to us-east
// while another tenant without rows sends 100 rps in eu-west. Following "*" (split by the
// untracked demand, 30/130), shop-a would get less than the equal split where its
// traffic is. The gateways' folded series (_other) read zero in eu-west, so shop-a's
// missing eu-west series is a known zero, not unknown: its pair is water-filled and gets
// its limit in us-east.
func TestSingleRegionTenantGetsItsLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	other := regions.Scope{Tenant: "shop-z", Route: "list"}
	e.exp.SetRegion(usEast, 30, 0, 0)
	e.exp.SetRegion(euWest, 100, 0, 0)
	e.exp.SetTenant(usEast, pair.Tenant, pair.Route, 30, 0)
	e.exp.SetTenant(euWest, other.Tenant, other.Route, 100, 0)
	for _, r := range []string{usEast, euWest} {
		e.exp.SetTenant(r, regions.OtherLabel, regions.OtherLabel, 0, 0) // nothing folded
	}
	e.waitHistory(t)
	j := e.newJob(t, nil, nil)
	if _, err := j.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	snap, err := e.store.LoadSnapshot(t.Context(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Its rule is 100/s: 30 rps of demand plus headroom fits in us-east, eu-west keeps
	// the floor and the rest is split equally; in any case well above the equal split.
	if got, src := snap.Share(usEast, pair.Tenant, pair.Route); got < 0.6 || src != regions.SourceRebalancer {
		t.Errorf("shop-a's share in us-east %v (%s), want its own rows, above the equal split", got, src)
	}
}
