package limiter

import (
	"errors"
	"fmt"
	"time"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// Source says which mechanism made a decision; its String is the "source" label of the
// gateway's request metrics.
type Source uint8

const (
	// SourceRedis: the region's shared bucket in Redis decided.
	SourceRedis Source = iota + 1
	// SourceFallback: Redis failed or the breaker is open; a local bucket holding 1/N
	// of the regional rule decided.
	SourceFallback
	// SourceLocal: a standalone limiter (no Redis at all) decided with the whole rule.
	SourceLocal
	// SourceLease: tokens leased earlier from Redis and spent locally decided; also a
	// rejection made locally while a hot key's shared bucket is known to be empty.
	SourceLease
)

// String is the source's label: "redis", "fallback", "local", "lease"; "" for the zero
// value (no decision).
func (s Source) String() string {
	switch s {
	case SourceRedis:
		return "redis"
	case SourceFallback:
		return "fallback"
	case SourceLocal:
		return "local"
	case SourceLease:
		return "lease"
	default:
		return ""
	}
}

// MarshalText writes the label, so a Decision in JSON or a log shows "redis", not 1.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Decision is the answer for one request.
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Limit is the capacity (burst) that was enforced: the regional rule's capacity for
	// Redis and standalone decisions, this instance's 1/N of it for fallback ones.
	Limit int64
	// RefillPerSecond is the refill of the bucket that decided, with Limit: the rule's
	// for Redis, lease and standalone decisions, this instance's 1/N of it for fallback
	// ones (for the RateLimit-Policy header, without re-deriving the fallback's split).
	RefillPerSecond float64
	// Remaining is the number of whole tokens left after this decision.
	Remaining int64
	// RetryAfter is zero when Allowed; otherwise how long until the request's cost in
	// tokens will be available.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again if nothing more is taken.
	ResetAfter time.Duration
	// Source says which mechanism decided.
	Source Source
	// used is a quota band's counter after the decision (BandState.Used), carried
	// from a bucket's decision to its band's state.
	used  int64
	quota *regions.QuotaCounter
	// Bands, for a request with Bands, are the rule's bands after the decision: first
	// the rule's own (regions.PrimaryBand, with the value's bucket folded in as the
	// top-level fields fold it), then each of Request.Bands in order. The top-level
	// fields are the band closest to exhaustion (the refusing one that refuses longest
	// when refused). Nil for a request without bands.
	Bands []BandState
}

// BandState is one band of a decision, for the RateLimit-Policy header: the band's limit
// as this decision enforced it (a fallback's 1/N) and its bucket after the decision.
type BandState struct {
	Name            string
	Limit           int64
	RefillPerSecond float64
	Remaining       int64
	ResetAfter      time.Duration
	// Quota is a quota band's period and policy (regions.BandLimit.Quota), nil for a
	// token bucket. Limit is then the allowance this decision enforced (a fallback's
	// part of what is left of it), Remaining what is left of it and ResetAfter the time
	// to the period's end.
	Quota *regions.QuotaCounter
	// Used is a quota band's counter after a decision Redis made: the region's usage this
	// period, for the gateway to report (0 otherwise).
	Used int64
}

