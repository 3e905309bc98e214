package lua

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkTake is one decision through the Go handle: one EVALSHA of decide.lua per
// Take, over 1,024 keys (make bench reports it beside the limiter's benchmarks).
func BenchmarkTake(b *testing.B) {
	rdb := newRedis(b)
	tb := NewTokenBucket(rdb)
	ctx := context.Background()
	if err := Load(ctx, rdb); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 1024)
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
