package lua

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestNestedAllOrNothing: the buckets of one decision (a tenant's route bucket and a
// client value's bucket nested in it) admit together or not at all.
func TestNestedAllOrNothing(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	k := Keys{}
	route := k.Bucket("acme", "search")
	nested := func(value string) Decision {
		return Decision{Op: OpTake, N: 1, Buckets: []Bucket{
			{Key: route, Capacity: 5, Refill: 0.001, Cap: NoCap},
			{Key: k.Value("acme", "search", value), Capacity: 2, Refill: 0.001, Cap: NoCap},
		}}
	}
	admitted := map[string]int{}
	for range 3 {
		for _, v := range []string{"a", "b", "c", "d"} {
			admitted[v] += int(mustDecide(t, b, nested(v))[0].Granted)
		}
	}
	total := admitted["a"] + admitted["b"] + admitted["c"] + admitted["d"]
	if total != 5 {
		t.Errorf("admitted %v (%d in all), want 5: the tenant's route bucket holds 5", admitted, total)
	}
	for v, n := range admitted {
		if n > 2 {
			t.Errorf("value %s admitted %d, want at most its own 2", v, n)
		}
	}
	// A value refused by its own bucket takes nothing from the route bucket.
	b2 := Keys{}.Bucket("beta", "search")
	v2 := k.Value("beta", "search", "x")
	d := Decision{Op: OpTake, N: 1, Buckets: []Bucket{
		{Key: b2, Capacity: 10, Refill: 0.001, Cap: NoCap},
		{Key: v2, Capacity: 1, Refill: 0.001, Cap: NoCap},
	}}
	mustDecide(t, b, d)
	o := mustDecide(t, b, d)[0]
	if o.Granted != 0 || o.Buckets[0].Remaining != 9 || o.Buckets[1].Remaining != 0 {
		t.Fatalf("second take of a 1-token value: %+v, want refused, route 9 left, value 0", o)
	}
	if o.RetryAfter < 999e9 {
		t.Errorf("RetryAfter %v: want the value bucket's wait for a token (about 1000 s)", o.RetryAfter)
	}
}

// TestBatchDecidesInOrder: many decisions in one call answer independently, in order;
// two decisions on one bucket see each other, as two calls would.
func TestBatchDecidesInOrder(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	var ds []Decision
	for i := range 16 {
		ds = append(ds, Decision{Op: OpTake, N: 1, Buckets: one(Keys{}.Bucket(fmt.Sprintf("t%d", i%4), "r"), 3, 0.001)})
	}
	out := mustDecide(t, b, ds...)
	if len(out) != 16 {
		t.Fatalf("%d outcomes for 16 decisions", len(out))
	}
	for i, o := range out {
		want := int64(0)
		if i < 12 { // each of the 4 keys admits its first 3
			want = 1
		}
		if o.Granted != want {
			t.Errorf("decision %d (key t%d, its %d. call): %+v, want granted %d", i, i%4, i/4+1, o, want)
		}
	}
}

// TestScriptCalls: a batch reads TIME once, GETs each bucket once and SETs only the
// buckets that changed: the calls the script's header promises, counted by Redis.
func TestScriptCalls(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	var ds []Decision
	for i := range 8 {
		ds = append(ds, Decision{Op: OpTake, N: 1, Buckets: one(Keys{}.Bucket(fmt.Sprintf("t%d", i), "r"), 1, 0.001)})
	}
	mustDecide(t, b, ds...) // load the script; every bucket now empty
	before := commandCalls(t, rdb)
	out := mustDecide(t, b, ds...) // all refused: nothing to write
	after := commandCalls(t, rdb)
	for _, o := range out {
		if o.Granted != 0 {
			t.Fatalf("second take of a 1-token bucket admitted: %+v", o)
		}
	}
	for cmd, want := range map[string]int64{"time": 1, "get": 8, "psetex": 0, "evalsha": 1} {
		if got := after[cmd] - before[cmd]; got != want {
			t.Errorf("%s called %d times for a refused batch of 8, want %d", cmd, got, want)
		}
	}
	ds[0].Buckets[0].Key = Keys{}.Bucket("fresh", "r")
	before = commandCalls(t, rdb)
	mustDecide(t, b, ds...) // one admitted: one write
	after = commandCalls(t, rdb)
	if got := after["psetex"] - before["psetex"]; got != 1 {
		t.Errorf("psetex called %d times for one admitted decision, want 1", got)
	}
}

// TestLargeBatch: a batch of thousands of decisions decides every bucket as separate calls
// would, a bucket named twice seeing its first take, and reads a bucket of the previous
// storage after many missing ones.
func TestLargeBatch(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	old := Keys{}.Bucket("old", "r")
	if err := rdb.HSet(ctx, old, "tokens", "0", "ts", redisMicros(t, rdb), "c", "10", "r", "0.001").Err(); err != nil {
		t.Fatal(err)
	}
	const n = 2500
	var ds []Decision
	for i := range n {
		ds = append(ds, Decision{Op: OpTake, N: 1, Buckets: one(Keys{}.Bucket(fmt.Sprintf("t%d", i%(n-500)), "r"), 1, 0.001)})
	}
	out := mustDecide(t, b, ds...)
	if len(out) != n {
		t.Fatalf("%d outcomes for %d decisions", len(out), n)
	}
	for i, o := range out {
		want := int64(1)
		if i >= n-500 { // the second take of a 1-token bucket named before in the batch
			want = 0
		}
		if o.Granted != want {
			t.Fatalf("decision %d: %+v, want granted %d", i, o, want)
		}
	}
	// The previous storage's hash after many missing buckets.
	ds = ds[:0]
	for i := range 1500 {
		ds = append(ds, Decision{Op: OpTake, N: 1, Buckets: one(Keys{}.Bucket(fmt.Sprintf("new%d", i), "r"), 1, 0.001)})
	}
	ds = append(ds, Decision{Op: OpTake, N: 1, Buckets: one(old, 10, 0.001)})
	out = mustDecide(t, b, ds...)
	if o := out[len(out)-1]; o.Granted != 0 {
		t.Errorf("take from an old-storage bucket holding 0 after 1500 missing ones: %+v, want refused", o)
	}
}

// TestBucketMemory: one key per bucket, its value 28 bytes.
func TestBucketMemory(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	const buckets = 1000
	var ds []Decision
	for i := range buckets {
		ds = append(ds, Decision{Op: OpTake, N: 1, Buckets: one(Keys{}.Bucket(fmt.Sprintf("tenant-%07d", i), "create-order"), 100, 0.01)})
		if len(ds) == 100 {
			mustDecide(t, b, ds...)
			ds = ds[:0]
		}
	}
	if n := rdb.DBSize(ctx).Val(); n != buckets {
		t.Errorf("DBSIZE %d, want %d: one key per bucket", n, buckets)
	}
	key := Keys{}.Bucket("tenant-0000001", "create-order")
	if n := rdb.StrLen(ctx, key).Val(); n != 28 {
		t.Errorf("value of %d bytes, want 28", n)
	}
	if enc := rdb.ObjectEncoding(ctx, key).Val(); enc != "embstr" {
		t.Errorf("encoding %q, want embstr (one allocation with the object)", enc)
	}
}

// TestBatchSendsAgoWithinFillTime: a bucket's ChangedAgo goes on the wire (op + 128, 40
// bytes a bucket) only while the change is within the bucket's fill time; after that a
// conversion at the change holds what one at the call does, and the 32 bytes suffice.
func TestBatchSendsAgoWithinFillTime(t *testing.T) {
	for _, tt := range []struct {
		ago  time.Duration
		want int // bytes of the one decision
	}{{0, 42}, {time.Second, 50}, {99 * time.Second, 50}, {100 * time.Second, 42}, {time.Hour, 42}} {
		var b Batch
		b.Add(Decision{Op: OpTake, N: 1, Buckets: []Bucket{{Key: "k", Capacity: 100, Refill: 1, Cap: NoCap, ChangedAgo: tt.ago}}})
		_, arg := b.Args()
		if len(arg) != tt.want || (arg[0] >= 128) != (tt.want == 50) {
			t.Errorf("ago %v: %d bytes, op byte %d; want %d bytes", tt.ago, len(arg), arg[0], tt.want)
		}
	}
}
