package lua

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// Op is what a decision does to its buckets (decide.lua's op). Decisions carry at most 255 buckets.
type Op uint8

const (
	// OpTake takes N tokens from every bucket of the decision, or from none.
	OpTake Op = 1 + iota
	// OpLease takes up to N tokens, the same number from every bucket: as many as the
	// emptiest one holds whole.
	OpLease
	// OpReturn gives N unused tokens back to every bucket that exists, up to its capacity.
	OpReturn
	// OpCharge only charges the buckets' debts.
	OpCharge
	// OpSettle takes N more tokens (>= 0) from every bucket, whatever it holds: the
	// real cost of an admitted request, known after its response, above the estimate it
	// was decided on. No refusal and no floor at -capacity: a bucket goes as deep into
	// debt as N takes it, down to the deepest a key can hold (MaxDebtSeconds of refill
	// below full); Outcome.Granted is what it took from every bucket, N unless that
	// bound clipped it. A missing bucket is created (full, or at its cap, less N).
	OpSettle
)

// MaxDebtSeconds is how far below full, in seconds of refill, a settle may take a
// bucket (decide.lua MAX_DEBT_S: a key's TTL, capped at 2^40 ms, must not end before
// the bucket is full again): tokens >= Capacity - Refill*MaxDebtSeconds. The worst case
// is Refill = MaxRefill: about -1.1e21 tokens and a fill time of 34.8 years.
const MaxDebtSeconds = 1<<40/1000.0 - 2

// NoCap is Bucket.Cap when nothing but the capacity limits the bucket.
const NoCap = -1.0

// Bounds of a bucket's rule that the script accepts. Token counts are doubles in Lua:
// below 2^53 (about 9e15) every whole count is exact, so a capacity up to MaxCapacity,
// in debt down to -MaxCapacity, loses no token; MaxRefill bounds the refill per second
// so that a refill over any elapsed time stays a finite double. regions.MaxCapacity and
// regions.MaxRefillPerSecond are the same numbers (a test checks it).
const (
	MaxCapacity = 1_000_000_000_000_000
	MaxRefill   = 1_000_000_000_000
)

// MaxExpireMillis is the latest expiry of a counter, in unix milliseconds (2^53: exact
// in the script's doubles; about the year 287396).
const MaxExpireMillis = 1 << 53

// Bucket is one bucket of a decision and the rule it is decided under: a token bucket, or
// with Counter a calendar-quota counter.
//
// A counter is the usage of a calendar quota (an amount per hour, day, week or month) in
// one region for one period: the caller names one key per period, so the key changes at
// the period's end and nothing resets it. Its Capacity is the allowance (the most it may
// reach), Cap its floor (the least it holds: usage the control plane knows of, in case
// Redis lost the key), Debt fallback admissions added first, Expire when its key expires;
// Refill and CapAll do not apply. A take admits when used + N <= Capacity; a lease grants
// at most Capacity - used; a return lowers used by N (not below 0) if the key exists; a
// settle adds N with no bound.
type Bucket struct {
	// Key names the bucket (Keys).
	Key string
	// Capacity (1..MaxCapacity) and Refill per second (0 < Refill <= MaxRefill). For a
	// counter, Capacity is the allowance and Refill is ignored.
	Capacity int64
	Refill   float64
	// Debt is what a gateway's fallback admitted without Redis, charged before the
	// decision, never below -Capacity (nor raising a bucket a settle took deeper).
	Debt int64
	// Cap is NoCap, or the most the bucket may hold now (0..MaxCapacity) if it is
	// missing: within one fill time of a change that may have raised its limit, a
	// bucket that expired full under the old limit holds no more than the old limit plus
	// the new refill since then. With CapAll the cap holds a stored bucket too (a shard
	// other than shard 0, which may be one left over from an earlier layout). For a
	// counter, Cap is the floor: a whole number 0..MaxCapacity (NoCap and CapAll do not
	// apply).
	Cap    float64
	CapAll bool
	// ChangedAgo is how long ago the bucket's rule (Capacity, Refill) last changed, as
	// far as the caller knows (0: not known; more than 2^40 ms counts as 2^40 ms). A
	// stored bucket of another rule is converted at that instant: it holds the lower of
	// what its old rule refilled until now and what it held then plus the new refill
	// since, so a lowered refill holds from the change, not from the bucket's next call.
	// Ignored by a counter.
	ChangedAgo time.Duration
	// Counter makes the bucket a calendar-quota counter (the type's comment), and Expire
	// is when its key expires (after 1970, at most MaxExpireMillis): used only by counters.
	Counter bool
	Expire  time.Time
}

