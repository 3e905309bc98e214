package gateway

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// BenchmarkRLSGRPC is one RLS decision through the gRPC door on loopback and a real
// Redis, 32 callers per core on one connection, each asking a random one of 10,000
// limit_by values: what cmd/rlsbench measures, with the client in the same process.
// Its allocs/op are the client's and the server's together.
func BenchmarkRLSGRPC(b *testing.B) {
	rp := testenv.Redis(b)
	cfg := rlsConfig("http://127.0.0.1:1", testenv.RedisURL(rp))
	cfg.Routes = append(cfg.Routes, RouteConfig{ID: "bench", Match: "GET /bench", Upstream: "http://127.0.0.1:1", LimitBy: "descriptor:user"})
	cfg.Tenants[0].Rules = append(cfg.Tenants[0].Rules, TenantRuleConfig{Route: "bench", Capacity: 1 << 40, RefillPerSecond: 1 << 30})
	gw := newInProcess(b, cfg)
	c := rlsClient(b, gw.g)
	ctx := context.Background()
	var seed atomic.Uint64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 42))
		for pb.Next() {
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
				desc("api_key", "key-shop-a", "route", "bench", "user", "u"+strconv.Itoa(rng.IntN(10_000))),
			}}
			resp, err := c.ShouldRateLimit(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Fatalf("overall %v, want OK", resp.OverallCode)
			}
		}
	})
}
