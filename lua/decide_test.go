package lua

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestKeys(t *testing.T) {
	k := Keys{}
	for _, tt := range []struct{ got, want string }{
		{k.Bucket("shop-a", "create-order"), "rl:{shop-a}:create-order"},
		{k.Shard("shop-a", "create-order", 0), "rl:{shop-a}:create-order"},
		{k.Shard("shop-a", "create-order", 3), "rl:shop-a:create-order:3"},
		{Keys{Prefix: "t1"}.Bucket("a", "b"), "t1:{a}:b"},
		{k.Value("a", "b", "10.0.0.1"), "rl:{a}:b:v:" + k.Value("a", "b", "10.0.0.1")[len("rl:{a}:b:v:"):]},
	} {
		if tt.got != tt.want {
			t.Errorf("key %q, want %q", tt.got, tt.want)
		}
	}
	if v := k.Value("a", "b", "x"); len(v) != len("rl:{a}:b:v:")+22 {
		t.Errorf("value key %q: want 22 characters of hash", v)
	}
	if k.Value("a", "b", "x") == k.Value("a", "b", "y") || k.Value("a", "b", "x") == k.Value("a", "c", "x") {
		t.Error("distinct values or routes share a value key")
	}
}

func TestTakeBurstThenReject(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	key := Keys{}.Bucket("shop-a", "create-order")
	for i := int64(1); i <= 5; i++ {
		o := mustTake(t, b, key, 5, 0.001, 1)
		if o.Granted != 1 || o.Buckets[0].Remaining != 5-i || o.RetryAfter != 0 {
			t.Fatalf("call %d: %+v, want admitted with remaining %d", i, o, 5-i)
		}
	}
	o := mustTake(t, b, key, 5, 0.001, 1)
	if o.Granted != 0 || o.Buckets[0].Remaining != 0 {
		t.Fatalf("call 6: %+v, want refused with remaining 0", o)
	}
	// One token at 0.001/s takes 1000 s; a few ms of real time may have passed.
	if o.RetryAfter > 1000*time.Second || o.RetryAfter < 999*time.Second {
		t.Errorf("RetryAfter = %v, want about 1000s", o.RetryAfter)
	}
	if r := o.Buckets[0].ResetAfter; r > 5000*time.Second || r < 4999*time.Second {
		t.Errorf("ResetAfter = %v, want about 5000s", r)
	}
	o = mustTake(t, b, Keys{}.Bucket("shop-a", "create-order2"), 5, 1, 2)
	if o.Granted != 1 || o.Buckets[0].Remaining != 3 || o.Buckets[0].ResetAfter != 2*time.Second {
		t.Errorf("cost 2: %+v, want admitted, remaining 3, reset 2s", o)
	}
}

func TestRefillAfterTimePasses(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	key := Keys{}.Bucket("shop-a", "create-order")
	for range 3 {
		mustTake(t, b, key, 3, 1, 1)
	}
	if o := mustTake(t, b, key, 3, 1, 1); o.Granted != 0 {
		t.Fatalf("drained bucket admitted: %+v", o)
	}
	age(t, rdb, key, 2*time.Second) // two seconds at 1/s: two tokens
	if o := mustTake(t, b, key, 3, 1, 1); o.Granted != 1 || o.Buckets[0].Remaining != 1 {
		t.Fatalf("after 2s: %+v, want admitted with remaining 1", o)
	}
	age(t, rdb, key, time.Hour) // far past full: capped at capacity
	if o := mustTake(t, b, key, 3, 1, 1); o.Granted != 1 || o.Buckets[0].Remaining != 2 {
		t.Fatalf("after 1h: %+v, want admitted with remaining 2 (capacity 3 - 1)", o)
	}
}

