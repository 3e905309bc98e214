package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// decideN makes n decisions of r and returns how many were admitted.
func decideN(t *testing.T, l *Redis, r Request, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		if mustDecide(t, l, r).Allowed {
			admitted++
		}
	}
	return admitted
}

// raisedSince is r with a raise at since: what the gateway's snapshot says after a change
// that may raise r's limit (more shards, a larger capacity), with ratio the old capacity
// over the new.
func raisedSince(r Request, since time.Time, ratio float64) Request {
	r.RaisedAgo, r.RaiseRatio = max(time.Since(since), time.Nanosecond), ratio
	return r
}

// TestReshardingConservesTokens (issue 14 item 2): a tenant at its limit (capacity 100,
// refill 0.01/s) whose rule goes from 1 to 4 to 8 shards, and back to 1, and to 8 again,
// gains no tokens: admitted in total <= C + R*t + 1. Every shard count change is a raise
// (the gateway's snapshot marks it): shards i >= 1 start from their refill, and the 7
// shards left over from the first 8 (refilled while the rule had one) do not come back
// full. Without the raise they do: 223 admitted.
func TestReshardingConservesTokens(t *testing.T) {
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{Timeout: time.Second})
	lim := regions.Limit{Capacity: 100, RefillPerSecond: 0.01}
	start := time.Now()
	admitted := 0
	for _, shards := range []int{1, 4, 8, 1, 8} {
		changed := time.Now()
		for range 300 {
			if mustDecide(t, l, raisedSince(Request{Tenant: "t", Route: "r", Limit: lim, Shards: shards}, changed, 1)).Allowed {
				admitted++
			}
		}
	}
	bound := float64(lim.Capacity) + lim.RefillPerSecond*time.Since(start).Seconds() + 1
	if float64(admitted) > bound {
		t.Fatalf("admitted %d through shards 1 -> 4 -> 8 -> 1 -> 8, want at most %.2f", admitted, bound)
	}
	t.Logf("admitted %d (bound %.2f)", admitted, bound)
}

// TestShareIncreaseConservesShards: ShardCount is min(shards, regional capacity), so a
// share increase alone changes it: a region holding 4 tokens of a rule of 8 shards uses
// 4 shards; its share grows to a capacity of 100 and 8 shards. Drained before, it must
// not find 4 new full shards: admitted <= the old bucket (4) + new refill since + 1.
func TestShareIncreaseConservesShards(t *testing.T) {
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{Timeout: time.Second})
	small := regions.Limit{Capacity: 4, RefillPerSecond: 0.0004}
	big := regions.Limit{Capacity: 100, RefillPerSecond: 0.01}
	admitted := decideN(t, l, Request{Tenant: "t", Route: "r", Limit: small, Shards: 8}, 50)
	start := time.Now()
	for range 300 {
		if mustDecide(t, l, raisedSince(Request{Tenant: "t", Route: "r", Limit: big, Shards: 8}, start, 0.04)).Allowed {
			admitted++
		}
	}
	bound := float64(small.Capacity) + big.RefillPerSecond*time.Since(start).Seconds() + 1
	if float64(admitted) > bound {
		t.Fatalf("admitted %d across a share increase (4 -> 8 shards), want at most %.2f", admitted, bound)
	}
}

// TestRuleRaisedAfterIdle (issue 14 item 3): rule 2 tokens / 1 per s, drained; after the
// old TTL (the key expired) the capacity is raised to 1000: admitted <= the old bucket
// (2) + the new refill (1/s) since the change + 1. The raise reaches the limiter as the
// gateway's snapshot marks it (Request.RaisedAgo); without it a missing key reads full.
func TestRuleRaisedAfterIdle(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	l := newTestRedis(t, rdb, Options{Timeout: time.Second})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 2, RefillPerSecond: 1}}
	if n := decideN(t, l, r, 5); n != 2 {
		t.Fatalf("admitted %d of a 2-token rule, want 2", n)
	}
	key := l.keys.Bucket("t", "r")
	ttl := rdb.PTTL(context.Background(), key).Val()
	if ttl <= 0 || ttl > 4*time.Second {
		t.Fatalf("PTTL of the drained key %v, want within (0, 4s]", ttl)
	}
	pollUntil(t, ttl+2*time.Second, "the drained key expires", func() bool {
		return rdb.Exists(context.Background(), key).Val() == 0
	})
	r.Limit.Capacity = 1000
	start := time.Now()
	n := 0
	for range 1000 {
		if mustDecide(t, l, raisedSince(r, start, 2.0/1000)).Allowed {
			n++
		}
	}
	if bound := 2 + r.Limit.RefillPerSecond*time.Since(start).Seconds() + 1; float64(n) > bound {
		t.Fatalf("admitted %d after the rule was raised to 1000 past the old TTL, want at most %.1f", n, bound)
	}
}

// TestRaiseAfterUnseenLoweringHoldsTheStoredBucket: a stored bucket written under 50
// (about 48 tokens left) whose rule is lowered to 4 while nothing calls it (so Redis
// still holds the bucket of 50), then raised to 100 (ratio 4/100): the raise must hold
// the stored bucket to the old limit (4) plus the new refill since, as it holds a missing
// one. Without the cap on stored buckets, the first calls find the tokens of 50: 48
// admitted (a black-box attack on plans found it through a plan change).
func TestRaiseAfterUnseenLoweringHoldsTheStoredBucket(t *testing.T) {
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{Timeout: time.Second})
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 50, RefillPerSecond: 0.05}}
	if n := decideN(t, l, r, 2); n != 2 {
		t.Fatalf("admitted %d of 2 under the rule of 50", n)
	}
	big := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 100, RefillPerSecond: 1}}
	start := time.Now()
	n := 0
	for range 100 {
		if mustDecide(t, l, raisedSince(big, start, 4.0/100)).Allowed {
			n++
		}
	}
	if bound := 4 + big.Limit.RefillPerSecond*time.Since(start).Seconds() + 1; float64(n) > bound {
		t.Fatalf("admitted %d after 50 -> 4 (unseen) -> 100, want at most %.1f", n, bound)
	}
}
