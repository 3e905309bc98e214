package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// nodeOf returns the index of the cluster node that holds key (the node serving its
// slot, asked directly), or -1 when the key does not exist.
func nodeOf(t *testing.T, c *testenv.Cluster, key string) int {
	t.Helper()
	ctx := context.Background()
	any0 := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr()})
	slot, err := any0.ClusterKeySlot(ctx, key).Result()
	_ = any0.Close()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
	}
	i := c.NodeForSlot(int(slot))
	rdb := redis.NewClient(&redis.Options{Addr: c.Nodes[i].Addr()})
	defer rdb.Close()
	n, err := rdb.Exists(ctx, key).Result()
	if err != nil {
		t.Fatalf("EXISTS %s on node %d: %v", key, i, err)
	}
	if n == 0 {
		return -1
	}
	return i
}

// TestRedisClusterDecisions: through go-redis's universal client on a real 3-master
// cluster, a tenant's buckets share one node (hash tag), a sharded rule's shards spread
// over the nodes, pipelined decisions stay exact, and a node restart is absorbed by the
// breaker and the fallback until the node serves again.
func TestRedisClusterDecisions(t *testing.T) {
	c := testenv.RedisCluster(t)
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		t.Fatalf("universal client with %d addresses is a %T, want a cluster client", len(c.Addrs()), rdb)
	}
	// A failure span of 1 ns: the breaker counts failures here, not how long they took.
	l := newTestRedis(t, rdb, Options{Timeout: 500 * time.Millisecond, Breaker: BreakerOptions{OpenFor: 100 * time.Millisecond, FailureSpan: time.Nanosecond}})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	keys := lua.Keys{}

	// One tenant's buckets: one node.
	tenantNode := -1
	for i := range 10 {
		r := Request{Tenant: "shop-a", Route: fmt.Sprintf("r%d", i), Limit: regions.Limit{Capacity: 10, RefillPerSecond: 1}}
		if d := mustDecide(t, l, r); d.Source != SourceRedis {
			t.Fatalf("%+v, want a redis decision", d)
		}
		n := nodeOf(t, c, keys.Bucket("shop-a", r.Route))
		if n < 0 {
			t.Fatalf("bucket of shop-a/%s not in the cluster", r.Route)
		}
		if tenantNode >= 0 && n != tenantNode {
			t.Errorf("route %s of shop-a on node %d, others on %d", r.Route, n, tenantNode)
		}
		tenantNode = n
	}

	// A sharded rule: its shards on every node.
	sharded := Request{Tenant: "hot", Route: "r", Limit: regions.Limit{Capacity: 16_000, RefillPerSecond: 1}, Shards: 16}
	for range 300 {
		mustDecide(t, l, sharded)
	}
	perNode := make([]int, len(c.Nodes))
	for i := range 16 {
		if n := nodeOf(t, c, keys.Shard("hot", "r", i)); n >= 0 {
			perNode[n]++
		}
	}
	for i, n := range perNode {
		if n == 0 {
			t.Errorf("no shard of 16 on node %d (%v)", i, perNode)
		}
	}

	// Pipelined decisions across nodes stay exact: 8 tenants of 50 tokens, 512 calls.
	sources, allowed := decideConcurrently(t, l, 64, 8, func(i int) Request {
		return Request{Tenant: fmt.Sprintf("p%d", i%8), Route: "r", Limit: regions.Limit{Capacity: 50, RefillPerSecond: 0.001}}
	})
	if allowed != 400 || sources[SourceRedis] != 512 {
		t.Errorf("8 tenants x 50 tokens, 512 calls: %d allowed (want 400), sources %v", allowed, sources)
	}

	// The node holding shop-a restarts: decisions come from the fallback, without error,
	// then from Redis again (the node lost its scripts and keys).
	victim := c.Nodes[tenantNode]
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	// Refused until the breaker opens, then from a fallback bucket that starts empty.
	r := Request{Tenant: "shop-a", Route: "r-down", Limit: regions.Limit{Capacity: 1000, RefillPerSecond: 1}}
	for i := range 20 {
		if d := mustDecide(t, l, r); d.Source != SourceFallback {
			t.Fatalf("decision %d with shop-a's node down: %+v, want the fallback's", i, d)
		}
	}
	if !l.FallbackActive() {
		t.Errorf("breaker not open with a node down")
	}
	if err := victim.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitOK(wctx); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 15*time.Second, "redis decisions after the node restarted", func() bool {
		return mustDecide(t, l, r).Source == SourceRedis
	})
	if n := nodeOf(t, c, keys.Bucket("shop-a", r.Route)); n != tenantNode {
		t.Errorf("shop-a's bucket on node %d after the restart, want %d", n, tenantNode)
	}
}