func TestRetryAfterExact(t *testing.T) {
	// The bucket is set to hold tokens at Redis's now and decided at once; real time
	// between the two refills a little, so each wait may be shorter than the exact one by
	// what that time refilled (a few ms on an idle machine), never longer.
	tests := []struct {
		name                   string
		tokens                 float64
		capacity               int64
		refill                 float64
		cost                   int64
		admitted               bool
		remaining              int64
		retryAfter, resetAfter time.Duration
	}{
		{"one token at 1/s", 0, 5, 1, 1, false, 0, 1000 * time.Millisecond, 5000 * time.Millisecond},
		{"half a token at 0.3/s", 0.5, 10, 0.3, 1, false, 0, 1667 * time.Millisecond, 31667 * time.Millisecond},
		{"cost 3 with 2.25 at 4/s", 2.25, 8, 4, 3, false, 2, 188 * time.Millisecond, 1438 * time.Millisecond},
		{"admitted leaves 0.5", 2.5, 4, 2, 2, true, 0, 0, 1750 * time.Millisecond},
		{"slow refill 0.001/s", 0, 3, 0.001, 1, false, 0, 1000 * time.Second, 3000 * time.Second},
	}
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := Keys{}.Bucket("t"+strconv.Itoa(i), "r")
			start := time.Now()
			setTokens(t, rdb, key, tt.tokens, tt.capacity, tt.refill, 0)
			o := mustTake(t, b, key, tt.capacity, tt.refill, tt.cost)
			slack := time.Since(start) + time.Millisecond
			within := func(got, want time.Duration) bool { return got <= want && got >= want-slack }
			if (o.Granted == 1) != tt.admitted || o.Buckets[0].Remaining != tt.remaining ||
				!within(o.RetryAfter, tt.retryAfter) || !within(o.Buckets[0].ResetAfter, tt.resetAfter) {
				t.Errorf("got %+v, want admitted %v, remaining %d, retry %v, reset %v (each wait at most %v shorter)",
					o, tt.admitted, tt.remaining, tt.retryAfter, tt.resetAfter, slack)
			}
		})
	}
}

// TestExpiry: a bucket lives until a second after it is full, then is gone; a refused
// take writes nothing, so it does not extend the key's life.
func TestExpiry(t *testing.T) {
	tests := []struct {
		capacity int64
		refill   float64
		cost     int64
		min, max time.Duration
	}{
		{10, 1, 1, 1900 * time.Millisecond, 2002 * time.Millisecond},     // 1 s to refill, + 1 s
		{10, 1000, 1, 990 * time.Millisecond, 1003 * time.Millisecond},   // 1 ms, + 1 s
		{100, 0.5, 100, 200 * time.Second, 201002 * time.Millisecond},    // empty: 200 s to fill
		{1000, 0.001, 1, 1000 * time.Second, 1001002 * time.Millisecond}, // 1000 s
	}
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	for i, tt := range tests {
		t.Run(fmt.Sprintf("cap%d_refill%v", tt.capacity, tt.refill), func(t *testing.T) {
			key := Keys{}.Bucket("t"+strconv.Itoa(i), "r")
			mustTake(t, b, key, tt.capacity, tt.refill, tt.cost)
			ttl, err := rdb.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl < tt.min || ttl > tt.max {
				t.Errorf("PTTL = %v, want within [%v, %v]", ttl, tt.min, tt.max)
			}
		})
	}
	t.Run("refused take leaves the key alone", func(t *testing.T) {
		key := Keys{}.Bucket("refused", "r")
		setTokens(t, rdb, key, 0, 10, 1, 0)
		before := readStored(t, rdb, key)
		mustTake(t, b, key, 10, 1, 1)
		if ttl := rdb.PTTL(ctx, key).Val(); ttl != -1 {
			t.Errorf("PTTL = %v, want -1 (no write on a refusal)", ttl)
		}
		if after := readStored(t, rdb, key); after != before {
			t.Errorf("refused take rewrote the bucket: %+v -> %+v", before, after)
		}
	})
	t.Run("an expired bucket reads full", func(t *testing.T) {
		key := Keys{}.Bucket("expired", "r")
		mustTake(t, b, key, 2, 1000, 2)
		pollGone(t, rdb, key)
		if o := mustTake(t, b, key, 2, 1000, 2); o.Granted != 1 {
			t.Errorf("take of the whole capacity after expiry: %+v, want admitted", o)
		}
	})
}