// Request asks for tokens of one tenant's bucket for one route.
type Request struct {
	// Tenant and Route name the bucket; both already validated ids
	// ([A-Za-z0-9._-]{1,64}, regions.ValidateID).
	Tenant, Route string
	// Limit is the rule this region enforces (already scaled by the region's share).
	Limit regions.Limit
	// Cost is the number of tokens the request takes; 0 means 1.
	Cost int64
	// Shards is the rule's shard count (regions.Rule.Shards). 0 and 1 mean one bucket
	// "rl:{tenant}:route". K >= 2 splits the rule into K sub-buckets "rl:tenant:route:i"
	// (no hash tag, so they spread over a Redis Cluster), each holding ShardLimit of it;
	// a decision takes from a random shard and, when that one rejects, from one other.
	// A sharded request's cost must fit in one shard (at most Capacity/K). The Local
	// limiter and the fallback ignore it, and so does a request with a Value or Bands.
	Shards int
	// Value, when not empty, is a client value (a client IP, a header value, an RLS
	// descriptor value) whose own bucket, of ValueLimit, is nested inside the tenant's
	// route bucket: a request is admitted only if both admit, in one script call, and
	// then takes its cost from both. Key "rl:{tenant}:route:v:<hash>" (lua.Keys.Value:
	// 22 characters of SHA-256 whatever the value's length). The Local limiter and the
	// fallback key by it too. The gateway refuses values above MaxValueLen before asking.
	Value string
	// ValueLimit is the per-value bucket's limit (already scaled by the region's share);
	// required with Value.
	ValueLimit regions.Limit
	// Bands are the rule's further bands (regions.Rule.ScaledBands, already scaled by
	// the region's share), each its own bucket "rl:{tenant}:route:b:name" (lua.Keys.Band)
	// decided with the route bucket (and the value's) in one script call: admitted only
	// if all admit, then the cost is taken from each. The cost must fit every band's
	// capacity. Shards and leases are not used for a request with bands (as with a
	// Value); the fallback and the Local limiter keep a bucket per band too.
	Bands []regions.BandLimit
	// RaisedAgo, when > 0, says the tenant's limit may have been raised that long ago
	// (regions.Snapshot.Raise: a larger rule or share, a rule or share added or removed,
	// more shards), and RaiseRatio is the old capacity over the new (0 when unknown).
	// Until one fill time has passed, a bucket of the request, missing or stored, holds at
	// most RaiseRatio x its capacity plus its refill over RaisedAgo, so a bucket that
	// expired full under the old limit does not come back full at the new one, nor does
	// one stored under a larger rule before a lowering no call saw (a stored one converted
	// from the old limit holds no more anyway). A shard other than shard 0 is held to that
	// as a new one (ratio 0), so one left over from an earlier layout, which refilled while
	// unused, does not come back full either.
	RaisedAgo  time.Duration
	RaiseRatio float64
	// ChangedAgo, when > 0, is how long the request's limits have been in force, as far
	// as the caller knows: the gateway sends the age of their last change
	// (regions.Snapshot.ChangedAgo: the rule's and the share's rows, a raise) less one
	// reload lag, within which another gateway may still enforce the old ones. A bucket
	// Redis holds under another rule is converted at that instant (lua.Bucket.ChangedAgo),
	// so a lowered refill holds from then, not from the bucket's next call. 0 converts it
	// at its next call.
	ChangedAgo time.Duration
	// BandRaises, when not nil, are the raises of Bands, in their order, as RaisedAgo and
	// RaiseRatio are the route bucket's (regions.Snapshot.BandRaise: the band's own and
	// the region's share's; a raise of the rule's own capacity does not hold a band). A
	// band without one (nil, or Ago 0) is not held.
	BandRaises []Raise
}

// Raise is a possible raise of one bucket's limit: how long ago, and the old capacity
// over the new (Request.RaisedAgo and RaiseRatio).
type Raise struct {
	Ago   time.Duration
	Ratio float64
}

// bucket is the bucket at key of shard shard of lim, held by capFor: the cap holds it
// missing or stored (lua.Bucket.CapAll). A stored bucket converted from the rule it was
// written under holds no more than the old limit anyway; one written under a larger rule
// before a lowering nobody called it under (50, then 4 unseen, then 100) would otherwise
// keep the tokens of 50 through the raise.
func (r Request) bucket(key string, lim regions.Limit, shard int) lua.Bucket {
	c := r.capFor(lim, shard)
	return lua.Bucket{Key: key, Capacity: lim.Capacity, Refill: lim.RefillPerSecond, Cap: c, CapAll: c >= 0, ChangedAgo: r.ChangedAgo}
}

// capFor is the most a bucket of lim (shard i of a sharded rule; 0 for any other) may
// hold now after the request's raise: lua.NoCap when no raise is known or its fill time
// has passed.
func (r Request) capFor(lim regions.Limit, shard int) float64 {
	return capWith(lim, Raise{Ago: r.RaisedAgo, Ratio: r.RaiseRatio}, shard)
}

