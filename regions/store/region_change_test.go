package store

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// TestAddRegionCostsNobody: a region added (regions add, or apply -f) starts at the floor
// in every scope, so no live region's share of any tenant moves by more than the floor —
// neither a scope with rebalancer rows, nor a tenant that follows "*" or the equal split.
// Before issue 22 the new region got 1/N and every advertised limit fell by a third (and
// apply -f gave it 0).
func TestAddRegionCostsNobody(t *testing.T) {
	t.Parallel()
	ctx := WithAudit(context.Background(), "alice", "capacity")
	pair := regions.Scope{Tenant: "shop-a", Route: "list"}
	for _, how := range []string{"regions add", "apply -f"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			s, _ := newStore(t)
			for _, r := range []string{"us-east", "eu-west"} {
				if err := s.AddRegion(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			// shop-a/list has rebalancer rows 0.7/0.3; "*" has none (the equal split).
			if err := s.WriteRebalancerShares(ctx, []ShareChange{
				{Scope: pair, Region: "us-east", New: 0.7},
				{Scope: pair, Region: "eu-west", New: 0.3},
			}, nil, "rebalancer"); err != nil {
				t.Fatal(err)
			}
			before, err := s.LoadSnapshot(ctx, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			switch how {
			case "regions add":
				err = s.AddRegion(ctx, "ap-south")
			default:
				_, err = s.Apply(ctx, Config{Regions: &[]string{"ap-south", "eu-west", "us-east"}}, "alice", "capacity")
			}
			if err != nil {
				t.Fatal(err)
			}
			after, err := s.LoadSnapshot(ctx, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			floor := 0.05
			for _, tr := range [][2]string{{pair.Tenant, pair.Route}, {"shop-b", "list"}} {
				sum := 0.0
				for _, r := range after.Regions() {
					got, _ := after.Share(r, tr[0], tr[1])
					sum += got
					if r == "ap-south" {
						if math.Abs(got-floor) > 1e-9 {
							t.Errorf("%s/%s: new region's share %v, want the floor %v", tr[0], tr[1], got, floor)
						}
						continue
					}
					was, _ := before.Share(r, tr[0], tr[1])
					if was-got > floor+1e-9 {
						t.Errorf("%s/%s in %s: share %v -> %v, fell by more than the floor", tr[0], tr[1], r, was, got)
					}
				}
				if math.Abs(sum-1) > 1e-9 {
					t.Errorf("%s/%s: shares sum to %v after the add, want 1", tr[0], tr[1], sum)
				}
			}
		})
	}
}
