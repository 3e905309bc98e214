package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed token_bucket.lua
	tokenBucketSrc string
	//go:embed lease.lua
	leaseSrc string
	//go:embed return.lua
	returnSrc string

	takeScript   = redis.NewScript(tokenBucketSrc)
	leaseScript  = redis.NewScript(leaseSrc)
	returnScript = redis.NewScript(returnSrc)
)

// TokenBucketSource is the text of token_bucket.lua (for SCRIPT LOAD by tools such as
// redis-benchmark).
func TokenBucketSource() string { return tokenBucketSrc }

// LeaseSource is the text of lease.lua.
func LeaseSource() string { return leaseSrc }

// ReturnSource is the text of return.lua.
func ReturnSource() string { return returnSrc }

// ErrInvalidArgument is wrapped by every error about a bucket's arguments, whether Go
// caught them before the call or the script refused them.
var ErrInvalidArgument = errors.New("invalid token bucket argument")

// invalidPrefix starts the error replies of the scripts for bad arguments.
const invalidPrefix = "QPINVALID"

// MaxCapacity is the largest capacity the scripts accept: beyond it a float64 token
// count would lose whole tokens.
const MaxCapacity = 1_000_000_000_000_000

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

// Take takes cost tokens from the bucket at key, a bucket of capacity tokens refilled
// at refill tokens per second. Not enough tokens is Result{Allowed: false}, not an
// error. Arguments outside 1 <= cost <= capacity <= MaxCapacity, refill > 0 (finite)
// return an error wrapping ErrInvalidArgument without a Redis call.
func (b *TokenBucket) Take(ctx context.Context, key string, capacity int64, refill float64, cost int64) (Result, error) {
	if err := checkBucket(capacity, refill); err != nil {
		return Result{}, fmt.Errorf("token bucket take %s: %w", key, err)
	}
	if cost < 1 || cost > capacity {
		return Result{}, fmt.Errorf("token bucket take %s: %w: cost %d must be between 1 and capacity %d", key, ErrInvalidArgument, cost, capacity)
	}
	return TakeReply(takeScript.Run(ctx, b.rdb, []string{key}, capacity, refill, cost))
}

// Lease takes up to want tokens at once from the bucket at key and returns how many
// were granted: min(want, whole tokens available), possibly zero. Result.Allowed
// reports granted > 0; Result.RetryAfter is the wait for one token when none was granted.
// The caller spends the granted tokens locally and gives unused ones back with Return.
func (b *TokenBucket) Lease(ctx context.Context, key string, capacity int64, refill float64, want int64) (int64, Result, error) {
	if err := checkBucket(capacity, refill); err != nil {
		return 0, Result{}, fmt.Errorf("token bucket lease %s: %w", key, err)
	}
	if want < 1 {
		return 0, Result{}, fmt.Errorf("token bucket lease %s: %w: want %d must be >= 1", key, ErrInvalidArgument, want)
	}
	return LeaseReply(leaseScript.Run(ctx, b.rdb, []string{key}, capacity, refill, want))
}

// Return gives n unused tokens back to the bucket at key; the bucket never exceeds
// capacity. n == 0 does nothing (no Redis call).
func (b *TokenBucket) Return(ctx context.Context, key string, capacity int64, refill float64, n int64) error {
	if err := checkBucket(capacity, refill); err != nil {
		return fmt.Errorf("token bucket return %s: %w", key, err)
	}
	if n < 0 {
		return fmt.Errorf("token bucket return %s: %w: n %d must be >= 0", key, ErrInvalidArgument, n)
	}
	if n == 0 {
		return nil
	}
	if err := returnScript.Run(ctx, b.rdb, []string{key}, capacity, refill, n).Err(); err != nil {
		return scriptError("return", key, err)
	}
	return nil
}

// Load loads the three scripts into the script cache of rdb, so the first calls after
// a start need no EVAL. Run works without it.
func (b *TokenBucket) Load(ctx context.Context) error {
	for _, s := range []*redis.Script{takeScript, leaseScript, returnScript} {
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
	if !(refill > 0) || math.IsInf(refill, 0) {
		return fmt.Errorf("%w: refill per second %v must be a finite number > 0", ErrInvalidArgument, refill)
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

// parse4 reads a reply of four integers.
func parse4(v []any) ([4]int64, error) {
	var r [4]int64
	if len(v) != 4 {
		return r, fmt.Errorf("unexpected reply of %d elements, want 4", len(v))
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
