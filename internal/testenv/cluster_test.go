package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestSlotRangesCoverEverySlotOnce(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7, 64} {
		next := 0
		for i := range n {
			first, last := slotRange(i, n)
			if first != next || last < first {
				t.Fatalf("%d nodes: node %d serves %d-%d, want it to start at %d", n, i, first, last, next)
			}
			next = last + 1
		}
		if next != redisClusterSlots {
			t.Errorf("%d nodes: slots end at %d, want %d", n, next-1, redisClusterSlots-1)
		}
	}
}

func TestRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := RedisCluster(t)
	if len(c.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(c.Nodes))
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRetries: -1})
	defer cc.Close()

	// Keys land on the node that serves their slot, and every node takes some.
	perNode := make([]int, len(c.Nodes))
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		slot, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		n := c.NodeForSlot(int(slot))
		perNode[n]++
		direct := redis.NewClient(&redis.Options{Addr: c.Nodes[n].Addr()})
		got, err := direct.Get(ctx, key).Result()
		direct.Close()
		if err != nil || got != "v" {
			t.Fatalf("GET %s on node %d (slot %d): %q, %v", key, n, slot, got, err)
		}
	}
	for i, n := range perNode {
		if n == 0 {
			t.Errorf("node %d holds none of 30 keys (%v)", i, perNode)
		}
	}

	// A restarted node keeps its slots and comes back empty; the others keep serving.
	victim := c.NodeForSlot(int(cc.ClusterKeySlot(ctx, "k0").Val()))
	if err := c.Nodes[victim].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitOK(wctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := cc.Exists(ctx, "k0").Result()
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("k0 after its node restarted: exists %d, err %v; want an empty node serving", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
