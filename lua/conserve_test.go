package lua

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRuleChangeConverts: a stored bucket under a changed rule holds what it refilled
// under its old rule until now, clipped to the new capacity, and refills at the new rate
// from now: no change creates tokens.
func TestRuleChangeConverts(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	tests := []struct {
		name             string
		tokens           float64 // under the old rule, now
		c0, c            int64
		r0, r            float64
		minLeft, maxLeft float64 // tokens after the first call under the new rule (which takes nothing: cost above)
	}{
		{"capacity raised, bucket half full", 5, 10, 1000, 0.001, 0.001, 5, 5.01},
		{"capacity raised, bucket full", 10, 10, 1000, 0.001, 0.001, 10, 10.01},
		{"capacity lowered clips", 8, 10, 3, 0.001, 0.001, 3, 3},
		{"refill lowered keeps tokens", 2, 10, 10, 1, 0.001, 2, 2.02}, // a few ms at the old 1/s before the call
		{"share raised 0.25 -> 0.75", 2, 25, 75, 2.5, 7.5, 2, 2.05},
		{"share lowered 0.75 -> 0.25", 60, 75, 25, 7.5, 2.5, 25, 25},
		{"in debt stays in debt", -4, 10, 1000, 0.001, 0.001, -4, -3.99},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := Keys{}.Bucket("t", string(rune('a'+i)))
			setTokens(t, rdb, key, tt.tokens, tt.c0, tt.r0, 0)
			// An admitted take of 1 under the new rule, then read what is left + 1.
			o := mustDecide(t, b, Decision{Op: OpLease, N: 1, Buckets: one(key, tt.c, tt.r)})[0]
			left := tokensNow(t, rdb, key) + float64(o.Granted)
			// The new refill over the real time since the call may add a little.
			if left < tt.minLeft-1e-6 || left > tt.maxLeft+tt.r*0.5 {
				t.Errorf("after the change: %v tokens, want within [%v, %v] (reply %+v)", left, tt.minLeft, tt.maxLeft, o)
			}
			if s := readStored(t, rdb, key); s.c != float64(tt.c) || s.r != tt.r {
				t.Errorf("stored rule %v/%v, want the new %d/%v", s.c, s.r, tt.c, tt.r)
			}
		})
	}
}

// TestCapBoundsEveryBucket: a cap (the old limit plus the new refill since a possible
// raise) bounds a missing bucket, which would otherwise read full; with CapAll it bounds
// a stored one too (a shard left over from an earlier layout, full again); without, a
// stored bucket keeps its own tokens (its rule change is converted exactly), and the cap
// changes nothing it does not lower.
func TestCapBoundsEveryBucket(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	takeAll := func(key string, cost int64, cp float64, all bool) Outcome {
		return mustDecide(t, b, Decision{Op: OpTake, N: cost, Buckets: []Bucket{{Key: key, Capacity: 1000, Refill: 1, Cap: cp, CapAll: all}}})[0]
	}
	take := func(key string, cost int64, cp float64) Outcome { return takeAll(key, cost, cp, true) }
	missing := Keys{}.Bucket("raised", "r")
	if o := take(missing, 3, 2.5); o.Granted != 0 {
		t.Errorf("missing bucket capped at 2.5 admitted a cost of 3: %+v", o)
	}
	if n := rdb.Exists(context.Background(), missing).Val(); n != 0 {
		t.Error("a refused take on a missing, capped bucket wrote it")
	}
	if o := take(missing, 2, 2.5); o.Granted != 1 || o.Buckets[0].Remaining != 0 {
		t.Errorf("missing bucket capped at 2.5, cost 2: %+v, want admitted, 0 left", o)
	}
	stale := Keys{}.Shard("raised", "r", 3)
	setTokens(t, rdb, stale, 1000, 1000, 1, 0)
	if o := take(stale, 10, 4); o.Granted != 0 {
		t.Errorf("full stored bucket capped at 4 admitted 10: %+v", o)
	}
	live := Keys{}.Bucket("raised", "live")
	setTokens(t, rdb, live, 1000, 1000, 1, 0)
	if o := takeAll(live, 10, 4, false); o.Granted != 1 {
		t.Errorf("full stored bucket, a cap for missing ones only: %+v, want admitted from its own 1000", o)
	}
	low := Keys{}.Bucket("raised", "low")
	setTokens(t, rdb, low, 3, 1000, 1, 0)
	if o := take(low, 3, 500); o.Granted != 1 || o.Buckets[0].Remaining != 0 {
		t.Errorf("cap 500 above the stored 3: %+v, want admitted with 0 left", o)
	}
}

// TestRaisedAfterExpiry (issue 14 item 3): a rule of 2 tokens / 1 per s, drained; its key
// expires; the rule is raised to 1000. The caller's cap (the old 2 plus the new refill
// since the raise) keeps the missing bucket from reading full at the new size.
func TestRaisedAfterExpiry(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	key := Keys{}.Bucket("t", "r")
	mustTake(t, b, key, 2, 1, 2)
	if err := rdb.Del(context.Background(), key).Err(); err != nil { // its TTL passed
		t.Fatal(err)
	}
	raised := time.Now()
	admitted := int64(0)
	for range 1000 {
		capNow := 2 + time.Since(raised).Seconds() // what the gateway sends within the fill time
		admitted += mustDecide(t, b, Decision{Op: OpTake, N: 1, Buckets: []Bucket{{Key: key, Capacity: 1000, Refill: 1, Cap: capNow}}})[0].Granted
	}
	if bound := 2 + time.Since(raised).Seconds() + 1; float64(admitted) > bound {
		t.Fatalf("admitted %d after the raise, want at most %.1f", admitted, bound)
	}
}

