// Package limiter owns rate-limit decisions: the shared Redis token bucket behind a
// per-call timeout and a circuit breaker (Redis), the in-memory bucket that answers when
// Redis cannot (the fallback, holding 1/N of the regional rule), and the same bucket as
// the whole limiter of a standalone gateway (Local), and what keeps a hot key from
// costing one Redis round trip per request: token leases (lease.go), bucket shards
// (shard.go) and pipelined decisions (batch.go).
//
// Both limiters answer Decide(ctx, Request) (Decision, error). Over the limit is a
// Decision with Allowed false, never an error; an error means the request itself is
// invalid or the caller's context ended. A Redis failure is not an error: the decision
// then comes from the fallback (Source "fallback").
//
// There is no long-lived goroutine and so no Run: lease expiry is lazy (checked on the
// key's next decision), the batcher's senders exit when its queue is empty, and the
// script reload after a failed call or a NOSCRIPT is one goroutine under a deadline,
// which Redis.Close stops.
//
// It imports lua (scripts and keys) and regions (Limit, Scale). It must not import
// gateway, rebalancer or cmd, and knows nothing of HTTP, API keys or shares.
package limiter
