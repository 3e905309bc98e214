package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed prelude.lua
	preludeSrc string
	//go:embed token_bucket.lua
	takeBody string
	//go:embed lease.lua
	leaseBody string
	//go:embed return.lua
	returnBody string
	//go:embed inspect.lua
	inspectBody string

	// Each script is the shared prelude (storage, rule record, refill maths) followed by
	// its own body, so each one still loads alone.
	tokenBucketSrc = preludeSrc + takeBody
	leaseSrc       = preludeSrc + leaseBody
	returnSrc      = preludeSrc + returnBody
	inspectSrc     = preludeSrc + inspectBody

	takeScript    = redis.NewScript(tokenBucketSrc)
	leaseScript   = redis.NewScript(leaseSrc)
	returnScript  = redis.NewScript(returnSrc)
	inspectScript = redis.NewScript(inspectSrc)
)

// TokenBucketSource is the text of token_bucket.lua with its prelude (for SCRIPT LOAD by
// tools such as redis-benchmark).
func TokenBucketSource() string { return tokenBucketSrc }

// LeaseSource is the text of lease.lua with its prelude.
func LeaseSource() string { return leaseSrc }

// ReturnSource is the text of return.lua with its prelude.
func ReturnSource() string { return returnSrc }

// ErrInvalidArgument is wrapped by every error about a bucket's arguments, whether Go
// caught them before the call or the script refused them.
var ErrInvalidArgument = errors.New("invalid token bucket argument")

// invalidPrefix starts the error replies of the scripts for bad arguments.
const invalidPrefix = "QPINVALID"

// Bounds of a bucket's rule that the scripts accept. Token counts are doubles in Lua:
// below 2^53 (about 9e15) every whole count is exact, so a capacity up to MaxCapacity,
// in debt down to -MaxCapacity, loses no token; MaxRefill bounds the refill per second
// so that a refill over any elapsed time stays a finite double. regions.MaxCapacity and
// regions.MaxRefillPerSecond are the same numbers (a test checks it).
const (
	MaxCapacity = 1_000_000_000_000_000
	MaxRefill   = 1_000_000_000_000
)

// Result is the outcome of one call on a bucket.
type Result struct {
	// Allowed reports whether the tokens were taken (for a lease: whether at least one
	// was granted).
	Allowed bool
	// Remaining is the number of whole tokens left in the bucket after this call.
	Remaining int64
	// RetryAfter is zero when Allowed; otherwise how long until the bucket holds the
	// tokens asked for (for a lease: one token), rounded up to the millisecond and at
	// most 2^40 ms (35 years, for rules that refill almost never).
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again if nothing more is taken,
	// rounded up to the millisecond, at most 2^40 ms.
	ResetAfter time.Duration
	// Charged is how much of the debt sent with the call (Take, Lease) the script
	// actually charged: the debt, less what the -capacity floor clipped.
	Charged int64
}

// TokenBucket runs the bucket scripts on one Redis (or a cluster, or a pipeline).
// It is safe for concurrent use and holds no state of its own.
type TokenBucket struct {
	rdb redis.Scripter
}

// NewTokenBucket returns a handle that runs the scripts on rdb.
func NewTokenBucket(rdb redis.Scripter) *TokenBucket {
	return &TokenBucket{rdb: rdb}
}

// Take takes cost tokens from the bucket ref, a bucket of capacity tokens refilled at
// refill tokens per second. Not enough tokens is Result{Allowed: false}, not an error.
// Arguments outside 1 <= cost <= capacity <= MaxCapacity, 0 < refill <= MaxRefill
// return an error wrapping ErrInvalidArgument without a Redis call.
func (b *TokenBucket) Take(ctx context.Context, ref Ref, capacity int64, refill float64, cost int64) (Result, error) {
	if err := checkBucket(capacity, refill); err != nil {
		return Result{}, fmt.Errorf("token bucket take %s: %w", ref.Key, err)
	}
	if cost < 1 || cost > capacity {
		return Result{}, fmt.Errorf("token bucket take %s: %w: cost %d must be between 1 and capacity %d", ref.Key, ErrInvalidArgument, cost, capacity)
	}
	keys, args := ScriptTake.Args(ref, capacity, refill, cost, 0)
	return TakeReply(takeScript.Run(ctx, b.rdb, keys, args...))
}

// Lease takes up to want tokens at once from the bucket ref and returns how many were
// granted: min(want, whole tokens available), possibly zero. Result.Allowed reports
// granted > 0; Result.RetryAfter is the wait for one token when none was granted. The
// caller spends the granted tokens locally and gives unused ones back with Return.
func (b *TokenBucket) Lease(ctx context.Context, ref Ref, capacity int64, refill float64, want int64) (int64, Result, error) {
	if err := checkBucket(capacity, refill); err != nil {
		return 0, Result{}, fmt.Errorf("token bucket lease %s: %w", ref.Key, err)
	}
	if want < 1 {
		return 0, Result{}, fmt.Errorf("token bucket lease %s: %w: want %d must be >= 1", ref.Key, ErrInvalidArgument, want)
	}
	keys, args := ScriptLease.Args(ref, capacity, refill, want, 0)
	return LeaseReply(leaseScript.Run(ctx, b.rdb, keys, args...))
}