// pollGone waits (at most 5 s, polling) for Redis to expire key.
func pollGone(t *testing.T, rdb *redis.Client, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for rdb.Exists(context.Background(), key).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not expire within 5 s (PTTL %v)", key, rdb.PTTL(context.Background(), key).Val())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestConcurrentCallsAdmitExactlyCapacity(t *testing.T) {
	const (
		calls    = 1000
		workers  = 64
		capacity = 100
		refill   = 0.001
	)
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	key := Keys{}.Bucket("hot", "r")
	var next, admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= calls {
				o, err := b.Take(context.Background(), key, capacity, refill, 1)
				if err != nil {
					errs <- err
					return
				}
				admitted.Add(o.Granted)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	bound := capacity + int64(math.Floor(refill*time.Since(start).Seconds()))
	if got := admitted.Load(); got < capacity || got > bound {
		t.Errorf("admitted %d of %d calls, want between %d and %d", got, calls, capacity, bound)
	}
}

func TestWorksAfterScriptFlush(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("t", "r")
	mustTake(t, b, key, 10, 1, 1)
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if o := mustTake(t, b, key, 10, 1, 1); o.Granted != 1 || o.Buckets[0].Remaining != 8 {
		t.Errorf("after SCRIPT FLUSH: %+v, want admitted with remaining 8", o)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Inspect(ctx, key, 10, 1, 0); err != nil {
		t.Errorf("inspect after SCRIPT FLUSH: %v", err)
	}
	if err := Load(ctx, rdb); err != nil {
		t.Errorf("Load: %v", err)
	}
	if n := rdb.ScriptExists(ctx, DecideSha()).Val(); len(n) != 1 || !n[0] {
		t.Errorf("after Load, SCRIPT EXISTS = %v", n)
	}
}

func TestFractionalRefillAccumulates(t *testing.T) {
	// 0.3 tokens a second, 100 simulated seconds one at a time: 30 tokens, all taken as
	// they become whole. Rounding must neither lose the 10th 0.3 nor invent a token.
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	key := Keys{}.Bucket("frac", "r")
	for range 10 {
		mustTake(t, b, key, 10, 0.3, 1)
	}
	// Real time passes too, and refills at 0.3/s: after i simulated seconds and e real
	// ones, between floor(0.3 i) and floor(0.3 (i + e)) tokens are due.
	admitted, start := int64(0), time.Now()
	for i := 1; i <= 100; i++ {
		age(t, rdb, key, time.Second)
		o := mustTake(t, b, key, 10, 0.3, 1)
		admitted += o.Granted
		e := time.Since(start).Seconds()
		lo, hi := int64(math.Floor(float64(i)*0.3+1e-9)), int64(math.Floor((float64(i)+e)*0.3+1e-9))
		if admitted < lo || admitted > hi {
			t.Fatalf("after %d s (and %.3f s of real time): %d tokens taken, want %d..%d (last %+v)", i, e, admitted, lo, hi, o)
		}
	}
	if left, e := tokensNow(t, rdb, key), time.Since(start).Seconds(); left < 0 || left > max(0.1, 0.3*e) {
		t.Errorf("tokens after 100 s (and %.3f s of real time) = %v, want within [0, %v]", e, left, max(0.1, 0.3*e))
	}
}

// TestExtremeRules: valid rules whose waits exceed what Redis can return as an integer
// (past 2^63 it replies -2^63) get the waits capped at 2^40 ms (35 years), never
// negative; a drained bucket of such a rule stays drained (its far-off full time is
// stored whole), and its key still expires.
func TestExtremeRules(t *testing.T) {
	const capped = time.Duration(1<<40) * time.Millisecond
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	tests := []struct {
		name     string
		capacity int64
		refill   float64
	}{
		{"largest capacity, slowest sane refill", MaxCapacity, 1e-9},
		{"one token, refill 1e-200", 1, 1e-200},
		{"largest capacity and refill", MaxCapacity, MaxRefill},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := Keys{}.Bucket("x"+strconv.Itoa(i), "r")
			o := mustTake(t, b, key, tt.capacity, tt.refill, tt.capacity) // drain it
			fill := time.Duration(math.Min(float64(tt.capacity)/tt.refill*1e9, float64(capped)))
			if o.Granted != 1 || o.Buckets[0].ResetAfter > capped || o.Buckets[0].ResetAfter < fill-time.Second {
				t.Errorf("draining take: %+v, want admitted with ResetAfter %v (capped at %v)", o, fill, capped)
			}
			if tt.refill >= 1 {
				return // refills at once
			}
			o = mustTake(t, b, key, tt.capacity, tt.refill, 1)
			if o.Granted != 0 || o.RetryAfter <= 0 || o.RetryAfter > capped {
				t.Errorf("take from the drained bucket: %+v, want refused, RetryAfter within (0, %v]", o, capped)
			}
			l := mustDecide(t, b, Decision{Op: OpLease, N: 5, Buckets: one(key, tt.capacity, tt.refill)})[0]
			if l.Granted != 0 || l.RetryAfter <= 0 || l.RetryAfter > capped {
				t.Errorf("lease from the drained bucket: %+v; want 0 granted, a wait within (0, %v]", l, capped)
			}
			if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > capped+2*time.Second {
				t.Errorf("PTTL %v, want within (0, %v]", ttl, capped+2*time.Second)
			}
		})
	}
}

