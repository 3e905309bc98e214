package store

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// waitBlockedOrDone returns once done is closed or a session of s's database waits for a
// lock (the other writer is queued behind the one being interleaved).
func waitBlockedOrDone(t *testing.T, s *Store, done <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return
		default:
		}
		var waiting int
		if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE NOT l.granted AND a.datname = current_database()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the other writer neither finished nor waited for a lock within 10 s")
}

// scopeSums checks that every scope with rows names every region, and that its effective
// shares (the override where there is one, else the rebalancer's row) sum to 1.
func scopeSums(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	names, err := s.Regions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	shares, err := s.Shares(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scopes := map[regions.Scope]bool{regions.GlobalScope: true}
	for _, sh := range shares {
		scopes[sh.Scope] = true
	}
	for sc := range scopes {
		sum := 0.0
		for _, r := range names {
			route := sc.Route
			if route == regions.Wildcard {
				route = "any-route"
			}
			v, _ := snap.Share(r, sc.Tenant, route)
			sum += v
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("scope %s: effective shares over %v sum to %v", sc, names, sum)
		}
	}
	for _, sh := range shares {
		for _, r := range names {
			if _, ok := snap.ScopeRow(r, sh.Scope); !ok {
				t.Errorf("scope %s has no row for region %s", sh.Scope, r)
			}
		}
	}
}

// TestOverrideDuringRegionAdd (issue 17, item 3): a region added while an override is
// being set — after the override read the regions, before it wrote — must end with the
// override naming every region, or the new region falls back and the scope sums above 1.
// The add waits for the override (region lock), then gives the new region its row.
func TestOverrideDuringRegionAdd(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "alice", "test")
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	shop := regions.Scope{Tenant: "shop-a", Route: regions.Wildcard}
	addDone := make(chan struct{})
	var addErr error
	s.hook = func(point string) {
		if point != hookOverrideRead {
			return
		}
		s.hook = nil
		go func() {
			defer close(addDone)
			addErr = s.AddRegion(ctx, "ap-south")
		}()
		waitBlockedOrDone(t, s, addDone)
	}
	if err := s.SetOverride(ctx, shop, map[string]float64{"us-east": 0.3, "eu-west": 0.7}, "alice", "pin", 0); err != nil {
		t.Fatal(err)
	}
	<-addDone
	if addErr != nil {
		t.Fatal(addErr)
	}
	scopeSums(t, s)
}
