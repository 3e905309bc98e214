package store

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// TestStoreDeleteRebalancerShares: a Delete change removes one rebalancer row, in the
// same transaction as the upserts beside it, and leaves a history row (no new share)
// with the actor, the change's reason and inputs. Override rows and other scopes stay; a
// missing row is a no-op; RebalancerScopes follows, from the store and from NewSnapshot.
func TestStoreDeleteRebalancerShares(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	gone := regions.Scope{Tenant: "shop-a", Route: "create-order"}
	kept := regions.Scope{Tenant: "shop-b", Route: "list"}
	var write []ShareChange
	for _, sc := range []regions.Scope{regions.GlobalScope, gone, kept} {
		write = append(write,
			ShareChange{Scope: sc, Region: "us-east", New: 0.7, Reason: "waterfill"},
			ShareChange{Scope: sc, Region: "eu-west", New: 0.3, Reason: "waterfill"})
	}
	if err := s.WriteRebalancerShares(ctx, write, nil, "rebalancer"); err != nil {
		t.Fatal(err)
	}
	// An override of the expiring scope: Delete must leave it alone.
	if err := s.SetOverride(ctx, gone, map[string]float64{"us-east": 0.5, "eu-west": 0.5}, "alice", "pinned", time.Hour); err != nil {
		t.Fatal(err)
	}

	snap, err := s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := snap.RebalancerScopes(), []regions.Scope{regions.GlobalScope, gone, kept}; !slices.Equal(got, want) {
		t.Fatalf("RebalancerScopes before = %v, want %v", got, want)
	}

	type expiry struct {
		Reason string `json:"reason"`
		Runs   int    `json:"absent_runs"`
	}
	const reason = "expired: no demand for 3 runs"
	del := []ShareChange{
		{Scope: gone, Region: "eu-west", Old: 0.3, New: 7, Delete: true, Reason: reason, Inputs: expiry{"expired", 3}}, // New ignored
		{Scope: gone, Region: "us-east", Old: 0.7, Delete: true, Reason: reason, Inputs: expiry{"expired", 3}},
		{Scope: regions.Scope{Tenant: "shop-c", Route: "none"}, Region: "us-east", Delete: true, Reason: reason}, // no row: no-op
		{Scope: kept, Region: "eu-west", New: 0.35, Reason: "waterfill"},                                         // an upsert beside them
	}
	hist0 := count(t, s, `SELECT count(*) FROM region_share_history`)
	if err := s.WriteRebalancerShares(ctx, del, nil, "rebalancer"); err != nil {
		t.Fatal(err)
	}
	// Deleting again is a no-op, with no history.
	if err := s.WriteRebalancerShares(ctx, del[:2], nil, "rebalancer"); err != nil {
		t.Fatal(err)
	}
	// A bad change still rolls the whole call back, deletes included.
	bad := []ShareChange{{Scope: kept, Region: "us-east", Delete: true, Reason: reason}, {Scope: kept, Region: "ap-south", New: 0.5}}
	if err := s.WriteRebalancerShares(ctx, bad, nil, "rebalancer"); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("a call with a share of an unknown region: %v, want ErrInvalid", err)
	}

	shares, err := s.Shares(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sh := range shares {
		got[sh.Scope.String()+"@"+sh.Region+"@"+string(sh.Source)] = sh.Share
	}
	want := map[string]float64{
		"*@us-east@rebalancer": 0.7, "*@eu-west@rebalancer": 0.3,
		"shop-b/list@us-east@rebalancer": 0.7, "shop-b/list@eu-west@rebalancer": 0.35,
		"shop-a/create-order@us-east@override": 0.5, "shop-a/create-order@eu-west@override": 0.5,
	}
	if len(got) != len(want) {
		t.Fatalf("stored shares %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Fatalf("stored shares %v, want %v", got, want)
		}
	}

	if n := count(t, s, `SELECT count(*) FROM region_share_history`) - hist0; n != 3 {
		t.Errorf("%d new history rows, want 3 (two deletions, one update)", n)
	}
	hist, err := s.History(ctx, HistoryFilter{Scope: &gone})
	if err != nil {
		t.Fatal(err)
	}
	deleted := map[string]bool{}
	for _, e := range hist {
		if e.Source != regions.SourceRebalancer || e.New != nil {
			continue
		}
		deleted[e.Region] = true
		wantOld := map[string]float64{"us-east": 0.7, "eu-west": 0.3}[e.Region]
		if e.Actor != "rebalancer" || e.Reason != reason || e.Old == nil || *e.Old != wantOld {
			t.Errorf("deletion history %+v (old %s): want actor rebalancer, reason %q, old %v", e, fptr(e.Old), reason, wantOld)
		}
		var in expiry
		if err := json.Unmarshal(e.Inputs, &in); err != nil || in != (expiry{"expired", 3}) {
			t.Errorf("deletion inputs %s (%v): want the change's inputs", e.Inputs, err)
		}
	}
	if !deleted["us-east"] || !deleted["eu-west"] {
		t.Errorf("deletion history rows for regions %v, want us-east and eu-west: %+v", deleted, hist)
	}

	snap, err = s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := snap.RebalancerScopes(), []regions.Scope{regions.GlobalScope, kept}; !slices.Equal(got, want) {
		t.Errorf("RebalancerScopes after = %v, want %v", got, want)
	}
	// The override still decides the pair; without it, the pair would fall back to "*".
	if sh, src := snap.Share("us-east", gone.Tenant, gone.Route); sh != 0.5 || src != regions.SourceOverride {
		t.Errorf("effective share of %s = %v (%s), want the override's 0.5", gone, sh, src)
	}
	if err := s.ClearOverride(ctx, gone, "alice", "done"); err != nil {
		t.Fatal(err)
	}
	if snap, err = s.LoadSnapshot(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if sh, src := snap.Share("us-east", gone.Tenant, gone.Route); sh != 0.7 || src != regions.SourceRebalancer {
		t.Errorf("effective share of %s = %v (%s), want the * rebalancer share 0.7", gone, sh, src)
	}
}

// TestRebalancerScopes: the distinct scopes with rebalancer rows, sorted by String(),
// whatever the order of the data; overrides alone do not count.
func TestRebalancerScopes(t *testing.T) {
	t.Parallel()
	share := func(scope string, region string, src regions.Source) regions.Share {
		sc, err := regions.ParseScope(scope)
		if err != nil {
			t.Fatal(err)
		}
		return regions.Share{Scope: sc, Region: region, Share: 0.5, Source: src}
	}
	d := regions.SnapshotData{
		Regions: []string{"us-east", "eu-west"},
		Rules:   []regions.Rule{{Tenant: regions.Wildcard, Route: regions.Wildcard, Capacity: 10, RefillPerSecond: 1, Shards: 1}},
		Shares: []regions.Share{
			share("shop-b/list", "us-east", regions.SourceRebalancer), share("shop-b/list", "eu-west", regions.SourceRebalancer),
			share("shop-a", "eu-west", regions.SourceRebalancer), share("*", "us-east", regions.SourceRebalancer),
			share("shop-a/x", "us-east", regions.SourceRebalancer), share("shop-z/y", "us-east", regions.SourceOverride),
			share("shop-b/list", "us-east", regions.SourceOverride),
		},
	}
	snap, err := regions.NewSnapshot(d)
	if err != nil {
		t.Fatal(err)
	}
	want := []regions.Scope{regions.GlobalScope, {Tenant: "shop-a", Route: regions.Wildcard}, {Tenant: "shop-a", Route: "x"}, {Tenant: "shop-b", Route: "list"}}
	got := snap.RebalancerScopes()
	if !slices.Equal(got, want) {
		t.Fatalf("RebalancerScopes = %v, want %v", got, want)
	}
	got[0] = regions.Scope{Tenant: "mutated", Route: "x"}
	if again := snap.RebalancerScopes(); !slices.Equal(again, want) {
		t.Fatalf("RebalancerScopes after mutating a result = %v: the snapshot must not share it", again)
	}
	empty, err := regions.NewSnapshot(regions.SnapshotData{Regions: d.Regions, Rules: d.Rules})
	if err != nil {
		t.Fatal(err)
	}
	if got := empty.RebalancerScopes(); len(got) != 0 {
		t.Fatalf("RebalancerScopes without shares = %v", got)
	}
}
