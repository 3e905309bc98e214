package lua

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// FuzzLuaArguments sends arbitrary decisions straight to decide.lua on a real Redis,
// past the Go-side checks, as any client of that Redis could. Whatever the numbers, the
// script either refuses them with a QPINVALID error and leaves the bucket exactly as it
// was, or answers integers in range and leaves a sane bucket: a 28-byte value whose
// tokens are a finite number in [-capacity, capacity] (for a settle, down to the depth
// bound, capacity - refill x MaxDebtSeconds), with a TTL. It accepts exactly what
// Decision.Check accepts. Trailing bytes (extra) are refused.
//
// And it conserves: the tokens it reports left are never more than the bucket held
// before (what the half-spent bucket refilled under the rule it was written under, or a
// full new one), clipped to the capacity and the cap, less what it charged and took,
// plus what it returned. A settle leaves it exactly that much lower: what it held less
// the debt charged and n (its reply says n, unless the bucket reached the depth bound),
// never more, never less. A script that reads a stored bucket under the new rule,
// ignores the cap of a missing or every bucket, or floors a settle at -capacity, fails on
// the seeds.
//
// A refill r <= -1 makes the bucket a counter (fuzzCounter), whose arithmetic is exact:
// the oracle there computes its reply and stored count.
func FuzzLuaArguments(f *testing.F) {
	for _, s := range []struct {
		op                 uint8
		n, c, r, debt, cap float64
	}{
		{1, 1, 10, 1, 0, -1}, {1, 1, 1e15, 1, 0, -1}, {1, 2, 16, 0.5, 0, -1}, {1, 1, math.NaN(), 1, 0, -1},
		{1, 1, 1, math.Inf(1), 0, -1}, {1, 6, 5, 1, 0, -1}, {1, 1, 2.5, 1, 0, -1}, {2, 100, 10, 1, 0, -1},
		{2, 0, 10, 1, 0, -1}, {3, 3, 10, 1, 0, -1}, {3, -1, 10, 1, 0, -1}, {1, 1, 10, 1, 10, -1},
		{1, 1, 10, 1, 11, 3}, {4, 0, 10, 1, 7, -1}, {2, 3, 10, 1, 0.5, -1}, {1, 1, 10, 1, 0, 1e300}, {9, 1, 10, 1, 0, -1},
		// Settles: past -capacity, with a debt, at the depth bound, a cap, bad numbers.
		{5, 50, 10, 1, 0, -1}, {5, 0, 10, 1, 3, -1}, {5, 30, 10, 1, 25, -1}, {5, 2e15, 1, 1e-9, 0, -1},
		{5, 2e15, 1e15, 1e12, 2e15, -1}, {5, 7, 10, 1, 0, 2}, {5, 7, 10, 1, 0, -5}, {5, -1, 10, 1, 0, -1},
		{5, 2e15 + 2, 10, 1, 0, -1}, {5, 1.5, 10, 1, 0, -1}, {6, 1, 10, 1, 0, -1},
	} {
		f.Add(s.op, s.n, s.c, s.r, s.debt, s.cap, true, []byte{})
	}
	// Caps on a missing bucket and on every bucket (-2 - cap), and returns.
	for _, s := range [][6]float64{{1, 1, 10, 1, 0, 3}, {1, 1, 10, 1, 0, -3}, {2, 10, 100, 5, 0, -4}, {3, 50, 100, 1, 0, -1}, {1, 1, 1e15, 1e12, 0, 7}} {
		for _, used := range []bool{true, false} {
			f.Add(uint8(s[0]), s[1], s[2], s[3], s[4], s[5], used, []byte{})
		}
	}
	// Counters (r = -expiry in unix ms), with a stored count of 4 (used) or none: takes to
	// and past the allowance, a floor that raises it, leases, returns, charges, settles,
	// an expiry in the past (the key written, then gone) and at 2^53 ms, and bad numbers.
	exp := -float64(time.Now().Add(time.Hour).UnixMilli())
	for _, s := range [][6]float64{
		{1, 1, 10, exp, 0, 0}, {1, 6, 10, exp, 0, 0}, {1, 7, 10, exp, 0, 0}, {1, 1, 10, exp, 0, 9}, {1, 2, 10, exp, 0, 9},
		{1, 1, 10, exp, 3, 2}, {2, 100, 10, exp, 2, 3}, {2, 1, 3, exp, 0, 5}, {3, 5, 10, exp, 0, 0}, {3, 0, 10, exp, 0, 6},
		{4, 0, 10, exp, 3, 0}, {4, 0, 10, exp, 0, 0}, {5, 50, 10, exp, 1, 0}, {5, 2e15, 1e15, exp, 2e15, 1e15},
		{1, 1, 10, -1, 0, 0}, {1, 1, 10, -(1 << 53), 0, 0}, {1, 1, 1e15, exp, 0, 1e15},
		{1, 1, 10, exp - 0.5, 0, 0}, {1, 1, 10, -(1 << 53) - 2, 0, 0}, {1, 1, 10, -0.5, 0, 0}, {1, 1, 10, exp, 0, -1},
		{1, 1, 10, exp, 0, 1.5}, {1, 1, 10, exp, 0, -5}, {1, 1, 0, exp, 0, 0}, {1, 1, 10, exp, 0.5, 0}, {1, 1, 10, math.Inf(-1), 0, 0},
	} {
		for _, used := range []bool{true, false} {
			f.Add(uint8(s[0]), s[1], s[2], s[3], s[4], s[5], used, []byte{})
		}
	}
	rp := testenv.Redis(f)
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	f.Cleanup(func() { _ = rdb.Close() })
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	const key = "fz:{t}:r"
	f.Fuzz(func(t *testing.T, op uint8, n, c, r, debt, cp float64, used bool, extra []byte) {
		if err := rdb.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		if r <= -1 {
			fuzzCounter(t, rdb, op, n, c, r, debt, cp, used, extra)
			return
		}
		// pre bounds what the bucket holds when the script reads it: a new bucket is
		// full; the half-spent one holds what it refilled at its own rule (1/s) since.
		pre := c
		if used { // a half-spent bucket of another rule first
			mustTake(t, b, key, 10, 1, 5)
		}
		start := time.Now()
		if used {
			pre = tokensNow(t, rdb, key)
		}
		preLow := min(pre, c) // the least it held when the script read it
		before, _ := rdb.Get(ctx, key).Result()
		arg := append(raw(op, n, [4]float64{c, r, debt, cp}), extra...)
		reply, err := rdb.Eval(ctx, DecideSource(), []string{key}, arg).Result()
		if used {
			pre = min(c, pre+time.Since(start).Seconds()+1e-6)
		}
		d, exact := goDecision(op, n, c, r, debt, cp)
		goOK := exact && d.Check() == nil && len(extra) == 0
		if err != nil {
			if !strings.HasPrefix(err.Error(), invalidPrefix) {
				t.Fatalf("%v: error %v, want QPINVALID or an answer", arg, err)
			}
			// A refused decision changes nothing. Extra bytes that read as a second
			// decision are refused after the first one stands (decide.lua: the
			// decisions before a refused one in a batch stand).
			firstOK := exact && d.Check() == nil
			if after, _ := rdb.Get(ctx, key).Result(); after != before && !firstOK {
				t.Fatalf("%v refused but changed the bucket", arg)
			}
			if goOK {
				t.Fatalf("%+v: the script refused what Go accepts: %v", d, err)
			}
			return
		}
		if !goOK {
			t.Fatalf("op %d n %v c %v r %v debt %v cap %v extra %d bytes: the script accepted what Go refuses", op, n, c, r, debt, cp, len(extra))
		}
		v, ok := reply.([]any)
		if !ok || len(v) != 5 {
			t.Fatalf("%+v: reply %v, want 5 integers", d, reply)
		}
		for i, e := range v {
			if x, ok := e.(int64); !ok || x < 0 || (i == 1 || i == 3) && x > 1<<40 {
				t.Fatalf("%+v: reply element %d = %v, want an integer in range", d, i, e)
			}
		}
		if cp >= 0 && !used {
			pre, preLow = min(pre, cp), min(preLow, cp)
		} else if cp <= -2 {
			pre, preLow = min(pre, -2-cp), min(preLow, -2-cp)
		}
		pre -= float64(v[4].(int64)) // the debt charged
		preLow -= float64(v[4].(int64))
		switch Op(op) {
		case OpTake:
			if v[0].(int64) == 1 {
				pre -= n
			}
		case OpLease:
			pre -= float64(v[0].(int64))
		case OpReturn:
			if used {
				pre = min(c, pre+n)
			}
		case OpSettle:
			g := float64(v[0].(int64))
			pre, preLow = pre-g, preLow-g
			if float64(v[4].(int64)) < debt {
				preLow = min(preLow, -c-g) // the debt stopped at exactly -c; charged is its whole part
			}
			deep := c - r*MaxDebtSeconds
			if n == 0 && debt == 0 {
				break // nothing to take: nothing written, as a refused take
			}
			if rdb.Exists(ctx, key).Val() == 0 {
				t.Fatalf("%+v: a settle of %v (debt %v) left no bucket", d, n, debt)
			}
			tok := tokensNow(t, rdb, key)
			tol := 1e-6 + 1e-12*math.Abs(preLow) + 1e-12*math.Abs(deep)
			// Exactly lower: refill since the call (at r) may only add to it.
			since := time.Since(start).Seconds() + 1e-3
			if tok < min(preLow, deep)-tol || tok > min(c, pre+r*since)+tol {
				t.Fatalf("%+v (bucket used before: %v): settled %v, %v tokens after, want %v less what it held, in [%v, %v]", d, used, g, tok, g, preLow, pre+r*since)
			}
			if g != n && !(tok <= deep+tol+r*since) {
				t.Fatalf("%+v: settled %v of %v with the bucket at %v tokens, above the depth bound %v", d, g, n, tok, deep)
			}
		}
		if left := float64(v[2].(int64)); left > math.Floor(max(pre, 0)+1e-6) {
			t.Fatalf("%+v (bucket used before: %v): %v tokens left, but it held at most %v after the decision", d, used, left, pre)
		}
		if s, err := rdb.Get(ctx, key).Result(); err == nil {
			st := readStored(t, rdb, key)
			tok := tokensNow(t, rdb, key)
			floor := -st.c
			if Op(op) == OpSettle {
				floor = min(st.c-st.r*MaxDebtSeconds, floor) - 1e-12*st.r*MaxDebtSeconds
			}
			if math.IsNaN(tok) || math.IsInf(tok, 0) || tok < floor-1e-6 || tok > st.c+1e-6 {
				t.Fatalf("%+v: bucket %+v holds %v tokens", d, st, tok)
			}
			if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 && s != before {
				t.Fatalf("%+v: a written bucket without a TTL (%v)", d, ttl)
			}
		}
	})
}