func TestInvalidArguments(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("bad", "r")
	t.Run("go", func(t *testing.T) {
		tests := []struct {
			name string
			d    Decision
		}{
			{"no bucket", Decision{Op: OpTake, N: 1}},
			{"capacity 0", Decision{Op: OpTake, N: 1, Buckets: one(key, 0, 1)}},
			{"capacity negative", Decision{Op: OpTake, N: 1, Buckets: one(key, -5, 1)}},
			{"capacity too large", Decision{Op: OpTake, N: 1, Buckets: one(key, MaxCapacity+1, 1)}},
			{"refill 0", Decision{Op: OpTake, N: 1, Buckets: one(key, 10, 0)}},
			{"refill negative", Decision{Op: OpTake, N: 1, Buckets: one(key, 10, -1)}},
			{"refill NaN", Decision{Op: OpTake, N: 1, Buckets: one(key, 10, math.NaN())}},
			{"refill Inf", Decision{Op: OpTake, N: 1, Buckets: one(key, 10, math.Inf(1))}},
			{"cost 0", Decision{Op: OpTake, N: 0, Buckets: one(key, 10, 1)}},
			{"cost above capacity", Decision{Op: OpTake, N: 11, Buckets: one(key, 10, 1)}},
			{"lease 0", Decision{Op: OpLease, N: 0, Buckets: one(key, 10, 1)}},
			{"return negative", Decision{Op: OpReturn, N: -1, Buckets: one(key, 10, 1)}},
			{"op 9", Decision{Op: 9, N: 1, Buckets: one(key, 10, 1)}},
			{"debt negative", Decision{Op: OpTake, N: 1, Buckets: []Bucket{{Key: key, Capacity: 10, Refill: 1, Debt: -1, Cap: NoCap}}}},
			{"cap NaN", Decision{Op: OpTake, N: 1, Buckets: []Bucket{{Key: key, Capacity: 10, Refill: 1, Cap: math.NaN()}}}},
			{"changed in the future", Decision{Op: OpTake, N: 1, Buckets: []Bucket{{Key: key, Capacity: 10, Refill: 1, Cap: NoCap, ChangedAgo: -time.Second}}}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if _, err := b.Decide(ctx, tt.d); !errors.Is(err, ErrInvalidArgument) {
					t.Errorf("Decide = %v; want ErrInvalidArgument", err)
				}
			})
		}
	})
	t.Run("script", func(t *testing.T) {
		// Past the Go checks, as any other client of the Redis could call it: refused,
		// and nothing of the bad decision is written (decisions before it in a batch
		// stand: the other key here).
		mustTake(t, b, key, 10, 1, 3)
		before := readStored(t, rdb, key)
		good := raw(1, 1, [4]float64{10, 1, 0, -1})
		other := Keys{}.Bucket("bad", "other")
		tests := []struct {
			name string
			keys []string
			arg  []byte
		}{
			{"capacity 2.5", []string{key}, raw(1, 1, [4]float64{2.5, 1, 0, -1})},
			{"refill NaN", []string{key}, raw(1, 1, [4]float64{10, math.NaN(), 0, -1})},
			{"refill Inf", []string{key}, raw(1, 1, [4]float64{10, math.Inf(1), 0, -1})},
			{"cost above capacity", []string{key}, raw(1, 11, [4]float64{10, 1, 0, -1})},
			{"cost 0.5", []string{key}, raw(1, 0.5, [4]float64{10, 1, 0, -1})},
			{"debt fractional", []string{key}, raw(1, 1, [4]float64{10, 1, 0.5, -1})},
			{"cap -1.5", []string{key}, raw(1, 1, [4]float64{10, 1, 0, -1.5})},
			{"cap below -2-1e15", []string{key}, raw(1, 1, [4]float64{10, 1, 0, -3e15})},
			{"op 0", []string{key}, raw(0, 1, [4]float64{10, 1, 0, -1})},
			{"truncated", []string{key}, good[:len(good)-1]},
			{"a key too many", []string{other, key}, good},
			{"a good decision, then a bad one", []string{other, key}, append(append([]byte{}, good...), raw(1, 1, [4]float64{0, 1, 0, -1})...)},
			{"no buckets", []string{key}, raw(1, 1)},
			{"ago negative", []string{key}, withAgo(good, -1)},
			{"ago NaN", []string{key}, withAgo(good, math.NaN())},
			{"ago past 2^40 ms", []string{key}, withAgo(good, 1<<41)},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := rdb.EvalSha(ctx, DecideSha(), tt.keys, tt.arg).Err()
				if IsNoScript(err) {
					err = rdb.Eval(ctx, DecideSource(), tt.keys, tt.arg).Err()
				}
				if err == nil || !errors.Is(scriptError(err), ErrInvalidArgument) {
					t.Fatalf("err %v, want a QPINVALID refusal", err)
				}
				if after := readStored(t, rdb, key); after != before {
					t.Errorf("refused call changed the bucket: %+v -> %+v", before, after)
				}
			})
		}
	})
}

