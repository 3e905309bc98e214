package lua

import (
	"context"
	"math"
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

// goDecision is the Decision the numbers mean, and whether Go can hold them exactly
// (integers where the script wants integers), so the script and Go must agree on them.
func goDecision(op uint8, n, c, r, debt, cp float64) (Decision, bool) {
	for _, v := range []float64{n, c, debt} {
		if v != math.Trunc(v) || math.Abs(v) > 1<<62 {
			return Decision{}, false
		}
	}
	b := Bucket{Key: "k", Capacity: int64(c), Refill: r, Debt: int64(debt), Cap: cp}
	if cp <= -2 {
		b.Cap, b.CapAll = -2-cp, true
	}
	return Decision{Op: Op(op), N: int64(n), Buckets: []Bucket{b}}, true
}
