package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSentinelFailover: the sentinels promote the replica when the master is killed, and
// a failover client follows: what it wrote before is readable on the new master.
func TestSentinelFailover(t *testing.T) {
	s := RedisSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if a, err := s.MasterAddr(ctx); err != nil || a != s.Master.Addr() {
		t.Fatalf("master %q (%v), want %s", a, err, s.Master.Addr())
	}
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.Addrs(), MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Wait(ctx, 1, time.Second).Err(); err != nil { // on the replica too
		t.Fatal(err)
	}
	if err := s.Master.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.WaitMaster(ctx, s.Replica.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Logf("promoted after %v", time.Since(start).Round(time.Millisecond))
	for {
		v, err := rdb.Get(ctx, "k").Result()
		if err == nil && v == "v" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the failover client never read k from the new master: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
