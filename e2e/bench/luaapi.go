package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/lua"
)

// This file is the one place where the suite uses lua's script API: what our script
// is called with, how many Redis keys a bucket holds, how the memory phase writes a
// bucket. When the scripts change (one key per bucket, many buckets per call), this is
// the file to change; the phases only call these functions.

// keysPerBucket is the Redis keys one tenant/route bucket holds: the bucket alone
// (lua/state.lua).
const keysPerBucket = 1

// ourCall is one decision by the script the gateway calls (decide.lua), as the batcher
// sends a lone one: one bucket, a rule that always admits, cost 1.
func ourCall() scriptCall { return ourBatchOf("ours", 1) }

// ourBatch is n decisions in one call of our script, on n random buckets: what the
// batcher sends under load.
func ourBatch(n int) scriptCall { return ourBatchOf("ours-batch", n) }

func ourBatchOf(name string, n int) scriptCall {
	return scriptCall{
		name: name, origin: fmt.Sprintf("`lua.DecideSource` (state.lua + decide.lua), %d decision(s) a call", n),
		source: lua.DecideSource(), decisions: n,
		binary: func(r *rand.Rand, keys int) ([]string, []byte) {
			var b lua.Batch
			for range n {
				key := lua.Keys{}.Bucket(strconv.Itoa(r.IntN(keys)), "create-order")
				b.Add(lua.Decision{Op: lua.OpTake, N: 1, Buckets: []lua.Bucket{{Key: key, Capacity: ceilingCapacity, Refill: ceilingRefill, Cap: lua.NoCap}}})
			}
			ks, arg := b.Args()
			return slices.Clone(ks), slices.Clone(arg)
		},
	}
}

// memoryBucket is the call the memory phase fills Redis with: one token of the bucket
// of tenant/route taken under a rule that refills slowly, as the gateway writes it.
func memoryBucket(ctx context.Context, tenant, route string, capacity int64, refill float64) *memoryCall {
	var b lua.Batch
	b.Add(lua.Decision{Op: lua.OpTake, N: 1, Buckets: []lua.Bucket{{Key: lua.Keys{}.Bucket(tenant, route), Capacity: capacity, Refill: refill, Cap: lua.NoCap}}})
	return &memoryCall{Cmd: b.Cmd(ctx), batch: b}
}

// memoryCall is a memoryBucket call and what reads its reply.
type memoryCall struct {
	*redis.Cmd
	batch lua.Batch
}

// memoryBucketOK checks a memoryBucket call's reply: the token was taken.
func memoryBucketOK(c *memoryCall) error {
	out, err := c.batch.Read(c.Cmd, nil)
	if err != nil {
		return err
	}
	if out[0].Granted != 1 {
		return fmt.Errorf("bucket refused its first token")
	}
	return nil
}

// memoryUsage writes one bucket of tenant/route, reads MEMORY USAGE of its key and
// deletes what it wrote.
func memoryUsage(ctx context.Context, rdb *redis.Client, tenant, route string, capacity int64, refill float64) (int64, error) {
	if err := lua.Load(ctx, rdb); err != nil {
		return 0, err
	}
	key := lua.Keys{}.Bucket(tenant, route)
	c := memoryBucket(ctx, tenant, route, capacity, refill)
	if err := rdb.Process(ctx, c.Cmd); err != nil {
		return 0, err
	}
	if err := memoryBucketOK(c); err != nil {
		return 0, err
	}
	usage, err := rdb.MemoryUsage(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("MEMORY USAGE: %w", err)
	}
	return usage, rdb.Del(ctx, key).Err()
}

// loadScripts loads our scripts into rdb's script cache (for EVALSHA).
func loadScripts(ctx context.Context, rdb *redis.Client) error { return lua.Load(ctx, rdb) }

func strArgs(args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		case float64:
			out[i] = strconv.FormatFloat(v, 'f', -1, 64)
		default:
			out[i] = fmt.Sprint(v)
		}
	}
	return out
}