// fuzzCounter is FuzzLuaArguments for a counter (r <= -1): the script refuses exactly
// what Check refuses and then changes nothing; else its reply and the stored count are
// the oracle's, and the key is written, with PXAT -r, exactly when the count changed.
func fuzzCounter(t *testing.T, rdb *redis.Client, op uint8, n, c, r, debt, cp float64, used bool, extra []byte) {
	ctx := context.Background()
	const key = "fz:{t}:r"
	pre := 0.0
	if used { // a counter at 4, without expiry: a write gives it one
		pre = 4
		if err := rdb.Set(ctx, key, "4", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := rdb.Get(ctx, key).Result()
	arg := append(raw(op, n, [4]float64{c, r, debt, cp}), extra...)
	reply, err := rdb.Eval(ctx, DecideSource(), []string{key}, arg).Result()
	d, exact := goDecision(op, n, c, r, debt, cp)
	firstOK := exact && d.Check() == nil
	goOK := firstOK && len(extra) == 0
	if err != nil {
		if !strings.HasPrefix(err.Error(), invalidPrefix) {
			t.Fatalf("%v: error %v, want QPINVALID or an answer", arg, err)
		}
		after, _ := rdb.Get(ctx, key).Result()
		if after != before && !firstOK || !firstOK && used && rdb.PTTL(ctx, key).Val() != -1 {
			t.Fatalf("%v refused but changed the counter %q -> %q", arg, before, after)
		}
		if goOK {
			t.Fatalf("%+v: the script refused what Go accepts: %v", d, err)
		}
		return
	}
	if !goOK {
		t.Fatalf("op %d n %v c %v r %v debt %v floor %v extra %d bytes: the script accepted what Go refuses", op, n, c, r, debt, cp, len(extra))
	}
	v, ok := reply.([]any)
	if !ok || len(v) != 5 {
		t.Fatalf("%+v: reply %v, want 5 integers", d, reply)
	}
	got := make([]int64, 5)
	for i, e := range v {
		if got[i], ok = e.(int64); !ok {
			t.Fatalf("%+v: reply element %d = %v, want an integer", d, i, e)
		}
	}
	// The oracle: exact integers (all below 2^53 here but a settle's 2e15 + 2e15 + 1e15).
	u := max(pre, cp) + debt
	dirty := cp > pre || debt > 0
	var g float64
	switch Op(op) {
	case OpTake:
		if u+n <= c {
			g, u, dirty = 1, u+n, true
		}
	case OpLease:
		g = min(n, max(c-u, 0))
		u, dirty = u+g, dirty || g > 0
	case OpReturn:
		if used && n > 0 {
			u, dirty = max(u-n, 0), true
		}
	case OpSettle:
		g, u, dirty = n, u+n, dirty || n > 0
	}
	want := []int64{int64(g), 0, int64(max(c-u, 0)), int64(u), int64(debt)}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%+v (stored before: %q): reply %v, want %v (granted, retry, remaining, used, charged)", d, before, got, want)
		}
	}
	after, err := rdb.Get(ctx, key).Result()
	expire := time.UnixMilli(int64(-r))
	switch {
	case !dirty:
		if after != before || used && rdb.PTTL(ctx, key).Val() != -1 {
			t.Fatalf("%+v: nothing changed, but the counter was written: %q -> %q", d, before, after)
		}
	case time.Until(expire).Abs() < 10*time.Second:
		// Written, expiring about now: gone or not, either is right.
	case expire.Before(time.Now()):
		if !errors.Is(err, redis.Nil) {
			t.Fatalf("%+v: written with an expiry in the past (%v), but the key holds %q", d, expire, after)
		}
	default:
		at := rdb.PExpireTime(ctx, key).Val()
		if after != strconv.FormatInt(int64(u), 10) || at != time.Duration(-r)*time.Millisecond {
			t.Fatalf("%+v: stored %q expiring at %v ms, want %d at %v", d, after, at.Milliseconds(), int64(u), -r)
		}
		if enc := rdb.ObjectEncoding(ctx, key).Val(); enc != "int" {
			t.Fatalf("%+v: stored %q encoded %q, want int", d, after, enc)
		}
	}
}

// goDecision is the Decision the numbers mean, and whether Go can hold them exactly
// (integers where the script wants integers), so the script and Go must agree on them.
func goDecision(op uint8, n, c, r, debt, cp float64) (Decision, bool) {
	for _, v := range []float64{n, c, debt} {
		if v != math.Trunc(v) || math.Abs(v) > 1<<62 {
			return Decision{}, false
		}
	}
	b := Bucket{Key: "k", Capacity: int64(c), Refill: r, Debt: int64(debt), Cap: cp}
	switch {
	case r <= -1: // a counter: -r its expiry in ms, cp its floor
		if r != math.Trunc(r) || r < -(1<<62) {
			return Decision{}, false
		}
		b.Counter, b.Expire, b.Refill = true, time.UnixMilli(int64(-r)), 0
	case cp <= -2:
		b.Cap, b.CapAll = -2-cp, true
	}
	return Decision{Op: Op(op), N: int64(n), Buckets: []Bucket{b}}, true
}
