package lua

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// FuzzLuaArguments sends arbitrary argument strings straight to the three bucket scripts
// on a real Redis, past the Go-side checks of this package, as any client of that Redis
// could. Whatever the arguments, a script either refuses them with a QPINVALID error and
// leaves the bucket and its rule record exactly as they were, or answers integers in
// range and leaves a sane bucket: tokens a finite number in [-capacity, capacity], and a
// TTL (a bucket with a rule record never lives forever). For canonical decimal
// arguments, the script accepts exactly what the Go checks accept.
func FuzzLuaArguments(f *testing.F) {
	for _, s := range [][5]string{
		{"take", "10", "1", "1", ""}, {"take", "1000000000000000", "1", "1", ""}, {"take", "0x10", "0.5", "2", ""},
		{"take", "nan", "1", "1", ""}, {"take", " 5 ", "1", "1", ""}, {"take", "1", "inf", "1", ""}, {"take", "5", "1", "6", ""},
		{"take", "2.5", "1", "1", ""}, {"lease", "10", "1", "100", ""}, {"lease", "10", "1", "0", ""},
		{"return", "10", "1", "3", ""}, {"return", "10", "1", "-1", ""}, {"return", "1e15", "1e300", "1e15", ""},
		{"take", "10", "1", "1", "10"}, {"take", "10", "1", "1", "11"}, {"take", "10", "1", "1", "-1"},
		{"lease", "10", "1", "3", "7"}, {"lease", "10", "1", "3", "0.5"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], true)
	}
	rp := testenv.Redis(f)
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	f.Cleanup(func() { _ = rdb.Close() })
	scripts := map[string]*redis.Script{
		"take":   redis.NewScript(TokenBucketSource()),
		"lease":  redis.NewScript(LeaseSource()),
		"return": redis.NewScript(ReturnSource()),
	}
	ctx := context.Background()
	const key, record = "fz:{t}:r", "fz:{t}:r:rule"
	keys := []string{key, record}
	f.Fuzz(func(t *testing.T, op, a1, a2, a3, debt string, used bool) {
		s, ok := scripts[op]
		if !ok {
			return
		}
		if err := rdb.Del(ctx, key, record).Err(); err != nil {
			t.Fatal(err)
		}
		if used { // a half-spent bucket of another rule first
			if err := scripts["take"].Run(ctx, rdb, keys, 10, 1, 5).Err(); err != nil {
				t.Fatal(err)
			}
		}
		before, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		beforeRecord, err := rdb.HGetAll(ctx, record).Result()
		if err != nil {
			t.Fatal(err)
		}
		args := []any{a1, a2, a3}
		if debt != "" {
			args = append(args, debt)
		}
		reply, err := s.Run(ctx, rdb, keys, args...).Result()
		accepted := err == nil
		if err != nil {
			if !strings.HasPrefix(err.Error(), "QPINVALID") {
				t.Fatalf("%s(%q, %q, %q, %q): error %v, want QPINVALID or an answer", op, a1, a2, a3, debt, err)
			}
			after, _ := rdb.HGetAll(ctx, key).Result()
			afterRecord, _ := rdb.HGetAll(ctx, record).Result()
			if !equalMaps(before, after) || !equalMaps(beforeRecord, afterRecord) {
				t.Fatalf("%s(%q, %q, %q, %q) refused but changed the bucket %v -> %v or its record %v -> %v", op, a1, a2, a3, debt, before, after, beforeRecord, afterRecord)
			}
		} else {
			checkReply(t, op, reply)
			checkBucketState(t, ctx, rdb, key, a1)
		}
		if want, known := goAccepts(op, a1, a2, a3, debt); known && want != accepted {
			t.Fatalf("%s(%q, %q, %q, %q): script accepted %v, the Go checks %v", op, a1, a2, a3, debt, accepted, want)
		}
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// checkReply: integers, as many as the script documents, none negative; allowed or
// granted consistent with retry_after.
func checkReply(t *testing.T, op string, reply any) {
	t.Helper()
	v, ok := reply.([]any)
	want := map[string]int{"take": 5, "lease": 5, "return": 2}[op]
	if !ok || len(v) != want {
		t.Fatalf("%s: reply %v, want %d integers", op, reply, want)
	}
	for i, e := range v {
		n, ok := e.(int64)
		if !ok || n < 0 {
			t.Fatalf("%s: reply element %d = %v (%T), want an integer >= 0 (reply %v)", op, i, e, e, v)
		}
	}
	if op == "take" && v[0].(int64) > 1 {
		t.Fatalf("take: allowed = %d", v[0])
	}
}

// checkBucketState: a bucket that exists has finite tokens in [-capacity, capacity] (below
// 0 only with a charged debt) and a TTL.
func checkBucketState(t *testing.T, ctx context.Context, rdb *redis.Client, key, capacity string) {
	t.Helper()
	h, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(h) == 0 {
		return
	}
	tokens, err := strconv.ParseFloat(h["tokens"], 64)
	if err != nil || math.IsNaN(tokens) || math.IsInf(tokens, 0) {
		t.Fatalf("bucket tokens %q after a call with capacity %q", h["tokens"], capacity)
	}
	if c, err := strconv.ParseFloat(strings.TrimSpace(capacity), 64); err == nil && c >= 1 && math.Abs(tokens) > math.Max(c, 10)+1e-6 {
		t.Fatalf("bucket holds %v tokens, capacity %q", tokens, capacity)
	}
	ttl, err := rdb.PTTL(ctx, key).Result()
	if err != nil || ttl <= 0 {
		t.Fatalf("bucket %v has TTL %v (%v): a key that never expires", h, ttl, err)
	}
}

// goAccepts is what package lua's and the limiter's Go checks accept, for arguments in
// the canonical form Go sends (integers in decimal, a float as strconv formats it; a debt
// of "" is no debt argument); known is false for any other form, which only a foreign
// client could send.
func goAccepts(op, a1, a2, a3, debt string) (ok, known bool) {
	capacity, err1 := strconv.ParseInt(a1, 10, 64)
	refill, err2 := strconv.ParseFloat(a2, 64)
	n, err3 := strconv.ParseInt(a3, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || strconv.FormatFloat(refill, 'f', -1, 64) != a2 {
		return false, false
	}
	if debt != "" && op != "return" { // return.lua reads no fourth argument
		d, err := strconv.ParseInt(debt, 10, 64)
		if err != nil {
			return false, false
		}
		if d < 0 || d > capacity {
			return false, true
		}
	}
	ok = capacity >= 1 && capacity <= MaxCapacity && refill > 0 && refill <= MaxRefill
	switch op {
	case "take":
		ok = ok && n >= 1 && n <= capacity
	case "lease":
		ok = ok && n >= 1
	case "return":
		ok = ok && n >= 0
	}
	return ok, true
}
