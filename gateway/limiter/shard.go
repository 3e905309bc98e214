package limiter

import (
	"fmt"
	"math/rand/v2"

	"github.com/quotaplane/quotaplane/regions"
)

// MaxShards is the most sub-buckets a rule may be split into (as regions.Rule allows).
const MaxShards = 1024

// ShardCount is how many sub-buckets a rule of lim split into shards actually uses:
// shards, but never more than the capacity (each shard holds at least one token).
// 0 and 1 mean unsharded and return 1. (regions.Limit.ShardCount.)
func ShardCount(lim regions.Limit, shards int) int { return lim.ShardCount(shards) }

// ShardLimit is the part of lim that shard i of k holds (regions.Limit.Shard):
// capacity/k tokens, the remainder going one token each to the first shards, and
// refill/k. ratectl shows shards with the same split.
func ShardLimit(lim regions.Limit, k, i int) regions.Limit { return lim.Shard(k, i) }

// shards validates r.Shards against r's cost and returns the sub-buckets to use.
func (r Request) shards(cost int64) (int, error) {
	if r.Shards < 0 || r.Shards > MaxShards {
		return 0, fmt.Errorf("%w %s/%s: shards %d must be between 0 and %d", ErrInvalidRequest, r.Tenant, r.Route, r.Shards, MaxShards)
	}
	k := ShardCount(r.Limit, r.Shards)
	if k > 1 && cost > r.Limit.Capacity/int64(k) {
		// Some shard could never hold the cost; refusing is better than a silent
		// bypass of the sharded budget.
		return 0, fmt.Errorf("%w %s/%s: cost %d above the %d tokens of each of %d shards", ErrInvalidRequest, r.Tenant, r.Route, cost, r.Limit.Capacity/int64(k), k)
	}
	return k, nil
}

// twoShards picks a random shard and a second, different one (the retry after a
// rejection).
func twoShards(k int) (int, int) {
	i := rand.IntN(k)
	j := rand.IntN(k - 1)
	if j >= i {
		j++
	}
	return i, j
}
