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
func TestPartitionedGatewayEndsOverrideOnTime(t *testing.T) {
	t.Parallel()
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
		return NewReloader(ReloaderOptions{Interval: time.Hour, Load: func(ctx context.Context) (*regions.Snapshot, error) {
			if partitioned && cut.Load() {
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
