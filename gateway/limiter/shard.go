package limiter

import (
	"fmt"
	"math/rand/v2"

	"github.com/quotaplane/quotaplane/regions"
)

// MaxShards is the most sub-buckets a rule may be split into (regions.MaxShards).
const MaxShards = regions.MaxShards

// shards validates r.Shards against r's cost and returns the sub-buckets to use.
func (r Request) shards(cost int64) (int, error) {
	if r.Shards < 0 || r.Shards > MaxShards {
		return 0, fmt.Errorf("%w %s/%s: shards %d must be between 0 and %d", ErrInvalidRequest, r.Tenant, r.Route, r.Shards, MaxShards)
	}
	k := r.Limit.ShardCount(r.Shards)
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