// withAgo is the one-bucket decision b with an ago of ms (op + 128, 8 bytes more).
func withAgo(b []byte, ms float64) []byte {
	out := append([]byte{b[0] + 128}, b[1:]...)
	return binary.LittleEndian.AppendUint64(out, math.Float64bits(ms))
}

// raw encodes one decision as decide.lua reads it, with any values at all.
func raw(op byte, n float64, buckets ...[4]float64) []byte {
	b := append([]byte{op}, binary.LittleEndian.AppendUint64(nil, math.Float64bits(n))...)
	b = append(b, byte(len(buckets)))
	for _, v := range buckets {
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		}
	}
	return b
}

func TestLeaseAndReturn(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	key := Keys{}.Bucket("t", "r")
	lease := func(want int64) Outcome {
		return mustDecide(t, b, Decision{Op: OpLease, N: want, Buckets: one(key, 10, 0.001)})[0]
	}
	for _, tt := range []struct{ want, granted, remaining int64 }{{4, 4, 6}, {100, 6, 0}, {1, 0, 0}} {
		o := lease(tt.want)
		if o.Granted != tt.granted || o.Buckets[0].Remaining != tt.remaining {
			t.Fatalf("lease(%d) = %+v; want granted %d, remaining %d", tt.want, o, tt.granted, tt.remaining)
		}
		if tt.granted == 0 && (o.RetryAfter < 999*time.Second || o.RetryAfter > 1000*time.Second) {
			t.Errorf("lease of an empty bucket: RetryAfter %v, want about 1000s (one token)", o.RetryAfter)
		}
	}
	give := func(n int64, k string) Outcome {
		return mustDecide(t, b, Decision{Op: OpReturn, N: n, Buckets: one(k, 10, 0.001)})[0]
	}
	if o := give(3, key); o.Buckets[0].Remaining != 3 {
		t.Errorf("return 3 to an empty bucket: %+v, want remaining 3", o)
	}
	if o := give(100, key); o.Buckets[0].Remaining != 10 {
		t.Errorf("return 100: %+v, want remaining capped at 10", o)
	}
	missing := Keys{}.Bucket("t", "missing")
	give(5, missing)
	if n := rdb.Exists(context.Background(), missing).Val(); n != 0 {
		t.Errorf("a return to a missing bucket created it")
	}
}

func TestDebt(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	take := func(key string, cost, debt int64) Outcome {
		return mustDecide(t, b, Decision{Op: OpTake, N: cost, Buckets: []Bucket{{Key: key, Capacity: 10, Refill: 0.001, Debt: debt, Cap: NoCap}}})[0]
	}
	k := Keys{}.Bucket("debt", "r")
	if o := take(k, 1, 4); o.Granted != 1 || o.Buckets[0].Charged != 4 || o.Buckets[0].Remaining != 5 {
		t.Errorf("debt 4 on a full bucket, then cost 1: %+v, want admitted, charged 4, remaining 5", o)
	}
	if o := take(k, 1, 12); o.Granted != 0 || o.Buckets[0].Charged != 12 || o.Buckets[0].Remaining != 0 {
		t.Errorf("debt 12 on 5: %+v, want refused, charged 12, remaining 0", o)
	}
	if got := tokensNow(t, rdb, k); got > -6.9 || got < -7.1 {
		t.Errorf("in debt: %v tokens, want -7", got)
	}
	if o := take(k, 1, 100); o.Buckets[0].Charged != 3 {
		t.Errorf("debt 100 at -7 of a 10-token bucket: %+v, want charged 3 (floored at -capacity)", o)
	}
	// A charge alone: nothing taken.
	k2 := Keys{}.Bucket("debt", "charge")
	o := mustDecide(t, b, Decision{Op: OpCharge, Buckets: []Bucket{{Key: k2, Capacity: 10, Refill: 0.001, Debt: 3, Cap: NoCap}}})[0]
	if o.Granted != 0 || o.Buckets[0].Charged != 3 || o.Buckets[0].Remaining != 7 {
		t.Errorf("charge 3: %+v, want charged 3, remaining 7", o)
	}
}

