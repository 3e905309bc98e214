package lua

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// newRedis starts a fresh redis-server for one test and returns a client for it.
func newRedis(t testing.TB) *redis.Client {
	t.Helper()
	p := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// redisMicros is the server's TIME in microseconds.
func redisMicros(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMicro()
}

// setState writes a bucket's stored state directly, as if an earlier call had left it.
func setState(t testing.TB, rdb *redis.Client, ref Ref, tokens float64, tsMicros int64) {
	t.Helper()
	key := ref.Key
	err := rdb.HSet(context.Background(), key, "tokens", strconv.FormatFloat(tokens, 'f', -1, 64), "ts", strconv.FormatInt(tsMicros, 10)).Err()
	if err != nil {
		t.Fatalf("HSET %s: %v", key, err)
	}
}

// shiftTS moves a bucket's stored ts back by d: the same as d passing without a call.
func shiftTS(t testing.TB, rdb *redis.Client, ref Ref, d time.Duration) {
	t.Helper()
	key := ref.Key
	ts, err := rdb.HGet(context.Background(), key, "ts").Int64()
	if err != nil {
		t.Fatalf("HGET %s ts: %v", key, err)
	}
	if err := rdb.HSet(context.Background(), key, "ts", ts-d.Microseconds()).Err(); err != nil {
		t.Fatalf("HSET %s ts: %v", key, err)
	}
}

func storedTokens(t testing.TB, rdb *redis.Client, ref Ref) float64 {
	t.Helper()
	key := ref.Key
	v, err := rdb.HGet(context.Background(), key, "tokens").Float64()
	if err != nil {
		t.Fatalf("HGET %s tokens: %v", key, err)
	}
	return v
}

func mustTake(t testing.TB, b *TokenBucket, key Ref, capacity int64, refill float64, cost int64) Result {
	t.Helper()
	r, err := b.Take(context.Background(), key, capacity, refill, cost)
	if err != nil {
		t.Fatalf("Take(%s, %d, %v, %d): %v", key, capacity, refill, cost, err)
	}
	return r
}

func TestKeys(t *testing.T) {
	tests := []struct {
		keys        Keys
		bucket      Ref
		shard       Ref
		tenant, rte string
		i           int
	}{
		{Keys{}, Ref{"rl:{shop-a}:create-order", "rl:{shop-a}:create-order:rule"}, Ref{Key: "rl:shop-a:create-order:3"}, "shop-a", "create-order", 3},
		// Shard 0 is the unsharded bucket, so a shard count change carries it over.
		{Keys{Prefix: "test42"}, Ref{"test42:{t.1}:r_2", "test42:{t.1}:r_2:rule"}, Ref{"test42:{t.1}:r_2", "test42:{t.1}:r_2:rule"}, "t.1", "r_2", 0},
	}
	for _, tt := range tests {
		t.Run(tt.bucket.Key, func(t *testing.T) {
			if got := tt.keys.Bucket(tt.tenant, tt.rte); got != tt.bucket {
				t.Errorf("Bucket = %q, want %q", got, tt.bucket)
			}
			if got := tt.keys.Shard(tt.tenant, tt.rte, tt.i); got != tt.shard {
				t.Errorf("Shard = %q, want %q", got, tt.shard)
			}
		})
	}
	// A value's key has a bounded length whatever the value, and two values differ.
	long := strings.Repeat("x", 10000)
	a, b := Keys{}.Value("t", "r", long), Keys{}.Value("t", "r", long+"y")
	if a == b || len(a.Key) != len("rl:{t}:r:v:")+22 || a.Record != "rl:{t}:r:v" || !strings.HasPrefix(a.Key, a.Record+":") {
		t.Errorf("Value keys %q and %q: want distinct, 22 characters of hash, record rl:{t}:r:v", a, b)
	}
}

func TestTakeBurstThenReject(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	key := Keys{}.Bucket("shop-a", "create-order")
	for i := int64(1); i <= 5; i++ {
		r := mustTake(t, b, key, 5, 0.001, 1)
		if !r.Allowed || r.Remaining != 5-i || r.RetryAfter != 0 {
			t.Fatalf("call %d: %+v, want allowed with remaining %d", i, r, 5-i)
		}
	}
	r := mustTake(t, b, key, 5, 0.001, 1)
	if r.Allowed || r.Remaining != 0 {
		t.Fatalf("call 6: %+v, want rejected with remaining 0", r)
	}
	// One token at 0.001/s takes 1000 s; a few ms of real time may have passed.
	if r.RetryAfter > 1000*time.Second || r.RetryAfter < 999*time.Second {
		t.Errorf("RetryAfter = %v, want about 1000s", r.RetryAfter)
	}
	if r.ResetAfter > 5000*time.Second || r.ResetAfter < 4999*time.Second {
		t.Errorf("ResetAfter = %v, want about 5000s", r.ResetAfter)
	}
	// cost 2 of capacity 5 on a fresh key.
	r = mustTake(t, b, Keys{}.Bucket("shop-a", "create-order2"), 5, 1, 2)
	if !r.Allowed || r.Remaining != 3 || r.ResetAfter != 2*time.Second {
		t.Errorf("cost 2: %+v, want allowed, remaining 3, reset 2s", r)
	}
}

func TestTakeRefillAfterTimePasses(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	key := Keys{}.Bucket("shop-a", "create-order")
	for range 3 {
		mustTake(t, b, key, 3, 1, 1)
	}
	if r := mustTake(t, b, key, 3, 1, 1); r.Allowed {
		t.Fatalf("drained bucket allowed: %+v", r)
	}
	shiftTS(t, rdb, key, 2*time.Second) // two seconds at 1/s: two tokens
	r := mustTake(t, b, key, 3, 1, 1)
	if !r.Allowed || r.Remaining != 1 {
		t.Fatalf("after 2s: %+v, want allowed with remaining 1", r)
	}
	shiftTS(t, rdb, key, time.Hour) // far past full: capped at capacity
	r = mustTake(t, b, key, 3, 1, 1)
	if !r.Allowed || r.Remaining != 2 {
		t.Fatalf("after 1h: %+v, want allowed with remaining 2 (capacity 3 - 1)", r)
	}
	// The rule shrinks to capacity 1: the stored tokens are clipped.
	r = mustTake(t, b, key, 1, 1, 1)
	if !r.Allowed || r.Remaining != 0 {
		t.Fatalf("capacity shrunk to 1: %+v, want allowed with remaining 0", r)
	}
}

func TestRetryAfterExact(t *testing.T) {
	// A ts in the future freezes refill (TIME behind the stored ts refills nothing), so
	// these replies are exact to the millisecond whatever the test's own timing.
	tests := []struct {
		name                  string
		tokens                float64
		capacity              int64
		refill                float64
		cost                  int64
		allowed               bool
		remaining             int64
		retryAfter, resetAfer time.Duration
	}{
		{"one token at 1/s", 0, 5, 1, 1, false, 0, 1000 * time.Millisecond, 5000 * time.Millisecond},
		{"half a token at 0.3/s", 0.5, 10, 0.3, 1, false, 0, 1667 * time.Millisecond, 31667 * time.Millisecond},
		{"cost 3 with 2.25 at 4/s", 2.25, 8, 4, 3, false, 2, 188 * time.Millisecond, 1438 * time.Millisecond},
		{"allowed leaves 0.5", 2.5, 4, 2, 2, true, 0, 0, 1750 * time.Millisecond},
		{"fast refill 1000/s", 0, 100, 1000, 7, false, 0, 7 * time.Millisecond, 100 * time.Millisecond},
	}
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := Keys{}.Bucket("t"+strconv.Itoa(i), "r")
			setState(t, rdb, key, tt.tokens, redisMicros(t, rdb)+int64(time.Hour/time.Microsecond))
			r := mustTake(t, b, key, tt.capacity, tt.refill, tt.cost)
			want := Result{Allowed: tt.allowed, Remaining: tt.remaining, RetryAfter: tt.retryAfter, ResetAfter: tt.resetAfer}
			if r != want {
				t.Errorf("got %+v, want %+v", r, want)
			}
		})
	}
	t.Run("stored ts 250ms ago", func(t *testing.T) {
		key := Keys{}.Bucket("past", "r")
		setState(t, rdb, key, 0, redisMicros(t, rdb)-250_000)
		r := mustTake(t, b, key, 5, 1, 1)
		// 0.25 tokens plus what accrued between the two calls (well under 20 ms here).
		if r.Allowed || r.RetryAfter > 750*time.Millisecond || r.RetryAfter < 730*time.Millisecond {
			t.Errorf("got %+v, want rejected with RetryAfter in (730ms, 750ms]", r)
		}
	})
}

