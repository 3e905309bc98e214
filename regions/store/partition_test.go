package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// TestPartitionedGatewayEndsOverrideOnTime (issue 22): the runbook's incident move, an
// override us-east 0.1 / eu-west 0.9 with a TTL, expires while eu-west's gateway cannot
// reach PostgreSQL. A failed reload kept the old snapshot, so eu-west kept 0.9 for as
// long as the cut lasted while us-east went back to 0.5: 1400 admitted against 1000. The
// cut-off reloader now applies the expiry on its own clock: at every instant the two
// gateways' shares sum to at most 1, and eu-west ends at 0.5 with the store still away.
// The cut either refuses at once or hangs (a stalled proxy in front of PostgreSQL: a load
// waits for its LoadTimeout); the expiry was then applied only after the load gave up,
// 16 s late behind a SIGSTOPped socat, and the enforced shares summed to 1.41.
func TestPartitionedGatewayEndsOverrideOnTime(t *testing.T) {
	t.Parallel()
	for _, hang := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "hangs"}[hang], func(t *testing.T) {
			t.Parallel()
			testOverrideEndsOnTime(t, hang)
		})
	}
}

func testOverrideEndsOnTime(t *testing.T, hang bool) {
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "alice", "incident")
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = regions.ExpiryGrace + 2*time.Second
	if err := s.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.1, "eu-west": 0.9}, "alice", "eu-west incident", ttl); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	var cut atomic.Bool
	gateway := func(partitioned bool) *Reloader {
		return NewReloader(ReloaderOptions{Interval: time.Hour, LoadTimeout: 10 * time.Second, Load: func(ctx context.Context) (*regions.Snapshot, error) {
			if partitioned && cut.Load() {
				if hang {
					<-ctx.Done() // the load's own timeout, or the test's end
					return nil, ctx.Err()
				}
				return nil, errors.New("dial tcp: connection refused (partition)")
			}
			return s.LoadSnapshot(ctx, 0)
		}})
	}
	us, eu := gateway(false), gateway(true)
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range []*Reloader{us, eu} {
		wg.Go(func() { _ = r.Run(rctx) })
	}
	defer wg.Wait()
	defer cancel()
	for us.Current() == nil || eu.Current() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	cut.Store(true) // eu-west loses PostgreSQL, with the override in force
	maxSum := 0.0
	for {
		u, _ := us.Current().Share("us-east", "shop-c", "list")
		e, _ := eu.Current().Share("eu-west", "shop-c", "list")
		maxSum = max(maxSum, u+e)
		if u+e > 1+1e-9 {
			t.Fatalf("%v after the override was set: us-east %v + eu-west (cut off) %v = %v", time.Since(set).Round(time.Millisecond), u, e, u+e)
		}
		if e == 0.5 && u == 0.5 {
			break
		}
		if time.Since(set) > ttl+regions.ExpiryGrace+2*time.Second {
			t.Fatalf("%v after the override was set (ttl %v): us-east %v, eu-west %v; want both back at 0.5", time.Since(set), ttl, u, e)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("both at 0.5 after %v (ttl %v, grace %v), max enforced sum %v", time.Since(set).Round(time.Millisecond), ttl, regions.ExpiryGrace, maxSum)
}

// TestPartitionedGatewayHoldsIncreases (issue 22): shares move (us-east 0.5 -> 0.8,
// eu-west 0.5 -> 0.2, then 0.9 / 0.1) while eu-west's gateway cannot reach PostgreSQL
// and so keeps 0.5. Without acknowledgments us-east enforced 0.8 at once: 0.8 + 0.5 =
// 1.3 for as long as the cut lasted. us-east now holds its increases until every eu-west
// gateway has reported (with its heartbeat) a snapshot that includes the writes: the
// enforced sum stays at 1, and us-east gets 0.9 once eu-west is back at 0.1.
func TestPartitionedGatewayHoldsIncreases(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "rebalancer", "test")
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	load := func() *regions.Snapshot {
		t.Helper()
		snap, err := s.LoadSnapshot(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	enforced := func(snap *regions.Snapshot, region string) float64 {
		share, _ := snap.Share(region, "shop-a", "orders")
		if ratio, pending := snap.Pending(region, "shop-a", "orders"); pending {
			share *= ratio
		}
		return share
	}
	beat := func(id, region string, snap *regions.Snapshot) {
		t.Helper()
		if err := s.HeartbeatAt(ctx, id, region, snap.Xmin()); err != nil {
			t.Fatal(err)
		}
	}
	us, eu := load(), load()
	beat("gw-us", "us-east", us)
	beat("gw-eu", "eu-west", eu)
	// eu-west is cut off from here on: it keeps eu and cannot heartbeat.
	if err := s.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.8, "eu-west": 0.2}, "alice", "move", 0); err != nil {
		t.Fatal(err)
	}
	us = load()
	beat("gw-us", "us-east", us)
	if u, e := enforced(us, "us-east"), enforced(eu, "eu-west"); u+e > 1+1e-9 {
		t.Errorf("eu-west cut off: us-east enforces %v + eu-west (old snapshot) %v = %v, want at most 1", u, e, u+e)
	} else if u != 0.5 {
		t.Errorf("eu-west cut off: us-east enforces %v, want its old 0.5 until eu-west acknowledges", u)
	}
	// A second move while eu-west is still away: us-east still holds the share eu-west
	// acknowledged last, 0.5 (the held ratios multiply: 0.5/0.8 x 0.8/0.9).
	if err := s.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.9, "eu-west": 0.1}, "alice", "move again", 0); err != nil {
		t.Fatal(err)
	}
	if u := enforced(load(), "us-east"); u < 0.5-1e-9 || u > 0.5+1e-9 {
		t.Errorf("a second move, eu-west still cut off: us-east enforces %v, want 0.5", u)
	}
	// eu-west is back: it reloads, and its next heartbeat acknowledges the writes.
	eu = load()
	if e := enforced(eu, "eu-west"); e != 0.1 {
		t.Errorf("eu-west back: it enforces %v, want 0.1", e)
	}
	if u := enforced(load(), "us-east"); u != 0.5 {
		t.Errorf("eu-west reloaded but has not heartbeaten: us-east enforces %v, want 0.5 still", u)
	}
	beat("gw-eu", "eu-west", eu)
	// The horizon is the server's: a transaction of another test's database still running
	// when eu-west loaded holds it below the writes, so eu-west reloads until its
	// snapshot is past them, as a gateway does on its next reload (bounded).
	u := enforced(load(), "us-east")
	for i := 0; u != 0.9 && i < 50; i++ {
		time.Sleep(100 * time.Millisecond)
		eu = load()
		beat("gw-eu", "eu-west", eu)
		u = enforced(load(), "us-east")
	}
	if u != 0.9 {
		t.Errorf("eu-west acknowledged: us-east enforces %v, want 0.9", u)
	}
	// A move after the acknowledgment holds only its own increase: 0.9 until eu-west
	// loads it, not the 0.5 of before.
	if err := s.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.95, "eu-west": 0.05}, "alice", "and again", 0); err != nil {
		t.Fatal(err)
	}
	if u := enforced(load(), "us-east"); u < 0.9-1e-9 || u > 0.9+1e-9 {
		t.Errorf("a move after the acknowledgment: us-east enforces %v, want 0.9 until eu-west loads it", u)
	}
}