// Decision is one request's call: what to do to which buckets.
type Decision struct {
	Op Op
	// N is the cost of a take (1..every capacity), the most a lease may take (>= 1), the
	// tokens to return or settle (>= 0); ignored by a charge.
	N       int64
	Buckets []Bucket
}

// Outcome is what the script answered for one Decision.
type Outcome struct {
	// Granted is what was taken from every bucket: a take's N when it was admitted (0
	// when refused), a lease's grant, a settle's N (less what the depth bound clipped:
	// OpSettle); 0 for a return or a charge.
	Granted int64
	// RetryAfter is zero unless a take was refused or a lease granted nothing: then how
	// long until the bucket that refuses longest holds N tokens (for a lease: one),
	// rounded up to the millisecond and at most 2^40 ms.
	RetryAfter time.Duration
	// Buckets are the buckets' states after the call, in the order of Decision.Buckets.
	Buckets []BucketOutcome
}

// BucketOutcome is one bucket after a call.
type BucketOutcome struct {
	// Remaining is the whole tokens left (0 while in debt).
	Remaining int64
	// ResetAfter is how long until the bucket is full if nothing more is taken.
	ResetAfter time.Duration
	// Charged is how much of the Debt the script charged: the debt, less what the
	// -Capacity floor clipped (a counter: the whole debt).
	Charged int64
	// Used is a counter's used count after the call (0 for a token bucket). A counter's
	// Remaining is max(allowance - Used, 0) and its ResetAfter 0: the caller knows when
	// its period ends.
	Used int64
}

// ErrInvalidArgument is wrapped by every error about a decision's arguments, whether Go
// caught them before the call or the script refused them.
var ErrInvalidArgument = errors.New("invalid token bucket argument")

// invalidPrefix starts the error replies of the scripts for bad arguments.
const invalidPrefix = "QPINVALID"

// Check validates d as decide.lua does, so a caller can refuse a decision before it
// joins a batch that one bad decision would fail whole.
func (d Decision) Check() error {
	if len(d.Buckets) == 0 || len(d.Buckets) > 255 {
		return fmt.Errorf("%w: a decision needs 1 to 255 buckets, not %d", ErrInvalidArgument, len(d.Buckets))
	}
	switch d.Op {
	case OpTake, OpLease:
		if d.N < 1 || d.N > 2*MaxCapacity {
			return fmt.Errorf("%w: n %d must be between 1 and %d", ErrInvalidArgument, d.N, int64(2*MaxCapacity))
		}
	case OpReturn, OpCharge, OpSettle:
		if d.N < 0 || d.N > 2*MaxCapacity {
			return fmt.Errorf("%w: n %d must be between 0 and %d", ErrInvalidArgument, d.N, int64(2*MaxCapacity))
		}
	default:
		return fmt.Errorf("%w: op %d", ErrInvalidArgument, d.Op)
	}
	for _, b := range d.Buckets {
		if b.Counter {
			if err := d.checkCounter(b); err != nil {
				return fmt.Errorf("counter %s: %w", b.Key, err)
			}
			continue
		}
		if err := checkRule(b.Capacity, b.Refill); err != nil {
			return fmt.Errorf("bucket %s: %w", b.Key, err)
		}
		if d.Op == OpTake && d.N > b.Capacity {
			return fmt.Errorf("bucket %s: %w: cost %d must be between 1 and capacity %d", b.Key, ErrInvalidArgument, d.N, b.Capacity)
		}
		if b.Debt < 0 || b.Debt > 2*MaxCapacity {
			return fmt.Errorf("bucket %s: %w: debt %d must be between 0 and %d", b.Key, ErrInvalidArgument, b.Debt, int64(2*MaxCapacity))
		}
		if b.ChangedAgo < 0 {
			return fmt.Errorf("bucket %s: %w: changed %v ago, want a duration >= 0", b.Key, ErrInvalidArgument, b.ChangedAgo)
		}
		if !(b.Cap == NoCap && !b.CapAll || (b.Cap >= 0 && b.Cap <= MaxCapacity)) {
			return fmt.Errorf("bucket %s: %w: cap %v must be NoCap or between 0 and %d", b.Key, ErrInvalidArgument, b.Cap, int64(MaxCapacity))
		}
	}
	return nil
}