func TestTTLSetAndBounded(t *testing.T) {
	tests := []struct {
		capacity int64
		refill   float64
		cost     int64
		min, max time.Duration
	}{
		{10, 1, 1, 1900 * time.Millisecond, 2 * time.Second},     // 1 s to refill -> 2 s
		{10, 1000, 1, 900 * time.Millisecond, time.Second},       // 1 ms to refill -> the 1 s floor
		{100, 0.5, 100, 399 * time.Second, 400 * time.Second},    // empty: 200 s to fill -> 400 s
		{1000, 0.001, 1, 1999 * time.Second, 2000 * time.Second}, // 1000 s -> 2000 s
	}
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	for i, tt := range tests {
		t.Run(fmt.Sprintf("cap%d_refill%v", tt.capacity, tt.refill), func(t *testing.T) {
			key := Keys{}.Bucket("t"+strconv.Itoa(i), "r")
			mustTake(t, b, key, tt.capacity, tt.refill, tt.cost)
			ttl, err := rdb.PTTL(context.Background(), key.Key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl < tt.min || ttl > tt.max {
				t.Errorf("PTTL = %v, want within [%v, %v]", ttl, tt.min, tt.max)
			}
		})
	}
	t.Run("rejected call leaves TTL alone", func(t *testing.T) {
		key := Keys{}.Bucket("rejected", "r")
		setState(t, rdb, key, 0, redisMicros(t, rdb))
		mustTake(t, b, key, 10, 1, 1)
		if ttl := rdb.PTTL(context.Background(), key.Key).Val(); ttl != -1 {
			t.Errorf("PTTL = %v, want -1 (no write on reject)", ttl)
		}
	})
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
	var next, allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= calls {
				r, err := b.Take(context.Background(), key, capacity, refill, 1)
				if err != nil {
					errs <- err
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	bound := capacity + int64(math.Floor(refill*time.Since(start).Seconds()))
	if got := allowed.Load(); got < capacity || got > bound {
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
	if r := mustTake(t, b, key, 10, 1, 1); !r.Allowed || r.Remaining != 8 {
		t.Errorf("after SCRIPT FLUSH: %+v, want allowed with remaining 8", r)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if g, _, err := b.Lease(ctx, key, 10, 1, 2); err != nil || g != 2 {
		t.Errorf("lease after SCRIPT FLUSH: granted %d, err %v", g, err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Return(ctx, key, 10, 1, 1); err != nil {
		t.Errorf("return after SCRIPT FLUSH: %v", err)
	}
	if err := b.Load(ctx); err != nil {
		t.Errorf("Load: %v", err)
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
	// ones, between floor(0.3 i) and floor(0.3 (i + e)) tokens are due. On an idle box e
	// is a few ms and the two are equal; a loaded one may take a second over the loop.
	allowed, start := 0, time.Now()
	for i := 1; i <= 100; i++ {
		shiftTS(t, rdb, key, time.Second)
		r := mustTake(t, b, key, 10, 0.3, 1)
		if r.Allowed {
			allowed++
		}
		e := time.Since(start).Seconds()
		lo, hi := int(math.Floor(float64(i)*0.3+1e-9)), int(math.Floor((float64(i)+e)*0.3+1e-9))
		if allowed < lo || allowed > hi {
			t.Fatalf("after %d s (and %.3f s of real time): %d tokens taken, want %d..%d (last %+v)", i, e, allowed, lo, hi, r)
		}
	}
	// What is left is what the real time the test took refilled, less a token if that
	// made one whole: a small fraction.
	if left, e := storedTokens(t, rdb, key), time.Since(start).Seconds(); left < 0 || left > max(0.1, 0.3*e) {
		t.Errorf("stored tokens after 100 s (and %.3f s of real time) = %v, want within [0, %v]", e, left, max(0.1, 0.3*e))
	}
}

// TestExtremeRulesDoNotOverflow: valid rules whose waits exceed what Redis can return as
// an integer (past 2^63 it replies -2^63) get the waits capped at 2^40 ms (35 years),
// never negative, from all three scripts.
func TestExtremeRulesDoNotOverflow(t *testing.T) {
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
		{"one token, refill 1e-300", 1, 1e-300},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := Keys{}.Bucket("x"+strconv.Itoa(i), "r")
			r := mustTake(t, b, key, tt.capacity, tt.refill, tt.capacity) // drain it
			if !r.Allowed || r.ResetAfter != capped {
				t.Errorf("draining take: %+v, want allowed with ResetAfter capped at %v", r, capped)
			}
			// One token takes 1e12 ms at 1e-9/s (just under the cap), forever at 1e-300/s.
			r = mustTake(t, b, key, tt.capacity, tt.refill, 1)
			if r.Allowed || r.RetryAfter <= 0 || r.RetryAfter > capped || r.ResetAfter != capped {
				t.Errorf("take from the drained bucket: %+v, want rejected, RetryAfter within (0, %v], ResetAfter %v", r, capped, capped)
			}
			n, r, err := b.Lease(ctx, key, tt.capacity, tt.refill, 5)
			if err != nil || n != 0 || r.RetryAfter <= 0 || r.RetryAfter > capped || r.ResetAfter != capped {
				t.Errorf("lease from the drained bucket: %d, %+v, %v; want 0 granted, waits within (0, %v]", n, r, err, capped)
			}
			if err := b.Return(ctx, key, tt.capacity, tt.refill, 0); err != nil {
				t.Error(err)
			}
			cmd := returnScript.Run(ctx, rdb, []string{key.Key, key.Record}, tt.capacity, tt.refill, 1)
			if v, err := cmd.Int64Slice(); err != nil || len(v) != 2 || v[1] < 0 || v[1] > int64(1<<40) {
				t.Errorf("return reply %v, %v: want a reset within [0, 2^40] ms", v, err)
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
			name     string
			capacity int64
			refill   float64
			cost     int64
		}{
			{"capacity 0", 0, 1, 1},
			{"capacity negative", -5, 1, 1},
			{"capacity too large", MaxCapacity + 1, 1, 1},
			{"refill 0", 10, 0, 1},
			{"refill negative", 10, -1, 1},
			{"refill NaN", 10, math.NaN(), 1},
			{"refill Inf", 10, math.Inf(1), 1},
			{"cost 0", 10, 1, 0},
			{"cost negative", 10, 1, -1},
			{"cost above capacity", 10, 1, 11},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r, err := b.Take(ctx, key, tt.capacity, tt.refill, tt.cost)
				if !errors.Is(err, ErrInvalidArgument) || r.Allowed {
					t.Errorf("Take = %+v, %v; want ErrInvalidArgument", r, err)
				}
			})
		}
		if _, _, err := b.Lease(ctx, key, 10, 1, 0); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Lease want 0: %v, want ErrInvalidArgument", err)
		}
		if err := b.Return(ctx, key, 10, 1, -1); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Return n -1: %v, want ErrInvalidArgument", err)
		}
	})
	t.Run("script", func(t *testing.T) {
		// The scripts check their own arguments too: a caller that skips this package
		// (redis-cli, another client) still gets an error, never an allow.
		tests := []struct {
			name string
			args []any // capacity, refill, cost|want|n
		}{
			{"capacity not a number", []any{"abc", "1", "1"}},
			{"capacity 0", []any{"0", "1", "1"}},
			{"capacity -1", []any{"-1", "1", "1"}},
			{"capacity fractional", []any{"1.5", "1", "1"}},
			{"capacity nan", []any{"nan", "1", "1"}},
			{"capacity huge", []any{"1e300", "1", "1"}},
			{"refill not a number", []any{"10", "x", "1"}},
			{"refill 0", []any{"10", "0", "1"}},
			{"refill -0.5", []any{"10", "-0.5", "1"}},
			{"refill inf", []any{"10", "1e999", "1"}},
			{"third not a number", []any{"10", "1", ""}},
			{"third fractional", []any{"10", "1", "0.5"}},
			{"third negative", []any{"10", "1", "-2"}},
		}
		scripts := []struct {
			name string
			s    *redis.Script
			bad  []any // args only this script refuses
		}{
			{"take", takeScript, []any{"10", "1", "11"}},
			{"lease", leaseScript, []any{"10", "1", "0"}},
			{"return", returnScript, nil},
		}
		badDebt := [][]any{{"10", "1", "1", "-1"}, {"10", "1", "1", "11"}, {"10", "1", "1", "0.5"}, {"10", "1", "1", "x"}}
		for _, s := range scripts {
			cases := tests
			if s.name != "return" {
				for _, args := range badDebt {
					cases = append(cases[:len(cases):len(cases)], struct {
						name string
						args []any
					}{"debt " + fmt.Sprint(args[3]), args})
				}
			}
			if s.bad != nil {
				cases = append(cases[:len(cases):len(cases)], struct {
					name string
					args []any
				}{"third out of range", s.bad})
			}
			for _, tt := range cases {
				t.Run(s.name+"/"+tt.name, func(t *testing.T) {
					err := s.s.Run(ctx, rdb, []string{key.Key, key.Record}, tt.args...).Err()
					if err == nil || !strings.HasPrefix(err.Error(), invalidPrefix) {
						t.Fatalf("%s %v: err %v, want a %s error", s.name, tt.args, err, invalidPrefix)
					}
					if werr := scriptError(s.name, key.Key, err); !errors.Is(werr, ErrInvalidArgument) {
						t.Errorf("scriptError(%v) does not wrap ErrInvalidArgument", err)
					}
				})
			}
		}
	})
	if n := rdb.Exists(ctx, key.Key).Val(); n != 0 {
		t.Errorf("invalid calls wrote the bucket")
	}
}

func TestLeaseAndReturn(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("lease", "r")
	const capacity, refill = 10, 0.001

	lease := func(want, wantGranted, wantRemaining int64) Result {
		t.Helper()
		g, r, err := b.Lease(ctx, key, capacity, refill, want)
		if err != nil {
			t.Fatalf("Lease(%d): %v", want, err)
		}
		if g != wantGranted || r.Remaining != wantRemaining || r.Allowed != (g > 0) {
			t.Fatalf("Lease(%d) = %d, %+v; want granted %d, remaining %d", want, g, r, wantGranted, wantRemaining)
		}
		return r
	}
	lease(4, 4, 6)
	lease(20, 6, 0) // partial grant: only 6 left
	r := lease(1, 0, 0)
	if r.RetryAfter < 999*time.Second || r.RetryAfter > 1000*time.Second {
		t.Errorf("empty lease RetryAfter = %v, want about 1000s (one token at 0.001/s)", r.RetryAfter)
	}
	if err := b.Return(ctx, key, capacity, refill, 3); err != nil {
		t.Fatal(err)
	}
	lease(5, 3, 0) // exactly what was returned
	if err := b.Return(ctx, key, capacity, refill, 0); err != nil {
		t.Fatal(err)
	}
	// Returning more than fits fills the bucket and no further; the full bucket expires
	// soon (1 s), as any full one.
	if err := b.Return(ctx, key, capacity, refill, 1000); err != nil {
		t.Fatal(err)
	}
	if got, ttl := storedTokens(t, rdb, key), rdb.PTTL(ctx, key.Key).Val(); got != capacity || ttl <= 0 || ttl > time.Second {
		t.Errorf("after returning 1000: %v tokens, PTTL %v; want %d and at most 1 s", got, ttl, capacity)
	}
	lease(100, 10, 0)
	// A return to a missing (full) bucket creates nothing.
	other := Keys{}.Bucket("lease", "other")
	if err := b.Return(ctx, other, capacity, refill, 5); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, other.Key).Val(); n != 0 {
		t.Errorf("Return to a missing bucket created it")
	}
	// Return interleaved with Take never exceeds capacity.
	mustTake(t, b, other, capacity, refill, 2)
	if err := b.Return(ctx, other, capacity, refill, 1); err != nil {
		t.Fatal(err)
	}
	if got := storedTokens(t, rdb, other); got > capacity-1+0.01 || got < capacity-1 {
		t.Errorf("tokens after take 2, return 1 = %v, want about %d", got, capacity-1)
	}
	if err := b.Return(ctx, other, capacity, refill, 5); err != nil {
		t.Fatal(err)
	}
	if r := mustTake(t, b, other, capacity, refill, 1); r.Remaining != capacity-1 {
		t.Errorf("after over-return: %+v, want remaining %d", r, capacity-1)
	}
}

// TestDebt: the debt argument of take and lease charges tokens admitted without the
// bucket (a gateway's fallback) before deciding, and may leave the bucket below empty,
// never below -capacity; it then refuses until it has refilled past the debt, and a
// return does not wipe the debt out.
func TestDebt(t *testing.T) {
	rdb := newRedis(t)
	ctx := context.Background()
	key := Keys{}.Bucket("debt", "r")
	const capacity, refill = 10, 0.001 // slow: the test's own time adds thousandths of a token
	take := func(cost, debt int64) Result {
		t.Helper()
		r, err := TakeReply(takeScript.Run(ctx, rdb, []string{key.Key, key.Record}, capacity, refill, cost, debt))
		if err != nil {
			t.Fatalf("take cost %d debt %d: %v", cost, debt, err)
		}
		return r
	}
	if r := take(1, 4); !r.Allowed || r.Remaining != 5 {
		t.Errorf("full bucket, debt 4, take 1: %+v, want allowed with 5 remaining", r)
	}
	r := take(1, 10)
	if r.Allowed || r.Remaining != 0 {
		t.Errorf("5 tokens, debt 10, take 1: %+v, want refused with 0 remaining", r)
	}
	if got := storedTokens(t, rdb, key); got < -5 || got > -4.99 {
		t.Errorf("stored tokens %v after a refused take with debt, want -5 (the debt is written)", got)
	}
	// 6 tokens at 0.001/s, less what the test's own time refilled (a second of it is 1 s).
	if r.RetryAfter > 6000*time.Second || r.RetryAfter < 5990*time.Second {
		t.Errorf("RetryAfter in debt = %v, want about 6000s", r.RetryAfter)
	}
	take(1, 10)
	if got := storedTokens(t, rdb, key); got != -capacity {
		t.Errorf("stored tokens %v after more debt, want %d: at most one bucket of debt", got, -capacity)
	}
	if g, res, err := LeaseReply(leaseScript.Run(ctx, rdb, []string{key.Key, key.Record}, capacity, refill, 3)); err != nil || g != 0 || res.Remaining != 0 {
		t.Errorf("lease in debt: granted %d, %+v, %v; want nothing", g, res, err)
	}
	b := NewTokenBucket(rdb)
	if err := b.Return(ctx, key, capacity, refill, 4); err != nil {
		t.Fatal(err)
	}
	if got := storedTokens(t, rdb, key); got < -6 || got > -5.99 {
		t.Errorf("stored tokens %v after returning 4 in debt, want -6", got)
	}
	shiftTS(t, rdb, key, 7000*time.Second) // 7 tokens of refill
	if r := take(1, 0); !r.Allowed || r.Remaining != 0 {
		t.Errorf("after refilling past the debt: %+v, want allowed with 0 remaining", r)
	}

	other := Keys{}.Bucket("debt", "lease")
	g, res, err := LeaseReply(leaseScript.Run(ctx, rdb, []string{other.Key, other.Record}, capacity, refill, 5, 3))
	if err != nil || g != 5 || res.Remaining != 2 {
		t.Errorf("lease 5 with debt 3 on a full bucket: granted %d, %+v, %v; want 5 granted, 2 remaining", g, res, err)
	}
}

// TestBucketMemory measures what a bucket costs in Redis; the figures go to
// docs/BENCHMARKS.md ("Redis bucket memory"). Run with -v to see them.
func TestBucketMemory(t *testing.T) {
	const buckets = 100_000
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	keys := Keys{}
	// MEMORY USAGE of one bucket: a typical key, and the longest ids allowed (64 each).
	for _, k := range []struct{ tenant, route string }{
		{"tenant-000001", "create-order"},
		{strings.Repeat("t", 64), strings.Repeat("r", 64)},
	} {
		key := keys.Bucket(k.tenant, k.route)
		mustTake(t, b, key, 100, 0.01, 1)
		usage, err := rdb.MemoryUsage(ctx, key.Key).Result()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("MEMORY USAGE %s (%d-byte key) = %d bytes", key.Key, len(key.Key), usage)
		if usage <= 0 || usage > 300 {
			t.Errorf("MEMORY USAGE = %d bytes, want within (0, 300]", usage)
		}
		if err := rdb.Del(ctx, key.Key, key.Record).Err(); err != nil {
			t.Fatal(err)
		}
	}

	before := usedMemory(t, rdb)
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	const batch = 1000
	for i := 0; i < buckets; i += batch {
		pipe := rdb.Pipeline()
		for j := i; j < i+batch; j++ {
			takeScript.EvalSha(ctx, pipe, []string{keys.Bucket(fmt.Sprintf("tenant-%06d", j), "create-order").Key, keys.Bucket(fmt.Sprintf("tenant-%06d", j), "create-order").Record}, 100, 0.01, 1)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after := usedMemory(t, rdb)
	if n := rdb.DBSize(ctx).Val(); n != 2*buckets {
		t.Fatalf("DBSIZE = %d, want %d (a bucket and its rule record per tenant)", n, 2*buckets)
	}
	// Each tenant/route holds a bucket and its rule record (never expired, so a rule
	// raised after the bucket expired is not a full bucket at the new size).
	per := float64(after-before) / buckets
	t.Logf("used_memory delta over %d buckets = %d bytes, %.1f bytes per bucket with its record", buckets, after-before, per)
	if per <= 0 || per > 500 {
		t.Errorf("%.1f bytes per bucket with its record, want within (0, 500]", per)
	}
}

func usedMemory(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory")
	return 0
}

func BenchmarkTake(b *testing.B) {
	rdb := newRedis(b)
	tb := NewTokenBucket(rdb)
	ctx := context.Background()
	if err := tb.Load(ctx); err != nil {
		b.Fatal(err)
	}
	keys := make([]Ref, 1024)
	for i := range keys {
		keys[i] = Keys{}.Bucket(fmt.Sprintf("tenant-%04d", i), "create-order")
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, err := tb.Take(ctx, keys[i&1023], 1_000_000, 1000, 1); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
