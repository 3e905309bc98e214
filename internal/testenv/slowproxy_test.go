package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSlowProxy: a Redis behind the proxy answers as usual at delay 0, no sooner than the
// delay once it is set, and as usual again when it is cleared.
func TestSlowProxy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rp := Redis(t)
	px, err := StartSlowProxy(rp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1})
	defer rdb.Close()

	ping := func() time.Duration {
		t.Helper()
		start := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatalf("ping through the proxy: %v", err)
		}
		return time.Since(start)
	}
	ping()
	px.SetDelay(30 * time.Millisecond)
	for range 3 {
		if d := ping(); d < 30*time.Millisecond {
			t.Errorf("ping took %v with a 30ms delay", d)
		}
	}
	px.SetDelay(0)
	fast := time.Hour
	for range 5 {
		fast = min(fast, ping())
	}
	if fast >= 30*time.Millisecond {
		t.Errorf("fastest ping %v after the delay was cleared", fast)
	}
	if _, err := StartSlowProxy("10.1.2.3:6379"); err == nil {
		t.Error("a non-loopback target was accepted")
	}
	if err := px.Close(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := rdb.Ping(cctx).Err(); err == nil {
		t.Error("ping succeeded through a closed proxy")
	}
}