// checkCounter validates counter b of d as decide.lua does.
func (d Decision) checkCounter(b Bucket) error {
	if b.Capacity < 1 || b.Capacity > MaxCapacity {
		return fmt.Errorf("%w: allowance %d must be between 1 and %d", ErrInvalidArgument, b.Capacity, int64(MaxCapacity))
	}
	if d.Op == OpTake && d.N > b.Capacity {
		return fmt.Errorf("%w: cost %d must be between 1 and allowance %d", ErrInvalidArgument, d.N, b.Capacity)
	}
	if b.Debt < 0 || b.Debt > 2*MaxCapacity {
		return fmt.Errorf("%w: debt %d must be between 0 and %d", ErrInvalidArgument, b.Debt, int64(2*MaxCapacity))
	}
	if !(b.Cap >= 0 && b.Cap <= MaxCapacity && b.Cap == math.Trunc(b.Cap)) || b.CapAll {
		return fmt.Errorf("%w: floor %v must be a whole number between 0 and %d (no CapAll)", ErrInvalidArgument, b.Cap, int64(MaxCapacity))
	}
	if ms := b.Expire.UnixMilli(); ms < 1 || ms > MaxExpireMillis {
		return fmt.Errorf("%w: expiry %v must be after 1970 and at most %d ms after it", ErrInvalidArgument, b.Expire, int64(MaxExpireMillis))
	}
	return nil
}

func checkRule(capacity int64, refill float64) error {
	if capacity < 1 || capacity > MaxCapacity {
		return fmt.Errorf("%w: capacity %d must be between 1 and %d", ErrInvalidArgument, capacity, int64(MaxCapacity))
	}
	if !(refill > 0) || refill > MaxRefill {
		return fmt.Errorf("%w: refill per second %v must be a number > 0 and <= %g", ErrInvalidArgument, refill, float64(MaxRefill))
	}
	return nil
}

// maxAgoMillis is the longest Bucket.ChangedAgo the script takes, in ms (decide.lua's
// MAX_WAIT_MS).
const maxAgoMillis = 1 << 40

// Batch is the one encoder of decide.lua's arguments: decisions added in order become
// one script call, their numbers one little-endian binary argument (decimal arguments
// cost the script a strtod each, most of its time). Decisions must have passed Check. In
// a Redis Cluster every key of a batch must be in one hash slot. The zero value is an
// empty batch; Reset reuses one.
type Batch struct {
	keys    []string
	args    []byte
	nb      []int  // buckets per decision, for Read
	counter []bool // per key: a counter, whose reply says its used count (Read)
}

// Reset empties b, keeping its memory.
func (b *Batch) Reset() {
	clear(b.keys)
	b.keys, b.args, b.nb, b.counter = b.keys[:0], b.args[:0], b.nb[:0], b.counter[:0]
}

// Len is the number of decisions in b.
func (b *Batch) Len() int { return len(b.nb) }

// Keys is the number of buckets in b.
func (b *Batch) Keys() int { return len(b.keys) }

// Add appends d. Its buckets carry their ChangedAgo (8 bytes more each: decide.lua's op +
// 128) only when one of them changed within its fill time: after that a stored bucket of
// another rule converts to the same tokens at the change as at the call.
func (b *Batch) Add(d Decision) {
	withAgo := false
	for _, k := range d.Buckets {
		withAgo = withAgo || !k.Counter && k.ChangedAgo > 0 && k.ChangedAgo.Seconds()*k.Refill < float64(k.Capacity)
	}
	op := byte(d.Op)
	if withAgo {
		op += 128
	}
	b.args = append(b.args, op)
	b.args = binary.LittleEndian.AppendUint64(b.args, math.Float64bits(float64(d.N)))
	b.args = append(b.args, byte(len(d.Buckets)))
	for _, k := range d.Buckets {
		b.keys = append(b.keys, k.Key)
		b.counter = append(b.counter, k.Counter)
		r, c := k.Refill, k.Cap
		switch {
		case k.Counter:
			r = -float64(k.Expire.UnixMilli()) // r <= -1 marks a counter; c is its floor
		case c < 0:
			c = NoCap
		case k.CapAll:
			c = -2 - c
		}
		for _, v := range [4]float64{float64(k.Capacity), r, float64(k.Debt), c} {
			b.args = binary.LittleEndian.AppendUint64(b.args, math.Float64bits(v))
		}
		if withAgo {
			ago := min(float64(k.ChangedAgo)/float64(time.Millisecond), maxAgoMillis)
			if k.Counter || ago < 0 {
				ago = 0
			}
			b.args = binary.LittleEndian.AppendUint64(b.args, math.Float64bits(ago))
		}
	}
	b.nb = append(b.nb, len(d.Buckets))
}

