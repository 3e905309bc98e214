package lua

import (
	"context"
	"strings"
	"testing"
)

// TestEmptyDecisionRefusesTheBatch: a decision of no bucket makes the batch's shape wrong,
// so the batch is refused whole, before the decision ahead of it writes.
func TestEmptyDecisionRefusesTheBatch(t *testing.T) {
	rdb := newRedis(t)
	arg := append(raw(1, 1, [4]float64{10, 1, 0, -1}), raw(1, 1)...)
	_, err := rdb.Eval(context.Background(), DecideSource(), []string{"first"}, arg).Result()
	if err == nil || !strings.HasPrefix(err.Error(), invalidPrefix) {
		t.Fatalf("a batch with a decision of no bucket: error %v, want %s", err, invalidPrefix)
	}
	if n := rdb.Exists(context.Background(), "first").Val(); n != 0 {
		t.Errorf("the decision ahead of the empty one wrote its bucket: the batch was not refused whole")
	}
}

// TestForeignValuesReadAsMissing: a bucket key another client filled with something else
// (another type, a string of another length, a hash with NaN tokens) reads as missing and
// is replaced, and the batch it shares with another tenant's decision is answered: an
// error would fail every decision of the call.
func TestForeignValuesReadAsMissing(t *testing.T) {
	rdb := newRedis(t)
	ctx := context.Background()
	rdb.RPush(ctx, "list", "a")
	rdb.SAdd(ctx, "set", "a")
	rdb.Set(ctx, "short", "hello", 0)
	rdb.Set(ctx, "nan28", string(make([]byte, 20))+"\x00\x00\x00\x00\x00\x00\xf8\x7f", 0) // c0 = NaN
	rdb.HSet(ctx, "hashnan", "tokens", "nan", "ts", "1", "c", "10", "r", "1")
	rdb.HSet(ctx, "hashjunk", "x", "1")
	for _, k := range []string{"list", "set", "short", "nan28", "hashnan", "hashjunk"} {
		arg := append(raw(1, 1, [4]float64{10, 1, 0, -1}), raw(1, 1, [4]float64{10, 1, 0, -1})...)
		v, err := rdb.Eval(ctx, DecideSource(), []string{"other:" + k, k}, arg).Result()
		if err != nil {
			t.Errorf("%s: batch failed: %v", k, err)
			continue
		}
		if r := v.([]any); r[0] != int64(1) || r[5] != int64(1) || r[7] != int64(9) {
			t.Errorf("%s: reply %v, want both admitted, the foreign key read as a full bucket (9 left)", k, r)
		}
		if typ := rdb.Type(ctx, k).Val(); typ != "string" || rdb.StrLen(ctx, k).Val() != 28 {
			t.Errorf("%s: after the take it is a %s, want the bucket's 28-byte string", k, typ)
		}
	}
}

// TestSettledDebtSurvivesALowering: a settle's debt past -capacity (the real cost of
// admitted requests) is owed whole when the capacity is then lowered, as a share or a
// shard change lowers it; clipped to the new -capacity it would be forgiven.
func TestSettledDebtSurvivesALowering(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	at := func(c int64) []Bucket { return []Bucket{{Key: "s", Capacity: c, Refill: 1, Cap: NoCap}} }
	if _, err := b.Decide(ctx, Decision{Op: OpTake, N: 1000, Buckets: at(1000)}, Decision{Op: OpSettle, N: 1_000_000, Buckets: at(1000)}); err != nil {
		t.Fatal(err)
	}
	o, err := b.Decide(ctx, Decision{Op: OpTake, N: 1, Buckets: at(999)})
	if err != nil {
		t.Fatal(err)
	}
	if o[0].Granted != 0 || o[0].RetryAfter.Seconds() < 1e6-100 {
		t.Errorf("take 1 after a lowering to 999: %+v, want refused for about 1e6 s (the debt of 1e6 kept)", o[0])
	}
	if st, err := b.Inspect(ctx, "s", 998, 1, 0); err != nil || st.Tokens > -1e6+100 {
		t.Errorf("inspect after a lowering to 998: %+v, %v; want the debt of about 1e6 shown whole, as a take reads it", st, err)
	}
}

// TestSlowRefillAdmitsOnlyWhatItCanStore: a refill so slow that a drained bucket's full
// time would not fit a double admits nothing, where the full time used to be clamped and
// the bucket read full again at once (at 1e-300 per second, five takes of 999 from a
// capacity of 1,000 were all admitted); one just inside drains and stays drained.
func TestSlowRefillAdmitsOnlyWhatItCanStore(t *testing.T) {
	rdb := newRedis(t)
	b := NewTokenBucket(rdb)
	ctx := context.Background()
	admitted := int64(0)
	for range 5 {
		o, err := b.Take(ctx, "tiny", 1000, 1e-300, 999)
		if err != nil {
			t.Fatal(err)
		}
		admitted += o.Granted
	}
	if admitted > 0 {
		t.Errorf("capacity 1000 at 1e-300 per second: %d takes of 999 admitted in a moment, want none (its absence cannot be stored)", admitted)
	}
	admitted = 0
	for range 5 {
		o, err := b.Take(ctx, "slow", 1000, 1e-290, 999)
		if err != nil {
			t.Fatal(err)
		}
		admitted += o.Granted
	}
	if admitted != 1 {
		t.Errorf("capacity 1000 at 1e-290 per second: %d takes of 999 admitted, want 1 (then drained for good)", admitted)
	}
	if ttl := rdb.PTTL(ctx, "slow").Val(); ttl <= 0 {
		t.Errorf("the drained slow bucket has PTTL %v, want a TTL", ttl)
	}
}