// TestOldStorageIsRead: a bucket written by the previous storage (a hash {tokens, ts, c,
// r}) is read with its tokens and replaced by the new form at its next write, so a
// rolling upgrade does not hand out a fresh bucket.
func TestOldStorageIsRead(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("old", "r")
	now := redisMicros(t, rdb)
	if err := rdb.HSet(ctx, key, "tokens", "1", "ts", now, "c", "10", "r", "0.001").Err(); err != nil {
		t.Fatal(err)
	}
	if o := mustTake(t, b, key, 10, 0.001, 2); o.Granted != 0 {
		t.Errorf("take of 2 from an old bucket holding 1: %+v, want refused", o)
	}
	if o := mustTake(t, b, key, 10, 0.001, 1); o.Granted != 1 || o.Buckets[0].Remaining != 0 {
		t.Errorf("take of 1: %+v, want admitted with 0 left", o)
	}
	if typ := rdb.Type(ctx, key).Val(); typ != "string" {
		t.Errorf("after a write the bucket is a %s, want the new string form", typ)
	}
	if v := rdb.TTL(ctx, key).Val(); v <= 0 {
		t.Errorf("the rewritten bucket has TTL %v, want one", v)
	}
	_ = redis.Nil
}

// TestConvertsAtTheChange: a stored bucket under a changed rule is converted at the
// change (Bucket.ChangedAgo), not at the call: an idle bucket under a lowered refill holds
// what it held then plus the new refill since, never what its old rule would have
// refilled until now. A raise adds nothing the old rule did not. A bucket below empty at
// the change (written after it, by a gateway with an older or a newer rule, or in debt)
// is converted at the call, as without an age: a lagging gateway, a raise it has not
// seen or a too-old date never cuts its tokens, nor is a debt forgiven beyond that.
func TestConvertsAtTheChange(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	tests := []struct {
		name             string
		tokens           float64       // under the old rule, at the write
		idle             time.Duration // since the write, with no call
		ago              time.Duration // since the change
		c0, c            int64
		r0, r            float64
		minLeft, maxLeft float64 // tokens before the lease's take
	}{
		// The attack's case: drained at 1000/s, lowered to 10/s, idle 1.2 s.
		{"drained, refill lowered, idle", 0, 1200 * time.Millisecond, 1200 * time.Millisecond, 1000, 1000, 1000, 10, 12, 12.5},
		{"half full, lowered 300 ms ago", 500, time.Second, 300 * time.Millisecond, 1000, 1000, 100, 1, 570.3, 570.35}, // 500 + 0.7 s x 100 + 0.3 s x 1
		{"full before the change", 900, 2 * time.Second, time.Second, 1000, 1000, 100, 1, 1000, 1000},
		{"written after the change, empty", 0, 0, 5 * time.Second, 1000, 1000, 1000, 10, 0, 0.05},
		{"written after the change, some left", 300, 0, 5 * time.Second, 1000, 1000, 1000, 10, 300, 300},
		{"an older rule after a raise it has not seen", 50, 0, time.Hour, 100, 100, 100, 1, 50, 50},
		{"a date a month old, full", 1000, 0, 720 * time.Hour, 1000, 100, 100, 1, 100, 100},
		{"in debt at the change: at the call", -1000, 1500 * time.Millisecond, time.Second, 1000, 1000, 1000, 1, 500, 500},
		{"refill raised", 100, 0, 10 * time.Second, 1000, 1000, 1, 1000, 100, 100.1},
		{"share lowered 0.75 -> 0.25, idle", 0, 2 * time.Second, time.Second, 75, 25, 7.5, 2.5, 10, 10.05},
		{"in debt stays in debt", -400, 0, time.Second, 1000, 1000, 1000, 10, -400, -399},
		{"not known: at the call", 0, 1200 * time.Millisecond, 0, 1000, 1000, 1000, 10, 1000, 1000},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := Keys{}.Bucket("at", string(rune('a'+i)))
			start := time.Now()
			setTokens(t, rdb, key, tt.tokens, tt.c0, tt.r0, 0)
			age(t, rdb, key, tt.idle)
			// ratectl's reader (inspect.lua) sees what the lease below will.
			st, err := b.Inspect(context.Background(), key, tt.c, tt.r, tt.ago)
			// The real time since the write moves it earlier against the change (at most
			// that much more of the old refill), and the new refill runs after the call.
			slack := (tt.r0+tt.r)*time.Since(start).Seconds() + 1e-6
			if err != nil || st.Tokens < tt.minLeft-1e-6 || st.Tokens > tt.maxLeft+slack {
				t.Errorf("Inspect: %+v, %v; want within [%v, %v] tokens", st, err, tt.minLeft, tt.maxLeft)
			}
			o := mustDecide(t, b, Decision{Op: OpLease, N: tt.c, Buckets: []Bucket{{Key: key, Capacity: tt.c, Refill: tt.r, Cap: NoCap, ChangedAgo: tt.ago}}})[0]
			left := tokensNow(t, rdb, key) + float64(o.Granted)
			if slack = (tt.r0+tt.r)*time.Since(start).Seconds() + 1e-6; left < tt.minLeft-1e-6 || left > tt.maxLeft+slack {
				t.Errorf("after the change: %v tokens, want within [%v, %v] (reply %+v)", left, tt.minLeft, tt.maxLeft, o)
			}
		})
	}
}