// Args are the batch's keys and its one binary argument, for a tool that sends the call
// itself (a load generator): EVALSHA DecideSha() len(keys) keys... arg. Both are the
// batch's own: use them before the next Add or Reset.
func (b *Batch) Args() ([]string, []byte) { return b.keys, b.args }

// Cmd is the batch as one EVALSHA, built and not run: run it with a client's Process or
// queue it on a pipeline, then Read it.
func (b *Batch) Cmd(ctx context.Context) *redis.Cmd { return b.cmd(ctx, "evalsha", DecideSha()) }

// EvalCmd is the same call as EVAL with the whole script text: the retry of a Cmd that
// failed with NOSCRIPT (a restarted or flushed server, a new cluster node); running it
// also loads the script into that server's cache.
func (b *Batch) EvalCmd(ctx context.Context) *redis.Cmd { return b.cmd(ctx, "eval", DecideSource()) }

func (b *Batch) cmd(ctx context.Context, verb, script string) *redis.Cmd {
	out := make([]any, 0, 4+len(b.keys))
	out = append(out, verb, script, len(b.keys))
	for _, k := range b.keys {
		out = append(out, k)
	}
	// The command keeps the slice: a copy, so the batch can be reused at once.
	return redis.NewCmd(ctx, append(out, append([]byte(nil), b.args...))...)
}

// Read decodes the reply of a run Cmd or EvalCmd into one Outcome per decision, appended
// to out. A script refusal wraps ErrInvalidArgument.
func (b *Batch) Read(cmd *redis.Cmd, out []Outcome) ([]Outcome, error) {
	v, err := cmd.Slice()
	if err != nil {
		return out, scriptError(err)
	}
	want := 0
	for _, n := range b.nb {
		want += 2 + 3*n
	}
	if len(v) != want {
		return out, fmt.Errorf("bucket script: reply of %d integers, want %d", len(v), want)
	}
	num := func(i int) (int64, error) {
		n, ok := v[i].(int64)
		if !ok {
			return 0, fmt.Errorf("bucket script: reply element %d of type %T, want an integer", i, v[i])
		}
		return n, nil
	}
	i, key := 0, 0
	for _, n := range b.nb {
		var o Outcome
		var vals [2]int64
		for j := range vals {
			if vals[j], err = num(i + j); err != nil {
				return out, err
			}
		}
		o.Granted, o.RetryAfter = vals[0], ms(vals[1])
		i += 2
		o.Buckets = make([]BucketOutcome, n)
		for k := range o.Buckets {
			var bv [3]int64
			for j := range bv {
				if bv[j], err = num(i + j); err != nil {
					return out, err
				}
			}
			if b.counter[key] {
				o.Buckets[k] = BucketOutcome{Remaining: bv[0], Used: bv[1], Charged: bv[2]}
			} else {
				o.Buckets[k] = BucketOutcome{Remaining: bv[0], ResetAfter: ms(bv[1]), Charged: bv[2]}
			}
			i, key = i+3, key+1
		}
		out = append(out, o)
	}
	return out, nil
}

func ms(n int64) time.Duration {
	if n > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Millisecond
}

// scriptError wraps a failed script call; the scripts' argument errors become
// ErrInvalidArgument so a caller can never mistake them for a Redis outage.
func scriptError(err error) error {
	if redis.HasErrorPrefix(err, invalidPrefix) {
		return fmt.Errorf("bucket script: %w: %v", ErrInvalidArgument, err)
	}
	return fmt.Errorf("bucket script: %w", err)
}
