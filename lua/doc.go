// Package lua owns the Redis scripts of the shared token bucket (token_bucket.lua,
// lease.lua, return.lua, embedded with go:embed) and their Go handles, and the one
// function that builds bucket keys.
//
// A bucket is a Redis hash {tokens, ts} refilled by Redis TIME inside the script, so the
// decision is one atomic round trip and gateway clocks never matter. Scripts run through
// go-redis Script (EVALSHA, EVAL after NOSCRIPT), on any redis.Scripter: a client, a
// cluster client or a pipeline. A caller that batches calls itself builds the commands
// with Script.EvalShaCmd, queues them on a pipeline, reads them with TakeReply or
// LeaseReply, and retries a NOSCRIPT failure with Script.EvalCmd.
//
// Over the limit is a Result, not an error; an error means the script did not run or
// the arguments were invalid (ErrInvalidArgument, never a silent allow).
//
// This package must not import gateway, rebalancer, regions or cmd: it knows buckets,
// not tenants' rules or regions.
package lua
