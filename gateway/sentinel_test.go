package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// TestSentinelFailoverUnderLoad: a gateway on Redis Sentinel, with a tenant held at its
// limit by steady load, while the master is SIGKILLed. The sentinels promote the replica
// and the gateway must follow: no request goes undecided (no fail-open, no 5xx), the
// fallback covers the gap, Redis decides again after the promotion, and what was
// admitted stays within the limit plus what the fallback may add (its bucket starts at
// this instance's share of what Redis last reported, so only its refill while active)
// plus one capacity (writes the replica had not received; the new master's bucket
// refilled during the gap). The figures are logged for docs/reliability.md.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	const (
		capacity = 100
		refill   = 50.0 // per second
		workers  = 4
		after    = 2 * time.Second // load after the gateway is back on Redis
	)
	s := testenv.RedisSentinel(t)
	up := newUpstream(t, 0)
	cfg := articleConfig("us-east", up.URL, "")
	cfg.Redis.Sentinel = SentinelConfig{MasterName: s.MasterName, Addrs: s.Addrs()}
	cfg.Redis.Timeout = 50 * time.Millisecond // a loaded test machine must not fall back before the kill
	cfg.Tenants[0].Rules[0].Capacity = capacity
	cfg.Tenants[0].Rules[0].RefillPerSecond = refill
	gw := newInProcess(t, cfg)
	g := gw.g
	// The limiter's own report of its breaker (the gateway keeps no copy of it).
	fallback := g.lim.(*limiter.Redis).FallbackActive
	redisDecisions := func() float64 {
		return testutil.ToFloat64(g.m.requests.WithLabelValues("us-east", "create-order", "allowed", "redis", "proxy")) +
			testutil.ToFloat64(g.m.requests.WithLabelValues("us-east", "create-order", "throttled", "redis", "proxy"))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	waitFor(t, 10*time.Second, "first redis decision", func() bool {
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/orders/1", nil))
		req := httptest.NewRequest("POST", "/orders", nil)
		req.Header.Set(DefaultKeyHeader, "key-shop-a")
		g.Handler().ServeHTTP(httptest.NewRecorder(), req)
		return redisDecisions() > 0
	})

	var admitted, throttled, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				req := httptest.NewRequest("POST", "/orders", nil).WithContext(ctx)
				req.Header.Set(DefaultKeyHeader, "key-shop-a")
				rec := httptest.NewRecorder()
				g.Handler().ServeHTTP(rec, req)
				switch rec.Code {
				case http.StatusOK:
					admitted.Add(1)
				case http.StatusTooManyRequests:
					throttled.Add(1)
				default:
					failed.Add(1)
				}
			}
		})
	}
	// The fallback's time, sampled every 5 ms.
	var fallbackNS atomic.Int64
	wg.Go(func() {
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case now := <-tk.C:
				if fallback() {
					fallbackNS.Add(int64(now.Sub(last)))
				}
				last = now
			}
		}
	})
	stopLoad := func() {
		close(stop)
		wg.Wait()
	}

	time.Sleep(2 * time.Second) // at the limit before the kill
	admittedBefore := admitted.Load()
	if err := s.Master.Kill(); err != nil {
		stopLoad()
		t.Fatal(err)
	}
	killed := time.Now()
	if err := s.WaitMaster(ctx, s.Replica.Addr()); err != nil {
		stopLoad()
		t.Fatal(err)
	}
	promoted := time.Since(killed)
	atPromotion := redisDecisions()
	var recovered time.Duration
	for {
		if !fallback() && redisDecisions() > atPromotion+10 {
			recovered = time.Since(killed)
			break
		}
		if ctx.Err() != nil {
			stopLoad()
			t.Fatalf("the gateway did not decide on the new master within 90 s (promoted after %v)", promoted)
		}
		time.Sleep(5 * time.Millisecond)
	}
	admittedFailover := admitted.Load() - admittedBefore
	time.Sleep(after)
	stopLoad()
	elapsed := time.Since(start)

	fb := time.Duration(fallbackNS.Load())
	limit := capacity + refill*elapsed.Seconds()
	bound := limit + refill*fb.Seconds() + capacity
	failoverLimit := refill * recovered.Seconds() // the bucket is empty at the kill: load holds it there
	decisionErrs := testutil.ToFloat64(g.m.decisionErrors)
	fallbackDecisions := testutil.ToFloat64(g.m.requests.WithLabelValues("us-east", "create-order", "allowed", "fallback", "proxy")) +
		testutil.ToFloat64(g.m.requests.WithLabelValues("us-east", "create-order", "throttled", "fallback", "proxy"))
	t.Logf("sentinel failover: promoted %v after the kill, gateway on the new master %v after the kill; fallback active %v; "+
		"%d requests, %d undecided (5xx), %v fail-open, %v fallback decisions; admitted %d of limit %.0f (%.2fx) over %v; "+
		"during the failover admitted %d vs %.0f refilled (%.2fx)",
		promoted.Round(time.Millisecond), recovered.Round(time.Millisecond), fb.Round(time.Millisecond),
		admitted.Load()+throttled.Load()+failed.Load(), failed.Load(), decisionErrs, fallbackDecisions,
		admitted.Load(), limit, float64(admitted.Load())/limit, elapsed.Round(time.Millisecond),
		admittedFailover, failoverLimit, float64(admittedFailover)/failoverLimit)

	if n := failed.Load(); n != 0 {
		t.Errorf("%d requests were not decided (neither 200 nor 429)", n)
	}
	if decisionErrs != 0 {
		t.Errorf("%v requests let through undecided (fail open)", decisionErrs)
	}
	if fallbackDecisions == 0 {
		t.Error("no fallback decision: the kill went unnoticed, so the test proves nothing")
	}
	if got := float64(admitted.Load()); got > bound {
		t.Errorf("admitted %v > bound %.0f (limit %.0f + fallback bucket + lost replication)", got, bound, limit)
	}
	if fallback() {
		t.Error("still on the fallback at the end")
	}
}

// TestSentinelConfig: redis.sentinel alone is a Redis (no URL needed, the fallback
// bounds apply), and New builds a failover client for it without dialing.
func TestSentinelConfig(t *testing.T) {
	cfg := articleConfig("us-east", "http://127.0.0.1:1", "")
	cfg.Redis.Sentinel = SentinelConfig{MasterName: "m", Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}, DB: 2}
	g, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.closeClients()
	if g.rdb == nil || g.redis == nil {
		t.Fatal("no Redis limiter for redis.sentinel")
	}
	if _, ok := g.rdb.(*redis.Client); !ok { // NewFailoverClient returns a *redis.Client
		t.Fatalf("client %T", g.rdb)
	}
	if o := g.rdb.(*redis.Client).Options(); o.DB != 2 || !o.ContextTimeoutEnabled || o.MaxRetries != 0 { // -1 (none) is stored as 0
		t.Errorf("client options: db %d, context timeouts %v, retries %d", o.DB, o.ContextTimeoutEnabled, o.MaxRetries)
	}
	if len(decisionBounds(&g.cfg.Redis)) != 2 {
		t.Error("no decision-histogram bounds at the Redis timeout")
	}
}
