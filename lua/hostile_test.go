package lua

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// evalRaw runs decide.lua on keys with a hand-made argument, as another client could.
func evalRaw(rdb *redis.Client, keys []string, arg []byte) (any, error) {
	args := []any{"eval", DecideSource(), len(keys)}
	for _, k := range keys {
		args = append(args, k)
	}
	return rdb.Do(context.Background(), append(args, arg)...).Result()
}

// TestEmptyDecisionRefusesTheBatch: a decision of no bucket makes the batch's shape wrong,
// so the batch is refused whole, before the decision ahead of it writes.
func TestEmptyDecisionRefusesTheBatch(t *testing.T) {
	rdb := newRedis(t)
	arg := append(raw(1, 1, [4]float64{10, 1, 0, -1}), raw(1, 1)...)
	_, err := evalRaw(rdb, []string{"first"}, arg)
	if err == nil || !strings.HasPrefix(err.Error(), invalidPrefix) {
		t.Fatalf("a batch with a decision of no bucket: error %v, want %s", err, invalidPrefix)
	}
	if n := rdb.Exists(context.Background(), "first").Val(); n != 0 {
		t.Errorf("the decision ahead of the empty one wrote its bucket: the batch was not refused whole")
	}
}
