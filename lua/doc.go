// Package lua owns the Redis side of the shared token bucket: the scripts
// (token_bucket.lua, lease.lua, return.lua, inspect.lua, each built from the shared
// prelude.lua and embedded with go:embed), the one Go encoder of their arguments
// (Script.Args), the readers of their replies, the one reader of a bucket's state
// (TokenBucket.Inspect, used by ratectl bucket inspect), and the one function that
// names keys (Keys).
//
// A bucket is a Redis hash {tokens, ts, c, r} refilled by Redis TIME inside the script,
// so the decision is one atomic round trip and gateway clocks never matter; c and r are
// the rule it was written under. The buckets of a tenant's route live in the tenant's
// Redis Cluster slot next to a rule record {c, r, s, p} that never expires and says what
// a missing bucket reads as: full for a rule first seen, and after a rule change the old
// bucket plus the new refill since the change, so neither a TTL nor a raised rule creates
// tokens. Shard 0 of a sharded rule is the rule's own bucket; shards i >= 1 spread over
// the cluster without a record, so a missing one starts empty (a new shard count creates
// no tokens) and never expires. See prelude.lua for the details.
//
// Scripts run through go-redis Script (EVALSHA, EVAL after NOSCRIPT), on any
// redis.Scripter: a client, a cluster client or a pipeline. A caller that batches calls
// itself builds the commands with Script.EvalShaCmd, queues them on a pipeline, reads
// them with Script.Reply, and retries a NOSCRIPT failure with Script.EvalCmd.
//
// Over the limit is a Result, not an error; an error means the script did not run or
// the arguments were invalid (ErrInvalidArgument, never a silent allow).
//
// This package must not import gateway, rebalancer, regions or cmd: it knows buckets,
// not tenants' rules or regions.
package lua
