package lua

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// FuzzConvertAtTheChange writes a bucket of one rule (c0, r0) holding tokens, leaves it
// idle, and leases it whole under another rule (c, r) that changed ago before the call.
// Whatever the numbers, the conversion never holds more than the old rule refilled until
// now (clipped to the new capacity), nor takes the bucket below empty that the old rule
// did not (nor a debt deeper). When the change came after the write and the bucket was
// not below empty then, it holds exactly what it held at the change plus the new refill
// since; else what the old rule holds now.
func FuzzConvertAtTheChange(f *testing.F) {
	for _, s := range [][7]float64{
		{0, 1000, 1000, 1000, 10, 1200, 1200}, {500, 1000, 100, 1000, 1, 1000, 300}, {0, 1000, 1000, 1000, 10, 0, 5000},
		{300, 1000, 1000, 1000, 10, 0, 5000}, {100, 1000, 1, 1000, 1000, 0, 10000}, {0, 75, 7.5, 25, 2.5, 2000, 1000},
		{-400, 1000, 1000, 1000, 10, 0, 1000}, {5, 10, 1, 3, 0.001, 100, 50}, {1, 1, 1e-6, 1e6, 1e6, 1e9, 1 << 40},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6])
	}
	rp := testenv.Redis(f)
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	f.Cleanup(func() { _ = rdb.Close() })
	b := NewTokenBucket(rdb)
	const key = "fz:{t}:convert"
	f.Fuzz(func(t *testing.T, tokens, c0, r0, c, r, idleMs, agoMs float64) {
		if !(c0 >= 1 && c0 <= 1e6 && c0 == math.Trunc(c0) && c >= 1 && c <= 1e6 && c == math.Trunc(c) &&
			r0 >= 1e-6 && r0 <= 1e6 && r >= 1e-6 && r <= 1e6 && tokens >= -c0 && tokens <= c0 &&
			idleMs >= 0 && idleMs <= 1e10 && agoMs >= 0 && agoMs <= 1<<40) {
			return
		}
		start := time.Now()
		setTokens(t, rdb, key, tokens, int64(c0), r0, 0)
		age(t, rdb, key, time.Duration(idleMs*float64(time.Millisecond)))
		ago := time.Duration(agoMs * float64(time.Millisecond))
		if agoMs > 0 && ago < time.Millisecond/1000 {
			return // below the encoder's resolution: not this test's question
		}
		o, err := b.Decide(context.Background(), Decision{Op: OpLease, N: int64(c), Buckets: []Bucket{{Key: key, Capacity: int64(c), Refill: r, Cap: NoCap, ChangedAgo: ago}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.Exists(context.Background(), key).Err(); err != nil {
			t.Fatal(err)
		}
		left := tokensNow(t, rdb, key) + float64(o[0].Granted)
		// The real time since the write: the old refill may add that much, and the new
		// refill runs after the call.
		el := time.Since(start).Seconds()
		slack := (r0+r)*el + 1e-6*(1+c0+c)
		idle := idleMs / 1000
		old := min(c0, tokens+idle*r0) // what the old rule holds now
		if left > min(c, old)+slack {
			t.Fatalf("%v tokens after the change, the old rule holds %v (capacity %v now)", left, old, c)
		}
		if left < min(old, 0)-slack {
			t.Fatalf("%v tokens after the change, below the old rule's %v and empty", left, old)
		}
		if since := agoMs / 1000; since <= idle && idle-since+el < 1e9 {
			atChange := min(c0, tokens+(idle-since)*r0)
			if atChange >= 0 {
				want := min(c, min(c, atChange)+since*r, old)
				if math.Abs(left-want) > slack+1e-9*math.Abs(want) {
					t.Fatalf("changed %v s after the write: %v tokens, want %v (%v at the change)", idle-since, left, want, atChange)
				}
			}
		}
	})
}