// Return gives n unused tokens back to the bucket ref; the bucket never exceeds
// capacity, and a missing bucket is left alone. n == 0 does nothing (no Redis call).
func (b *TokenBucket) Return(ctx context.Context, ref Ref, capacity int64, refill float64, n int64) error {
	if err := checkBucket(capacity, refill); err != nil {
		return fmt.Errorf("token bucket return %s: %w", ref.Key, err)
	}
	if n < 0 {
		return fmt.Errorf("token bucket return %s: %w: n %d must be >= 0", ref.Key, ErrInvalidArgument, n)
	}
	if n == 0 {
		return nil
	}
	keys, args := ScriptReturn.Args(ref, capacity, refill, n, 0)
	if err := returnScript.Run(ctx, b.rdb, keys, args...).Err(); err != nil {
		return scriptError("return", ref.Key, err)
	}
	return nil
}

// State is a bucket as a call now would see it (Inspect).
type State struct {
	// Exists reports whether the bucket's key is in Redis; a missing bucket reads as
	// its rule record says (full for a rule first seen), or empty without a record.
	Exists bool
	// Tokens is the tokens the bucket holds now, refilled by Redis TIME; negative while
	// in debt.
	Tokens float64
	// ResetAfter is how long until the bucket is full if nothing is taken.
	ResetAfter time.Duration
	// TTL is the key's time to live; -1 for a key without expiry, -2 for a missing key
	// (Redis's PTTL).
	TTL time.Duration
	// StoredCapacity and StoredRefill are the rule the bucket was last written under
	// ("" when none is stored).
	StoredCapacity, StoredRefill string
}

// Inspect reads the bucket ref under the rule (capacity, refill) with the scripts' own
// maths (inspect.lua), writing nothing.
func (b *TokenBucket) Inspect(ctx context.Context, ref Ref, capacity int64, refill float64) (State, error) {
	if err := checkBucket(capacity, refill); err != nil {
		return State{}, fmt.Errorf("token bucket inspect %s: %w", ref.Key, err)
	}
	keys, args := ScriptTake.Args(ref, capacity, refill, 0, 0)
	v, err := inspectScript.Run(ctx, b.rdb, keys, args[:2]...).Slice()
	if err != nil {
		return State{}, scriptError("inspect", ref.Key, err)
	}
	if len(v) != 6 {
		return State{}, fmt.Errorf("token bucket inspect %s: unexpected reply of %d elements, want 6", ref.Key, len(v))
	}
	exists, _ := v[0].(int64)
	tok, _ := v[1].(string)
	reset, _ := v[2].(int64)
	ttl, _ := v[3].(int64)
	sc, _ := v[4].(string)
	sr, _ := v[5].(string)
	tokens, err := strconv.ParseFloat(tok, 64)
	if err != nil {
		return State{}, fmt.Errorf("token bucket inspect %s: tokens %q: %w", ref.Key, tok, err)
	}
	st := State{Exists: exists == 1, Tokens: tokens, ResetAfter: time.Duration(reset) * time.Millisecond,
		TTL: time.Duration(ttl), StoredCapacity: sc, StoredRefill: sr}
	if ttl >= 0 {
		st.TTL = time.Duration(ttl) * time.Millisecond
	}
	return st, nil
}

// Load loads the scripts into the script cache of rdb, so the first calls after a start
// need no EVAL. Run works without it.
func (b *TokenBucket) Load(ctx context.Context) error {
	for _, s := range []*redis.Script{takeScript, leaseScript, returnScript, inspectScript} {
		if err := s.Load(ctx, b.rdb).Err(); err != nil {
			return fmt.Errorf("load token bucket scripts: %w", err)
		}
	}
	return nil
}

func checkBucket(capacity int64, refill float64) error {
	if capacity < 1 || capacity > MaxCapacity {
		return fmt.Errorf("%w: capacity %d must be between 1 and %d", ErrInvalidArgument, capacity, int64(MaxCapacity))
	}
	if !(refill > 0) || refill > MaxRefill {
		return fmt.Errorf("%w: refill per second %v must be a number > 0 and <= %g", ErrInvalidArgument, refill, float64(MaxRefill))
	}
	return nil
}

// scriptError wraps a failed script call; the scripts' argument errors become
// ErrInvalidArgument so a caller can never mistake them for a Redis outage.
func scriptError(op, key string, err error) error {
	if redis.HasErrorPrefix(err, invalidPrefix) {
		return fmt.Errorf("token bucket %s %s: %w: %v", op, key, ErrInvalidArgument, err)
	}
	return fmt.Errorf("token bucket %s %s: %w", op, key, err)
}

// parse5 reads a reply of five integers.
func parse5(v []any) ([5]int64, error) {
	var r [5]int64
	if len(v) != 5 {
		return r, fmt.Errorf("unexpected reply of %d elements, want 5", len(v))
	}
	for i, e := range v {
		n, ok := e.(int64)
		if !ok {
			return r, fmt.Errorf("unexpected reply element %d of type %T, want an integer", i, e)
		}
		r[i] = n
	}
	return r, nil
}
