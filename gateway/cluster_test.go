package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
)

// clusterURL is redis.url for a cluster: the first node, the others as addr parameters.
func clusterURL(c *testenv.Cluster) string {
	addrs := c.Addrs()
	u := "redis://" + addrs[0]
	for i, a := range addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + a
	}
	return u
}

// TestArticleScenarioRedisCluster: with redis.cluster the gateway decides on a real
// 3-master Redis Cluster: 200, 200, 429 from Redis (not the fallback), the bucket on the
// node that owns its tenant's slot.
func TestArticleScenarioRedisCluster(t *testing.T) {
	cl := testenv.RedisCluster(t)
	up := newUpstream(t, 0)
	cfg := articleConfig("us-east", up.URL, clusterURL(cl))
	cfg.Redis.Cluster = true
	cfg.Redis.Timeout = 500 * time.Millisecond // a loaded test machine must not fall back
	gw := newInProcess(t, cfg)
	if _, ok := gw.g.rdb.(*redis.ClusterClient); !ok {
		t.Fatalf("redis client is %T, want *redis.ClusterClient", gw.g.rdb)
	}
	checkArticle(t, gw.srv.URL, "key-shop-a")

	s := scrapeURL(t, gw.admin.URL)
	for dec, want := range map[string]float64{"allowed": 2, "throttled": 1} {
		if got := s.sum("ratelimit_requests_total", "route", "create-order", "decision", dec, "source", "redis"); got != want {
			t.Errorf("ratelimit_requests_total{decision=%s,source=redis} = %v, want %v", dec, got, want)
		}
	}

	key := lua.Keys{}.Bucket("shop-a", "create-order")
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer cc.Close()
	slot, err := cc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	node := redis.NewClient(&redis.Options{Addr: cl.Addrs()[cl.NodeForSlot(int(slot))]})
	defer node.Close()
	if n, err := node.Exists(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("bucket %s on the node of slot %d: exists=%d (%v), want 1", key, slot, n, err)
	}
}

// TestRedisClusterConfig: the cluster client's settings, and the configs it refuses.
func TestRedisClusterConfig(t *testing.T) {
	cfg := articleConfig("us-east", "http://127.0.0.1:1", "redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002")
	cfg.Redis.Cluster = true
	g, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.closeClients()
	cc, ok := g.rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("client %T, want *redis.ClusterClient", g.rdb)
	}
	o := cc.Options()
	if !o.ContextTimeoutEnabled || o.MaxRetries != -1 || o.MaxRedirects != 2 || len(o.Addrs) != 3 || o.MinIdleConns != warmConns {
		t.Errorf("cluster options: ContextTimeoutEnabled=%v MaxRetries=%d MaxRedirects=%d Addrs=%v MinIdleConns=%d",
			o.ContextTimeoutEnabled, o.MaxRetries, o.MaxRedirects, o.Addrs, o.MinIdleConns)
	}

	for _, tt := range []struct{ url, want string }{
		{"", "redis.cluster: needs redis.url (the seed nodes)"},
		{"unix:///run/redis.sock", "redis.cluster: needs a redis:// or rediss:// redis.url, got unix://"},
		{"redis://127.0.0.1:7000/3", "redis.cluster: a Redis Cluster has only database 0"},
		{"redis://:Qx7zPw9k@127.0.0.1:7000?addr=127.0.0.1:7001&max_redirects=Qx7zPw9k", "redis.url: redis: invalid max_redirects number"},
	} {
		cfg := articleConfig("us-east", "http://127.0.0.1:1", tt.url)
		cfg.Redis.Cluster = true
		_, err := New(cfg, Options{})
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "Qx7z") {
			t.Errorf("%s: got %v, want %q", tt.url, err, tt.want)
		}
	}
}