// bandCap is capFor for r's band i, held by its own raise (BandRaises).
func (r Request) bandCap(i int, lim regions.Limit) float64 {
	if i >= len(r.BandRaises) {
		return lua.NoCap
	}
	return capWith(lim, r.BandRaises[i], 0)
}

// capWith is the most a bucket of lim (shard i of a sharded rule; 0 for any other) may
// hold now after raise: lua.NoCap when none is known or its fill time has passed.
func capWith(lim regions.Limit, raise Raise, shard int) float64 {
	if raise.Ago <= 0 {
		return lua.NoCap
	}
	ratio := max(0, min(raise.Ratio, 1))
	if shard > 0 {
		ratio = 0
	}
	c := float64(lim.Capacity)*ratio + lim.RefillPerSecond*raise.Ago.Seconds()
	if !(c < float64(lim.Capacity)) {
		return lua.NoCap
	}
	return c
}

// ErrInvalidRequest is wrapped by the error of a request no bucket can answer: a
// non-positive capacity or refill, a negative cost, or a cost above capacity (a band's
// included); a band without a name, named regions.PrimaryBand or twice, or more than
// regions.MaxBands bands.
var ErrInvalidRequest = errors.New("invalid rate limit request")

// MaxValueLen is the longest client value the gateway asks about: it refuses a longer one
// (400, or over the limit for Envoy) rather than hash an unbounded one.
const MaxValueLen = 256

// cost validates r and returns its cost in tokens (0 means 1).
func (r Request) cost() (int64, error) {
	if err := checkLimit(r, "", r.Limit); err != nil {
		return 0, err
	}
	cost := r.Cost
	if cost == 0 {
		cost = 1
	}
	if cost < 1 || cost > r.Limit.Capacity {
		return 0, fmt.Errorf("%w %s/%s: cost %d must be between 1 and capacity %d", ErrInvalidRequest, r.Tenant, r.Route, r.Cost, r.Limit.Capacity)
	}
	if r.Value != "" {
		if err := checkLimit(r, "value ", r.ValueLimit); err != nil {
			return 0, err
		}
		if cost > r.ValueLimit.Capacity {
			return 0, fmt.Errorf("%w %s/%s: cost %d must be between 1 and the value's capacity %d", ErrInvalidRequest, r.Tenant, r.Route, r.Cost, r.ValueLimit.Capacity)
		}
	}
	if len(r.Bands) > 0 {
		if err := r.checkBands(cost); err != nil {
			return 0, err
		}
	}
	if r.ChangedAgo < 0 {
		return 0, fmt.Errorf("%w %s/%s: changed %v ago (want a duration >= 0)", ErrInvalidRequest, r.Tenant, r.Route, r.ChangedAgo)
	}
	if r.RaisedAgo < 0 || !(r.RaiseRatio >= 0 && r.RaiseRatio <= 1) {
		return 0, fmt.Errorf("%w %s/%s: raise %v ago with ratio %v (want a duration >= 0 and a ratio in [0, 1])", ErrInvalidRequest, r.Tenant, r.Route, r.RaisedAgo, r.RaiseRatio)
	}
	return cost, nil
}

func checkLimit(r Request, what string, l regions.Limit) error {
	if l.Capacity < 1 || l.Capacity > lua.MaxCapacity {
		return fmt.Errorf("%w %s/%s: %scapacity %d must be between 1 and %d", ErrInvalidRequest, r.Tenant, r.Route, what, l.Capacity, int64(lua.MaxCapacity))
	}
	if !(l.RefillPerSecond > 0) || l.RefillPerSecond > lua.MaxRefill {
		return fmt.Errorf("%w %s/%s: %srefill per second %v must be > 0 and at most %g", ErrInvalidRequest, r.Tenant, r.Route, what, l.RefillPerSecond, float64(lua.MaxRefill))
	}
	return nil
}
