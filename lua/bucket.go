package lua

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// TokenBucket runs the bucket scripts on one Redis (or a cluster, or a pipeline): one
// round trip per call. It is safe for concurrent use and holds no state of its own. A
// caller that batches decisions itself (the gateway's limiter) builds a Batch instead.
type TokenBucket struct {
	rdb redis.Scripter
}

// NewTokenBucket returns a handle that runs the scripts on rdb.
func NewTokenBucket(rdb redis.Scripter) *TokenBucket { return &TokenBucket{rdb: rdb} }

// Decide runs ds as one script call (in a Redis Cluster their keys must share a slot)
// and returns one Outcome per decision. An invalid decision returns an error wrapping
// ErrInvalidArgument without a Redis call.
func (b *TokenBucket) Decide(ctx context.Context, ds ...Decision) ([]Outcome, error) {
	var batch Batch
	for _, d := range ds {
		if err := d.Check(); err != nil {
			return nil, err
		}
		batch.Add(d)
	}
	cmd := b.rdb.EvalSha(ctx, DecideSha(), batch.keys, batch.args)
	if IsNoScript(cmd.Err()) {
		cmd = b.rdb.Eval(ctx, DecideSource(), batch.keys, batch.args)
	}
	return batch.Read(cmd, make([]Outcome, 0, len(ds)))
}

// Take takes cost tokens from the one bucket key (capacity, refill): a one-bucket OpTake.
func (b *TokenBucket) Take(ctx context.Context, key string, capacity int64, refill float64, cost int64) (Outcome, error) {
	return b.one(ctx, Decision{Op: OpTake, N: cost, Buckets: []Bucket{{Key: key, Capacity: capacity, Refill: refill, Cap: NoCap}}})
}

func (b *TokenBucket) one(ctx context.Context, d Decision) (Outcome, error) {
	out, err := b.Decide(ctx, d)
	if err != nil {
		return Outcome{}, err
	}
	return out[0], nil
}

// State is a bucket as a take now would see it (Inspect).
type State struct {
	// Exists reports whether the bucket's key is in Redis; a missing bucket reads full.
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

// Stored is a bucket's value as the scripts write it: when it is full again (Redis TIME)
// and the rule it was written under.
type Stored struct {
	Full             time.Time
	Capacity, Refill float64
}

// DecodeStored reads a bucket's value (GET), for a tool that shows it (ratectl bucket
// inspect); its tokens at any time come from Inspect, the scripts' own maths.
func DecodeStored(v []byte) (Stored, error) {
	if len(v) != 28 {
		return Stored{}, fmt.Errorf("a bucket is 28 bytes, not %d", len(v))
	}
	s := binary.LittleEndian.Uint32(v)
	us := math.Float64frombits(binary.LittleEndian.Uint64(v[4:]))
	full := time.Unix(int64(s), 0).Add(time.Duration(us * 1e3))
	return Stored{Full: full, Capacity: math.Float64frombits(binary.LittleEndian.Uint64(v[12:])), Refill: math.Float64frombits(binary.LittleEndian.Uint64(v[20:]))}, nil
}

// Inspect reads the bucket key under the rule (capacity, refill), which last changed
// changedAgo ago (0: not known; Bucket.ChangedAgo), with the scripts' own maths
// (inspect.lua), writing nothing.
func (b *TokenBucket) Inspect(ctx context.Context, key string, capacity int64, refill float64, changedAgo time.Duration) (State, error) {
	if err := checkRule(capacity, refill); err != nil {
		return State{}, fmt.Errorf("token bucket inspect %s: %w", key, err)
	}
	if changedAgo < 0 {
		return State{}, fmt.Errorf("token bucket inspect %s: %w: changed %v ago, want a duration >= 0", key, ErrInvalidArgument, changedAgo)
	}
	ago := min(float64(changedAgo)/float64(time.Millisecond), maxAgoMillis)
	v, err := inspectScript.Run(ctx, b.rdb, []string{key}, capacity, refill, ago).Slice()
	if err != nil {
		return State{}, fmt.Errorf("inspect %s: %w", key, scriptError(err))
	}
	if len(v) != 6 {
		return State{}, fmt.Errorf("token bucket inspect %s: unexpected reply of %d elements, want 6", key, len(v))
	}
	exists, _ := v[0].(int64)
	tok, _ := v[1].(string)
	reset, _ := v[2].(int64)
	ttl, _ := v[3].(int64)
	sc, _ := v[4].(string)
	sr, _ := v[5].(string)
	tokens, err := strconv.ParseFloat(tok, 64)
	if err != nil {
		return State{}, fmt.Errorf("token bucket inspect %s: tokens %q: %w", key, tok, err)
	}
	st := State{Exists: exists == 1, Tokens: tokens, ResetAfter: ms(reset), TTL: time.Duration(ttl), StoredCapacity: sc, StoredRefill: sr}
	if ttl >= 0 {
		st.TTL = ms(ttl)
	}
	return st, nil
}

// counterScript reads a counter and its TTL in one round trip: TokenBucket holds a
// redis.Scripter, which has no GET of its own.
var counterScript = redis.NewScript(`return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}`)

// Counter reads the calendar-quota counter key (Bucket.Counter) as the scripts store it,
// writing nothing: its used count, whether the key exists, and its time to live (-1 for a
// key without expiry, -2 for a missing one, as Redis's PTTL).
func (b *TokenBucket) Counter(ctx context.Context, key string) (used int64, exists bool, ttl time.Duration, err error) {
	v, err := counterScript.Run(ctx, b.rdb, []string{key}).Slice()
	if err != nil {
		return 0, false, 0, fmt.Errorf("read counter %s: %w", key, scriptError(err))
	}
	if len(v) != 2 {
		return 0, false, 0, fmt.Errorf("read counter %s: unexpected reply of %d elements, want 2", key, len(v))
	}
	pttl, _ := v[1].(int64)
	ttl = time.Duration(pttl)
	if pttl >= 0 {
		ttl = ms(pttl)
	}
	s, ok := v[0].(string)
	if !ok { // a missing key: GET's nil is false in Lua, and nil again in the reply
		return 0, false, ttl, nil
	}
	used, err = strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, true, ttl, fmt.Errorf("read counter %s: value %q: %w", key, s, err)
	}
	return used, true, ttl, nil
}
