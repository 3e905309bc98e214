package bench

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/lua"
)

// This file is the one place where the suite uses lua's script API: what our script
// is called with, how many Redis keys a bucket holds, how the memory phase writes a
// bucket. When the scripts change (one key per bucket, many buckets per call), this is
// the file to change; the phases only call these functions.

// keysPerBucket is the Redis keys one tenant/route bucket holds: the bucket and its
// rule record (lua/prelude.lua).
const keysPerBucket = 2

// ourCall is one decision by the script the gateway calls (token_bucket.lua), as
// redis-benchmark sends it: the bucket and its rule record, a rule that always admits,
// cost 1. redis-benchmark draws a number for each __rand_int__ on its own, so the
// record is another tenant's: the same work for the script, every rule being the same.
func ourCall() scriptCall {
	ref := lua.Keys{}.Bucket(randKey, "create-order")
	keys, args := lua.ScriptTake.Args(ref, ceilingRule, ceilingRule, 1, 0)
	return scriptCall{
		name: "ours", origin: "`lua.ScriptTake` (prelude.lua + token_bucket.lua)",
		source: lua.ScriptTake.Source(), keys: keys, args: strArgs(args), decisions: 1,
	}
}

// ourBatch is n decisions in one call of our script: the ceiling a batcher reaches
// when it sends many buckets per call. lua has no many-bucket script yet, so it is the
// stand-in issue 23 names: the article's logic looped over n keys in one call. Point
// it at lua's many-bucket script (its source, and the keys and arguments of n
// decisions) when there is one.
func ourBatch(n int) scriptCall {
	c := articleBatch(n)
	c.name = "ours-batch"
	c.origin = "stand-in until lua decides many buckets per call: " + c.origin
	return c
}

// memoryBucket is the call the memory phase fills Redis with: one token of the bucket
// of tenant/route taken under a rule that refills slowly, as the gateway writes it.
func memoryBucket(ctx context.Context, tenant, route string, capacity int64, refill float64) *redis.Cmd {
	return lua.ScriptTake.EvalShaCmd(ctx, lua.Keys{}.Bucket(tenant, route), capacity, refill, 1, 0)
}

// memoryBucketOK checks a memoryBucket call's reply: the token was taken.
func memoryBucketOK(cmd *redis.Cmd) error {
	r, err := lua.TakeReply(cmd)
	if err != nil {
		return err
	}
	if !r.Allowed {
		return fmt.Errorf("bucket refused its first token")
	}
	return nil
}

// memoryUsage writes one bucket of tenant/route, reads MEMORY USAGE of its key and
// deletes what it wrote.
func memoryUsage(ctx context.Context, rdb *redis.Client, tenant, route string, capacity int64, refill float64) (int64, error) {
	if err := lua.NewTokenBucket(rdb).Load(ctx); err != nil {
		return 0, err
	}
	ref := lua.Keys{}.Bucket(tenant, route)
	cmd := memoryBucket(ctx, tenant, route, capacity, refill)
	if err := rdb.Process(ctx, cmd); err != nil {
		return 0, err
	}
	if err := memoryBucketOK(cmd); err != nil {
		return 0, err
	}
	usage, err := rdb.MemoryUsage(ctx, ref.Key).Result()
	if err != nil {
		return 0, fmt.Errorf("MEMORY USAGE: %w", err)
	}
	return usage, rdb.Del(ctx, ref.Key, ref.Record).Err()
}

// loadScripts loads our scripts into rdb's script cache (for EVALSHA).
func loadScripts(ctx context.Context, rdb *redis.Client) error {
	return lua.NewTokenBucket(rdb).Load(ctx)
}

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
