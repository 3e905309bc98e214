package limiter

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

func TestShardLimit(t *testing.T) {
	tests := []struct {
		capacity   int64
		refill     float64
		shards     int
		k          int
		capacities []int64
	}{
		{10, 4, 4, 4, []int64{3, 3, 2, 2}},
		{8, 4, 4, 4, []int64{2, 2, 2, 2}},
		{3, 1, 8, 3, []int64{1, 1, 1}}, // fewer tokens than shards: one token each
		{100, 10, 1, 1, []int64{100}},
		{100, 10, 0, 1, []int64{100}},
		{7, 7, 2, 2, []int64{4, 3}},
	}
	for _, tt := range tests {
		lim := regions.Limit{Capacity: tt.capacity, RefillPerSecond: tt.refill}
		k := lim.ShardCount(tt.shards)
		if k != tt.k {
			t.Errorf("ShardCount(%d tokens, %d shards) = %d, want %d", tt.capacity, tt.shards, k, tt.k)
			continue
		}
		for i, want := range tt.capacities {
			got := lim.Shard(k, i)
			if got.Capacity != want || math.Abs(got.RefillPerSecond-tt.refill/float64(k)) > 1e-12 {
				t.Errorf("ShardLimit(%+v, %d, %d) = %+v, want capacity %d refill %v", lim, k, i, got, want, tt.refill/float64(k))
			}
		}
	}
}

// FuzzShardLimit: the shards' capacities add up to the rule's, each holds at least one
// token and they differ by at most one; the refills add up to the rule's.
func FuzzShardLimit(f *testing.F) {
	f.Add(int64(10), 4.0, 4)
	f.Add(int64(1), 0.5, 1024)
	f.Add(int64(lua.MaxCapacity), 1e9, 1000)
	f.Fuzz(func(t *testing.T, capacity int64, refill float64, shards int) {
		if capacity < 1 || capacity > lua.MaxCapacity || !(refill > 0) || math.IsInf(refill, 0) || shards < 0 || shards > MaxShards {
			return
		}
		lim := regions.Limit{Capacity: capacity, RefillPerSecond: refill}
		k := lim.ShardCount(shards)
		if k < 1 || k > max(shards, 1) || int64(k) > capacity {
			t.Fatalf("ShardCount(%d, %d) = %d", capacity, shards, k)
		}
		var sum int64
		var rsum float64
		lo, hi := int64(math.MaxInt64), int64(0)
		for i := range k {
			s := lim.Shard(k, i)
			sum += s.Capacity
			rsum += s.RefillPerSecond
			lo, hi = min(lo, s.Capacity), max(hi, s.Capacity)
		}
		if sum != capacity || lo < 1 || hi-lo > 1 {
			t.Fatalf("%d shards of %d: sum %d, min %d, max %d", k, capacity, sum, lo, hi)
		}
		if math.Abs(rsum-refill) > refill*1e-9 {
			t.Fatalf("%d shards of refill %v: sum %v", k, refill, rsum)
		}
	})
}

// TestRedisShards: a rule split in 2 shards admits at most its capacity (a request
// rejected by one shard tries the other) and a decision reports the whole rule. Shard 0
// is the unsharded bucket (full for a rule first seen); shard 1, in another Redis
// Cluster slot without a rule record, starts empty and fills at its refill, so a
// sharded rule never holds more than its capacity, whatever the shard count was before.
func TestRedisShards(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	ctx := context.Background()
	for _, pipelining := range []bool{false, true} {
		name := "pipelining"
		if !pipelining {
			name = "no pipelining"
		}
		t.Run(name, func(t *testing.T) {
			prefix := "s" + name[:2]
			l := newTestRedis(t, rdb, Options{KeyPrefix: prefix, Pipeline: PipelineOptions{Off: !pipelining}, Timeout: 1e9})
			r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 0.001}, Shards: 2}
			keys := lua.Keys{Prefix: prefix}
			count := func() (admitted int) {
				for range 30 {
					d := mustDecide(t, l, r)
					if d.Source != SourceRedis || d.Limit != 10 {
						t.Fatalf("%+v, want a redis decision with the rule's limit 10", d)
					}
					if d.Allowed {
						admitted++
					}
				}
				return admitted
			}
			if n := count(); n != 10 {
				t.Errorf("admitted %d of a new 10-token rule in 2 shards, want 10 (both shards, 5 each)", n)
			}
			for i := range 2 {
				if n := rdb.Exists(ctx, keys.Shard("t", "r", i)).Val(); n != 1 {
					t.Errorf("shard key %s missing", keys.Shard("t", "r", i))
				}
			}
			// The shards go (their TTL) and the rule is sharded anew: a raise. Shard 0
			// holds its old share, shard 1 starts from its refill.
			if err := rdb.Del(ctx, keys.Shard("t", "r", 0), keys.Shard("t", "r", 1)).Err(); err != nil {
				t.Fatal(err)
			}
			r = raisedSince(r, time.Now(), 1)
			if n := count(); n != 5 {
				t.Errorf("admitted %d of a 10-token rule just sharded in 2, want 5 (shard 0's)", n)
			}
		})
	}
}

func TestRedisShardsInvalid(t *testing.T) {
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{})
	tests := []Request{
		{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}, Shards: -1},
		{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}, Shards: MaxShards + 1},
		{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}, Shards: 4, Cost: 3}, // 2 tokens a shard
	}
	for _, r := range tests {
		if _, err := l.Decide(context.Background(), r); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: %v, want ErrInvalidRequest", r, err)
		}
	}
	ok := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}, Shards: 4, Cost: 2}
	mustDecide(t, l, ok) // cost 2 fits a shard of 2: a decision, not ErrInvalidRequest
}
