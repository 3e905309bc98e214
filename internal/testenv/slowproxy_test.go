package testenv

import (
	"context"
	"errors"
	"net"
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

// TestSlowProxyBlackHole: with the black hole on, a connection is accepted but a command
// on it is never answered (a client sees its own timeout, not a refusal or a reset), and
// an open connection goes silent too; once it is off, a new connection answers.
func TestSlowProxyBlackHole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rp := Redis(t)
	px, err := StartSlowProxy(rp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, PoolSize: 1, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, DialTimeout: time.Second})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping before the black hole: %v", err)
	}
	px.SetBlackHole(true)
	if !px.BlackHole() {
		t.Fatal("BlackHole() false after SetBlackHole(true)")
	}
	for i := range 3 { // the open connection first, then fresh ones
		start := time.Now()
		err := rdb.Ping(ctx).Err()
		if err == nil {
			t.Fatalf("ping %d answered through a black hole", i)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("ping %d: %v, want a timeout (the connection is accepted, never answered)", i, err)
		}
		if d := time.Since(start); d < 150*time.Millisecond {
			t.Errorf("ping %d failed after %v, before the read timeout", i, d)
		}
	}
	// A raw connection is accepted, not refused.
	c, err := net.DialTimeout("tcp", px.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial a black hole: %v", err)
	}
	_ = c.Close()
	px.SetBlackHole(false)
	var last error
	for range 20 { // bounded: the pool drops timed-out connections and dials anew
		if last = rdb.Ping(ctx).Err(); last == nil {
			break
		}
	}
	if last != nil {
		t.Errorf("ping after the black hole was turned off: %v", last)
	}
}
