package lua

import (
	"context"
	"testing"
	"time"
)

// TestRuleRaisedAfterExpiry (issue 14 item 3): a rule of 2 tokens / 1 per s, drained;
// its key expires (deleted here: what PEXPIRE does once the old TTL passes); the rule is
// raised to 1000. The bucket must not be a full one at the new size: admitted <= the old
// bucket (2) + the new refill since the change (1/s) + 1.
func TestRuleRaisedAfterExpiry(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Bucket("t", "r")
	for range 2 {
		mustTake(t, b, key, 2, 1, 1)
	}
	if r := mustTake(t, b, key, 2, 1, 1); r.Allowed {
		t.Fatalf("third take of a 2-token bucket allowed")
	}
	if err := rdb.Del(ctx, key.Key).Err(); err != nil { // the old TTL passed
		t.Fatal(err)
	}
	start := time.Now()
	admitted := 0
	for range 1000 {
		if mustTake(t, b, key, 1000, 1, 1).Allowed {
			admitted++
		}
	}
	bound := 2 + time.Since(start).Seconds() + 1
	if float64(admitted) > bound {
		t.Fatalf("admitted %d after the rule was raised to 1000, want at most %.1f (old bucket 2 + 1/s since the change)", admitted, bound)
	}
	// The same when the key still exists under the old rule: it carries its tokens over.
	key2 := Keys{}.Bucket("t", "r2")
	mustTake(t, b, key2, 2, 1, 2)
	shiftTS(t, rdb, key2, time.Hour) // idle long past full under the old rule
	admitted = 0
	start = time.Now()
	for range 1000 {
		if mustTake(t, b, key2, 1000, 1, 1).Allowed {
			admitted++
		}
	}
	if bound := 2 + time.Since(start).Seconds() + 1; float64(admitted) > bound {
		t.Fatalf("existing key: admitted %d after the raise, want at most %.1f", admitted, bound)
	}
	// A rule first seen starts full.
	if r := mustTake(t, b, Keys{}.Bucket("new", "r"), 1000, 1, 1000); !r.Allowed {
		t.Fatalf("a new rule's first call for its whole capacity was rejected: %+v", r)
	}
}

// TestShardWithoutRecordStartsEmpty (issue 14 item 2): a shard i >= 1 has no rule record
// in its slot, so a missing one starts empty (a new shard count creates no tokens), is
// written at once so that it refills from then, and never expires.
func TestShardWithoutRecordStartsEmpty(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	key := Keys{}.Shard("t", "r", 3)
	if key.Record != "" {
		t.Fatalf("shard 3 has a record %q", key.Record)
	}
	if r := mustTake(t, b, key, 25, 0.01, 1); r.Allowed {
		t.Fatalf("a new shard admitted at once: %+v", r)
	}
	if ttl := rdb.PTTL(ctx, key.Key).Val(); ttl != -1 {
		t.Fatalf("new shard PTTL %v, want -1 (stored, no expiry)", ttl)
	}
	shiftTS(t, rdb, key, 200*time.Second) // 2 tokens of refill at 0.01/s
	for i := range 2 {
		if r := mustTake(t, b, key, 25, 0.01, 1); !r.Allowed {
			t.Fatalf("take %d after 2 tokens of refill rejected: %+v", i+1, r)
		}
	}
	if r := mustTake(t, b, key, 25, 0.01, 1); r.Allowed {
		t.Fatalf("third take after 2 tokens of refill allowed")
	}
	if ttl := rdb.PTTL(ctx, key.Key).Val(); ttl != -1 {
		t.Fatalf("shard PTTL %v after takes, want -1", ttl)
	}
}

// TestChargedIsWhatLuaCharged (issue 14 item 6): the reply says how much of the debt was
// charged, after the -capacity floor.
func TestChargedIsWhatLuaCharged(t *testing.T) {
	rdb := newRedis(t)
	ctx := context.Background()
	key := Keys{}.Bucket("t", "r")
	run := func(debt int64) Result {
		t.Helper()
		k, a := ScriptTake.Args(key, 10, 0.00001, 1, debt)
		r, err := TakeReply(takeScript.Run(ctx, rdb, k, a...))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := run(4); r.Charged != 4 || !r.Allowed {
		t.Fatalf("debt 4 on a full bucket of 10: %+v, want charged 4 and allowed", r)
	}
	// 5 left; a debt of 10 takes it to -5 (charged 10); another 10 only to -10 (5).
	if r := run(10); r.Charged != 10 || r.Allowed {
		t.Fatalf("debt 10 on 5 tokens: %+v, want charged 10, rejected", r)
	}
	if r := run(10); r.Charged != 5 {
		t.Fatalf("debt 10 at -5 of 10: %+v, want charged 5 (the -capacity floor)", r)
	}
	k, a := ScriptLease.Args(key, 10, 0.00001, 3, 7)
	if _, r, err := LeaseReply(leaseScript.Run(ctx, rdb, k, a...)); err != nil || r.Charged != 0 {
		t.Fatalf("lease with debt 7 at -10: %+v, %v; want charged 0", r, err)
	}
}
