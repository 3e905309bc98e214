package lua

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// counter is a calendar-quota counter of allowance c and floor, expiring in an hour.
func counter(key string, c int64, floor float64, debt int64) Bucket {
	return Bucket{Key: key, Capacity: c, Cap: floor, Debt: debt, Counter: true, Expire: time.Now().Add(time.Hour).Truncate(time.Millisecond)}
}

// usedOf is the counter's stored count (-1 if the key is missing).
func usedOf(t testing.TB, rdb *redis.Client, key string) int64 {
	t.Helper()
	s, err := rdb.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return -1
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("GET %s: %q is no integer: %v", key, s, err)
	}
	return n
}

// TestCounterTakeUpToAllowance: a counter admits exactly its allowance, then refuses
// without a retry (the gateway knows the period's end) and without a write.
func TestCounterTakeUpToAllowance(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("quota", "day:2026-12-01")
	cb := counter(key, 5, 0, 0)
	take := func(n int64) Outcome {
		return mustDecide(t, b, Decision{Op: OpTake, N: n, Buckets: []Bucket{cb}})[0]
	}
	for i := int64(1); i <= 2; i++ {
		if o := take(2); o.Granted != 1 || o.Buckets[0].Used != 2*i || o.Buckets[0].Remaining != 5-2*i || o.Buckets[0].ResetAfter != 0 {
			t.Fatalf("take %d of 2: %+v, want admitted, used %d, remaining %d", i, o, 2*i, 5-2*i)
		}
	}
	if o := take(2); o.Granted != 0 || o.RetryAfter != 0 || o.Buckets[0].Used != 4 || o.Buckets[0].Remaining != 1 {
		t.Fatalf("take 2 at 4 of 5: %+v, want refused, no retry, used 4, remaining 1", o)
	}
	if o := take(1); o.Granted != 1 || o.Buckets[0].Used != 5 || o.Buckets[0].Remaining != 0 {
		t.Fatalf("take 1 at 4 of 5: %+v, want admitted up to the allowance exactly", o)
	}
	if err := rdb.Persist(ctx, key).Err(); err != nil { // a write would set its expiry again
		t.Fatal(err)
	}
	before := commandCalls(t, rdb)
	if o := take(1); o.Granted != 0 || o.RetryAfter != 0 || o.Buckets[0].Remaining != 0 || o.Buckets[0].Used != 5 {
		t.Fatalf("take 1 at 5 of 5: %+v, want refused", o)
	}
	after := commandCalls(t, rdb)
	for cmd, want := range map[string]int64{"time": 1, "get": 1, "set": 0} {
		if got := after[cmd] - before[cmd]; got != want {
			t.Errorf("a refused take of a counter called %s %d times, want %d", cmd, got, want)
		}
	}
	before = commandCalls(t, rdb)
	mustDecide(t, b, Decision{Op: OpReturn, N: 1, Buckets: []Bucket{cb}})
	after = commandCalls(t, rdb)
	if got := after["set"] - before["set"]; got != 1 {
		t.Errorf("a return to a counter called SET %d times, want 1", got)
	}
	mustDecide(t, b, Decision{Op: OpTake, N: 1, Buckets: []Bucket{cb}})
	if err := rdb.Persist(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if got, ttl := usedOf(t, rdb, key), rdb.PTTL(ctx, key).Val(); got != 5 || ttl != -1 {
		t.Errorf("after a refused take: used %d, PTTL %v, want 5 and -1 (untouched)", got, ttl)
	}
	if enc := rdb.ObjectEncoding(ctx, key).Val(); enc != "int" {
		t.Errorf("encoding %q, want int", enc)
	}
	used, exists, ttl, err := b.Counter(ctx, key)
	if err != nil || used != 5 || !exists || ttl != -1 {
		t.Errorf("Counter = %d, %v, %v, %v; want 5, true, -1", used, exists, ttl, err)
	}
	if used, exists, ttl, err := b.Counter(ctx, key+":missing"); err != nil || used != 0 || exists || ttl != -2 {
		t.Errorf("Counter of a missing key = %d, %v, %v, %v; want 0, false, -2", used, exists, ttl, err)
	}
	// A missing counter refused with floor 0 writes nothing either.
	missing := counter(Keys{}.Bucket("quota", "day:missing"), 3, 0, 0)
	o := mustDecide(t, b, Decision{Op: OpLease, N: 1, Buckets: []Bucket{missing, counter(key, 5, 0, 0)}})[0]
	if o.Granted != 0 || o.RetryAfter != 0 || rdb.Exists(ctx, missing.Key).Val() != 0 {
		t.Errorf("a lease refused by a full counter: %+v, want nothing granted, no retry, no key written", o)
	}
}

// TestCounterExpiry: a written counter expires at the absolute time it was given (PXAT).
func TestCounterExpiry(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("quota", "hour")
	cb := counter(key, 10, 0, 0)
	cb.Expire = time.Now().Add(90 * time.Minute)
	mustDecide(t, b, Decision{Op: OpTake, N: 1, Buckets: []Bucket{cb}})
	at, err := rdb.PExpireTime(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Duration(cb.Expire.UnixMilli()) * time.Millisecond; at != want {
		t.Errorf("PEXPIRETIME %v, want %v (the given expiry, to the ms)", at, want)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl > 90*time.Minute || ttl < 89*time.Minute {
		t.Errorf("PTTL %v, want about 90 minutes", ttl)
	}
}

// TestCounterFloorDebtReturnSettle: the floor raises a missing or low counter (and is
// written), a debt is added whole, a return lowers it only if it exists, a settle adds
// with no bound.
func TestCounterFloorDebtReturnSettle(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("quota", "month")
	do := func(op Op, n int64, cb Bucket) BucketOutcome {
		t.Helper()
		return mustDecide(t, b, Decision{Op: op, N: n, Buckets: []Bucket{cb}})[0].Buckets[0]
	}
	// A missing counter, refused, but its floor known: the floor is stored.
	if o := do(OpTake, 5, counter(key, 10, 7, 0)); o.Used != 7 || o.Remaining != 3 || usedOf(t, rdb, key) != 7 {
		t.Fatalf("take 5 of 10 from a missing counter at floor 7: %+v (stored %d), want refused at 7 and 7 stored", o, usedOf(t, rdb, key))
	}
	// A lower floor changes nothing; a higher one raises it.
	if o := do(OpTake, 1, counter(key, 10, 2, 0)); o.Used != 8 {
		t.Errorf("take 1 at 7, floor 2: %+v, want used 8", o)
	}
	if o := do(OpCharge, 0, counter(key, 10, 9, 0)); o.Used != 9 || usedOf(t, rdb, key) != 9 {
		t.Errorf("charge nothing at 8, floor 9: %+v, want 9 stored", o)
	}
	// A debt: added whole, past the allowance.
	if o := do(OpCharge, 0, counter(key, 10, 0, 4)); o.Used != 13 || o.Charged != 4 || o.Remaining != 0 {
		t.Errorf("debt 4 at 9 of 10: %+v, want used 13, charged 4, remaining 0", o)
	}
	// A return: lowered, not below 0.
	if o := do(OpReturn, 6, counter(key, 10, 0, 0)); o.Used != 7 || o.Remaining != 3 {
		t.Errorf("return 6 at 13: %+v, want used 7", o)
	}
	if o := do(OpReturn, 100, counter(key, 10, 0, 0)); o.Used != 0 || o.Remaining != 10 || usedOf(t, rdb, key) != 0 {
		t.Errorf("return 100 at 7: %+v, want used 0", o)
	}
	gone := Keys{}.Bucket("quota", "gone")
	do(OpReturn, 3, counter(gone, 10, 0, 0))
	if rdb.Exists(ctx, gone).Val() != 0 {
		t.Errorf("a return to a missing counter created it")
	}
	// A settle: no bound.
	o := mustDecide(t, b, Decision{Op: OpSettle, N: 25, Buckets: []Bucket{counter(key, 10, 0, 0)}})[0]
	if o.Granted != 25 || o.Buckets[0].Used != 25 || o.Buckets[0].Remaining != 0 || usedOf(t, rdb, key) != 25 {
		t.Errorf("settle 25 at 0 of 10: %+v, want all 25 taken, used 25", o)
	}
	// A lease grants what the allowance leaves.
	lk := Keys{}.Bucket("quota", "lease")
	if o := mustDecide(t, b, Decision{Op: OpLease, N: 100, Buckets: []Bucket{counter(lk, 10, 6, 0)}})[0]; o.Granted != 4 || o.Buckets[0].Used != 10 {
		t.Errorf("lease 100 at floor 6 of 10: %+v, want 4 granted, used 10", o)
	}
}

// TestCounterWithBucketAllOrNothing: a token bucket and a counter in one decision admit
// together or not at all, and each refusal leaves the other untouched.
func TestCounterWithBucketAllOrNothing(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	bk, ck := Keys{}.Bucket("mix", "r"), Keys{}.Bucket("mix", "day")
	d := func(cb Bucket) Decision {
		return Decision{Op: OpTake, N: 2, Buckets: []Bucket{{Key: bk, Capacity: 5, Refill: 0.001, Cap: NoCap}, cb}}
	}
	// The counter refuses: the bucket keeps its tokens, and no retry (only a counter refused).
	mustDecide(t, b, Decision{Op: OpTake, N: 1, Buckets: one(bk, 5, 0.001)})
	before := readStored(t, rdb, bk)
	o := mustDecide(t, b, d(counter(ck, 10, 9, 0)))[0]
	if o.Granted != 0 || o.RetryAfter != 0 || o.Buckets[0].Remaining != 4 || o.Buckets[1].Used != 9 {
		t.Fatalf("counter at 9 of 10, take 2: %+v, want refused, no retry, bucket 4 left", o)
	}
	if after := readStored(t, rdb, bk); after != before {
		t.Errorf("a counter's refusal changed the bucket: %+v -> %+v", before, after)
	}
	// Both admit: both change.
	o = mustDecide(t, b, d(counter(ck, 20, 0, 0)))[0]
	if o.Granted != 1 || o.Buckets[0].Remaining != 2 || o.Buckets[1].Used != 11 || usedOf(t, rdb, ck) != 11 {
		t.Fatalf("take 2: %+v, want admitted, bucket 2 left, counter 11", o)
	}
	// The bucket refuses: the counter is untouched, and the retry is the bucket's.
	if err := rdb.Persist(ctx, ck).Err(); err != nil {
		t.Fatal(err)
	}
	mustDecide(t, b, Decision{Op: OpTake, N: 2, Buckets: one(bk, 5, 0.001)})
	o = mustDecide(t, b, d(counter(ck, 20, 0, 0)))[0]
	if o.Granted != 0 || o.RetryAfter < 1999*time.Second || o.RetryAfter > 2000*time.Second || o.Buckets[1].Used != 11 || o.Buckets[1].Remaining != 9 {
		t.Fatalf("empty bucket, counter 11 of 20: %+v, want refused for about 2000 s, counter 11", o)
	}
	if got, ttl := usedOf(t, rdb, ck), rdb.PTTL(ctx, ck).Val(); got != 11 || ttl != -1 {
		t.Errorf("a bucket's refusal changed the counter: used %d, PTTL %v, want 11 and -1", got, ttl)
	}
}

func TestCounterInvalidArguments(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("badq", "day")
	good := counter(key, 10, 0, 0)
	with := func(f func(*Bucket)) Bucket { c := good; f(&c); return c }
	t.Run("go", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			d    Decision
		}{
			{"allowance 0", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Capacity = 0 })}}},
			{"allowance too large", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Capacity = MaxCapacity + 1 })}}},
			{"take above allowance", Decision{Op: OpTake, N: 11, Buckets: []Bucket{good}}},
			{"floor negative", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Cap = NoCap })}}},
			{"floor fractional", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Cap = 1.5 })}}},
			{"floor NaN", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Cap = math.NaN() })}}},
			{"floor too large", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Cap = MaxCapacity + 1 })}}},
			{"CapAll", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.CapAll = true })}}},
			{"debt negative", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Debt = -1 })}}},
			{"no expiry", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Expire = time.Time{} })}}},
			{"expiry 1970", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Expire = time.UnixMilli(0) })}}},
			{"expiry past 2^53 ms", Decision{Op: OpTake, N: 1, Buckets: []Bucket{with(func(c *Bucket) { c.Expire = time.UnixMilli(MaxExpireMillis + 1) })}}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				if _, err := b.Decide(ctx, tt.d); !errors.Is(err, ErrInvalidArgument) {
					t.Errorf("Decide = %v; want ErrInvalidArgument", err)
				}
			})
		}
		// The bounds themselves are valid.
		edge := with(func(c *Bucket) {
			c.Capacity, c.Cap, c.Expire = MaxCapacity, MaxCapacity, time.UnixMilli(MaxExpireMillis)
		})
		if err := (Decision{Op: OpTake, N: 1, Buckets: []Bucket{edge}}).Check(); err != nil {
			t.Errorf("Check of a counter at every bound: %v", err)
		}
	})
	t.Run("script", func(t *testing.T) {
		// Past the Go checks: refused whole, and nothing written, not the token bucket
		// before it in the decision nor the counter.
		bk := Keys{}.Bucket("badq", "r")
		mustDecide(t, b, Decision{Op: OpTake, N: 3, Buckets: []Bucket{{Key: bk, Capacity: 10, Refill: 1, Cap: NoCap}, good}})
		if err := rdb.Persist(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		beforeB, beforeC := readStored(t, rdb, bk), usedOf(t, rdb, key)
		exp := -float64(time.Now().Add(time.Hour).UnixMilli())
		tb := [4]float64{10, 1, 0, -1}
		for _, tt := range []struct {
			name string
			c    [4]float64
		}{
			{"expiry fractional", [4]float64{10, exp - 0.5, 0, 0}},
			{"expiry past 2^53", [4]float64{10, -(1 << 53) - 2, 0, 0}},
			{"expiry -inf", [4]float64{10, math.Inf(-1), 0, 0}},
			{"r between -1 and 0", [4]float64{10, -0.5, 0, 0}},
			{"floor -1", [4]float64{10, exp, 0, -1}},
			{"floor -2 - cap", [4]float64{10, exp, 0, -5}},
			{"floor fractional", [4]float64{10, exp, 0, 2.5}},
			{"floor NaN", [4]float64{10, exp, 0, math.NaN()}},
			{"floor too large", [4]float64{10, exp, 0, 2e15}},
			{"allowance 0", [4]float64{0, exp, 0, 0}},
			{"allowance fractional", [4]float64{2.5, exp, 0, 0}},
			{"take above allowance", [4]float64{1, exp, 0, 0}},
			{"debt fractional", [4]float64{10, exp, 0.5, 0}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				arg := raw(1, 2, tb, tt.c)
				err := rdb.Eval(ctx, DecideSource(), []string{bk, key}, arg).Err()
				if err == nil || !errors.Is(scriptError(err), ErrInvalidArgument) {
					t.Fatalf("err %v, want a QPINVALID refusal", err)
				}
				if after := readStored(t, rdb, bk); after != beforeB {
					t.Errorf("refused call changed the bucket: %+v -> %+v", beforeB, after)
				}
				if after, ttl := usedOf(t, rdb, key), rdb.PTTL(ctx, key).Val(); after != beforeC || ttl != -1 {
					t.Errorf("refused call changed the counter: %d -> %d (PTTL %v)", beforeC, after, ttl)
				}
			})
		}
	})
}
