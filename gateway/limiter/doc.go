// Package limiter owns rate-limit decisions: the shared Redis token bucket behind a
// per-call timeout and a circuit breaker (Redis), the in-memory buckets that answer when
// Redis cannot and the debts of what they admitted (fallback, holding floor(1/N) of the
// regional rule), the same bucket as the whole limiter of a standalone gateway (Local),
// and what keeps a hot key from costing one Redis round trip per request: token leases
// (lease.go), bucket shards (shard.go) and pipelined decisions (batch.go). A rule's
// further bands (Request.Bands) are one bucket each, decided with the rule's own in one
// script call, all or none (bands.go). A cost known only after the response is settled
// afterwards (settle.go): the difference is charged into debt, never clipped at
// -capacity, or given back.
//
// Who owns what:
//   - Redis: the breaker, the timeout and the one path that carries a debt to Redis and
//     settles it (callCharging), used by the plain, sharded, lease and Settle paths.
//   - fallback: the local 1/N buckets and the debts, and the settles Redis did not
//     answer; a debt is cleared only once a reply saying what the script charged was read.
//   - batcher: pipelining of concurrent calls, through a small runner interface.
//   - leaseTable: hot keys' rates and leased tokens.
//   - Options (options.go): every default, filled in one place.
//
// Both limiters answer Decide(ctx, Request) (Decision, error) and Settle(ctx, Request,
// delta) error, and have Close. Over the
// limit is a Decision with Allowed false, never an error; an error means the request
// itself is invalid or the caller's context ended. A Redis failure is not an error: the
// decision then comes from the fallback (SourceFallback). The limit invariant these keep,
// and its named slack, is in docs/reliability.md.
//
// There is no long-lived goroutine and so no Run: lease expiry is lazy (checked on the
// key's next decision), the batcher's senders exit when its queue is empty, and the
// script reload after a failed call or a NOSCRIPT is one goroutine under a deadline,
// which Redis.Close stops.
//
// It imports lua (scripts and keys) and regions (Limit). It must not import gateway,
// rebalancer or cmd, and knows nothing of HTTP, API keys or shares.
package limiter