// TestSettle: a settle takes n from every bucket, past -capacity (a real cost known after
// the response is never clipped into a free pass), creates a missing bucket, and a debt
// charged after it never raises it back to -capacity.
func TestSettle(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	k, v := Keys{}.Bucket("settle", "r"), Keys{}.Value("settle", "r", "v")
	bs := []Bucket{{Key: k, Capacity: 10, Refill: 0.001, Cap: NoCap}, {Key: v, Capacity: 100, Refill: 0.001, Cap: NoCap}}
	if o := mustDecide(t, b, Decision{Op: OpTake, N: 1, Buckets: one(k, 10, 0.001)})[0]; o.Granted != 1 {
		t.Fatalf("take: %+v", o)
	}
	o := mustDecide(t, b, Decision{Op: OpSettle, N: 50, Buckets: bs})[0]
	if o.Granted != 50 || o.Buckets[0].Remaining != 0 || o.Buckets[1].Remaining != 50 {
		t.Errorf("settle 50: %+v, want 50 taken from both, remaining 0 and 50", o)
	}
	if got := tokensNow(t, rdb, k); got < -41.01 || got > -40.99 {
		t.Errorf("after the settle: %v tokens, want -41 (not clipped at -10)", got)
	}
	if got := tokensNow(t, rdb, v); got < 49.99 || got > 50.01 {
		t.Errorf("the missing value bucket after the settle: %v tokens, want 50", got)
	}
	// A debt on a bucket deeper than -capacity: nothing charged, not raised.
	o = mustDecide(t, b, Decision{Op: OpCharge, Buckets: []Bucket{{Key: k, Capacity: 10, Refill: 0.001, Debt: 5, Cap: NoCap}}})[0]
	if got := tokensNow(t, rdb, k); o.Buckets[0].Charged != 0 || got < -41.01 || got > -40.99 {
		t.Errorf("debt 5 at -41: %+v, %v tokens, want nothing charged and -41", o, got)
	}
	// A new refill (the capacity kept) keeps the debt past -capacity: refilled at 0.001/s
	// until now, then at the new rate.
	mustDecide(t, b, Decision{Op: OpCharge, Buckets: one(k, 10, 0.002)})
	if got := tokensNow(t, rdb, k); got < -41.01 || got > -40.99 {
		t.Errorf("after a refill change: %v tokens, want -41", got)
	}
	mustDecide(t, b, Decision{Op: OpCharge, Buckets: one(k, 10, 0.001)})
	// A take refused, and the retry says how deep the bucket is: 42 tokens at 0.001/s.
	o = mustDecide(t, b, Decision{Op: OpTake, N: 1, Buckets: one(k, 10, 0.001)})[0]
	if o.Granted != 0 || o.RetryAfter < 41990*time.Second || o.RetryAfter > 42000*time.Second {
		t.Errorf("take at -41: %+v, want refused for 42000 s", o)
	}
	// The depth bound: a bucket of 1 token per 1e9 s holds at most ~1.1 tokens of debt.
	d := Keys{}.Bucket("settle", "deep")
	o = mustDecide(t, b, Decision{Op: OpSettle, N: 1000, Buckets: one(d, 1, 1e-9)})[0]
	if o.Granted != 1 || o.Buckets[0].ResetAfter > time.Duration(MaxDebtSeconds*float64(time.Second)) {
		t.Errorf("settle 1000 at 1e-9/s: %+v, want 1 taken (clipped at the depth bound)", o)
	}
	if ttl := rdb.PTTL(context.Background(), d).Val(); ttl <= 0 || ttl > 1<<40*time.Millisecond {
		t.Errorf("a bucket at the depth bound has TTL %v", ttl)
	}
}
