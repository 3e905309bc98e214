package gateway

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// rlsConfig is the article's scenario plus a cost-capped route and a per-IP route.
func rlsConfig(upstream, redisURL string) Config {
	cfg := articleConfig("us-east", upstream, redisURL)
	cfg.RLSListen = "127.0.0.1:0"
	cfg.Redis.Timeout = 500 * time.Millisecond // a loaded test machine must not fall back
	cfg.Routes = append(cfg.Routes,
		RouteConfig{ID: "export", Match: "POST /export", Upstream: upstream, Cost: CostConfig{Max: 5}},
		RouteConfig{ID: "search", Match: "GET /search", Upstream: upstream, LimitBy: "client_ip",
			PerValue: &PerValueConfig{Capacity: 1, RefillPerSecond: 0.01}},
	)
	cfg.Tenants[0].Rules = append(cfg.Tenants[0].Rules,
		TenantRuleConfig{Route: "export", Capacity: 10, RefillPerSecond: 0.01},
		TenantRuleConfig{Route: "search", Capacity: 100, RefillPerSecond: 0.01},
	)
	return cfg
}

// rlsClient serves g's RLS service on a loopback port and dials it.
func rlsClient(t testing.TB, g *Gateway) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := g.newRLSServer()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

func respHeader(r *rlsv3.RateLimitResponse, name string) string {
	for _, h := range r.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

const (
	rlsOK   = rlsv3.RateLimitResponse_OK
	rlsOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

// TestRLSArticleScenario: capacity 2 through api_key + route descriptors: OK, OK,
// OVER_LIMIT with Retry-After, and the same series as the proxy under interface="rls".
func TestRLSArticleScenario(t *testing.T) {
	up := newUpstream(t, 0)
	rp := testenv.Redis(t)
	gw := newInProcess(t, rlsConfig(up.URL, testenv.RedisURL(rp)))
	c := rlsClient(t, gw.g)
	d := desc("api_key", "key-shop-a", "route", "create-order")
	for i, want := range []struct {
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{{rlsOK, 1}, {rlsOK, 0}, {rlsOver, 0}} {
		r := shouldRateLimit(t, c, 0, d)
		st := r.Statuses[0]
		if r.OverallCode != want.code || st.Code != want.code || st.LimitRemaining != want.remaining {
			t.Fatalf("call %d: overall %v status %v remaining %d, want %v/%d", i+1, r.OverallCode, st.Code, st.LimitRemaining, want.code, want.remaining)
		}
		if st.CurrentLimit == nil || st.DurationUntilReset == nil {
			t.Fatalf("call %d: status without current_limit or duration_until_reset: %v", i+1, st)
		}
		if got := respHeader(r, "X-Ratelimit-Limit"); got != "2" {
			t.Errorf("call %d: X-RateLimit-Limit %q, want 2", i+1, got)
		}
		retry := respHeader(r, "Retry-After")
		if want.code == rlsOver {
			if n, err := strconv.Atoi(retry); err != nil || n < 1 {
				t.Errorf("call %d: Retry-After %q, want whole seconds >= 1", i+1, retry)
			}
			if d := st.DurationUntilReset.AsDuration(); d < time.Second {
				t.Errorf("call %d: duration_until_reset %v, want about 2s (refill 0.5/s)", i+1, d)
			}
		} else if retry != "" {
			t.Errorf("call %d: Retry-After %q on OK", i+1, retry)
		}
	}
	// The proxy shares the bucket: it is spent.
	if resp, body := call(t, "POST", gw.srv.URL+"/orders", "key-shop-a"); resp.StatusCode != 429 {
		t.Fatalf("proxy after RLS spent the bucket: %d %s", resp.StatusCode, body)
	}
	s := scrapeURL(t, gw.admin.URL)
	if got := s.sum("ratelimit_requests_total", "route", "create-order", "interface", "rls", "decision", "allowed", "source", "redis"); got != 2 {
		t.Errorf("rls allowed %v, want 2", got)
	}
	if got := s.sum("ratelimit_requests_total", "route", "create-order", "interface", "rls", "decision", "throttled"); got != 1 {
		t.Errorf("rls throttled %v, want 1", got)
	}
	if got := s.sum("ratelimit_requests_total", "route", "create-order", "interface", "proxy", "decision", "throttled"); got != 1 {
		t.Errorf("proxy throttled %v, want 1", got)
	}
}

// TestRLSDescriptorsDecidedIndependently: one over-limit descriptor makes the overall
// code OVER_LIMIT while the other is still OK and still charged.
func TestRLSDescriptorsDecidedIndependently(t *testing.T) {
	up := newUpstream(t, 0)
	gw := newInProcess(t, rlsConfig(up.URL, testenv.RedisURL(testenv.Redis(t))))
	c := rlsClient(t, gw.g)
	shouldRateLimit(t, c, 0, desc("api_key", "key-shop-a", "route", "search", "remote_address", "10.0.0.1"))
	r := shouldRateLimit(t, c, 0,
		desc("api_key", "key-shop-a", "route", "search", "remote_address", "10.0.0.1"),
		desc("api_key", "key-shop-a", "route", "create-order"))
	if r.OverallCode != rlsOver || r.Statuses[0].Code != rlsOver || r.Statuses[1].Code != rlsOK || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("overall %v statuses %v", r.OverallCode, r.Statuses)
	}
	if respHeader(r, "Retry-After") == "" {
		t.Errorf("an OVER_LIMIT response without Retry-After: %v", r.ResponseHeadersToAdd)
	}
}

// TestRLSHitsAddend: hits_addend is the cost (descriptor's over the request's), capped
// by the route's cost.max: above it is over the limit, never free.
func TestRLSHitsAddend(t *testing.T) {
	up := newUpstream(t, 0)
	gw := newInProcess(t, rlsConfig(up.URL, testenv.RedisURL(testenv.Redis(t))))
	c := rlsClient(t, gw.g)
	d := desc("api_key", "key-shop-a", "route", "export")
	if r := shouldRateLimit(t, c, 4, d); r.OverallCode != rlsOK || r.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("hits 4 of 10: %v remaining %d, want OK 6", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
	d.HitsAddend = wrapperspb.UInt64(5)
	if r := shouldRateLimit(t, c, 1, d); r.OverallCode != rlsOK || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("descriptor hits 5: %v remaining %d, want OK 1", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
	d.HitsAddend = wrapperspb.UInt64(6) // above cost.max 5
	if r := shouldRateLimit(t, c, 0, d); r.OverallCode != rlsOver {
		t.Fatalf("hits above the cap: %v, want OVER_LIMIT", r.OverallCode)
	}
	d.HitsAddend = wrapperspb.UInt64(2) // 1 left
	if r := shouldRateLimit(t, c, 0, d); r.OverallCode != rlsOver {
		t.Fatalf("hits 2 with 1 left: %v, want OVER_LIMIT", r.OverallCode)
	}
	d.HitsAddend = nil // 0 means the route's cost, 1
	if r := shouldRateLimit(t, c, 0, d); r.OverallCode != rlsOK || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("hits 0: %v remaining %d, want OK 0", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
}

// TestRLSPerClientIP: a limit_by client_ip route gives each remote_address its own
// bucket (per_value: 1 here) inside the route's; an IPv6 client is counted per /64, as the
// unauthenticated guard counts it.
func TestRLSPerClientIP(t *testing.T) {
	up := newUpstream(t, 0)
	rp := testenv.Redis(t)
	gw := newInProcess(t, rlsConfig(up.URL, testenv.RedisURL(rp)))
	c := rlsClient(t, gw.g)
	for _, step := range []struct {
		addr string
		want rlsv3.RateLimitResponse_Code
	}{
		{"192.0.2.1", rlsOK}, {"192.0.2.2", rlsOK}, {"192.0.2.1", rlsOver}, {"192.0.2.2", rlsOver},
		{"2001:db8::1", rlsOK}, {"2001:db8::2", rlsOver}, {"2001:db8:1::1", rlsOK},
		{"not-an-ip", rlsOver}, {"", rlsOver},
	} {
		r := shouldRateLimit(t, c, 0, desc("api_key", "key-shop-a", "route", "search", "remote_address", step.addr))
		if r.OverallCode != step.want {
			t.Fatalf("remote_address %q: %v, want %v", step.addr, r.OverallCode, step.want)
		}
	}
	// Missing remote_address: over the limit, not a shared bucket.
	if r := shouldRateLimit(t, c, 0, desc("api_key", "key-shop-a", "route", "search")); r.OverallCode != rlsOver {
		t.Fatalf("no remote_address: %v, want OVER_LIMIT", r.OverallCode)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	defer rdb.Close()
	keys, err := rdb.Keys(context.Background(), "rl:{shop-a}:search:v:*").Result()
	if err != nil || len(keys) != 4 {
		t.Fatalf("per-value keys %v (%v), want 4 (two IPv4 clients, two IPv6 /64s)", keys, err)
	}
	for _, k := range keys {
		if ttl, err := rdb.PTTL(context.Background(), k).Result(); err != nil || ttl <= 0 {
			t.Errorf("key %s has no TTL (%v, %v): per-value state must expire", k, ttl, err)
		}
	}
	// No series grew with the values.
	if n := scrapeURL(t, gw.admin.URL).series("ratelimit_requests_total", "route", "search"); n != 3*(3*5+1) {
		t.Errorf("%d series for route search, want the pre-initialised %d", n, 3*(3*5+1))
	}
}

// TestRLSUnknownKeyNeverTouchesRedis: unknown, revoked, missing or doubled identities are
// OVER_LIMIT and leave Redis as it was; an untrusted tenant entry is not an identity.
func TestRLSUnknownKeyNeverTouchesRedis(t *testing.T) {
	up := newUpstream(t, 0)
	rp := testenv.Redis(t)
	gw := newInProcess(t, rlsConfig(up.URL, testenv.RedisURL(rp)))
	c := rlsClient(t, gw.g)
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	defer rdb.Close()
	size := func() int64 {
		n, err := rdb.DBSize(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before, evals := size(), evalCalls(t, rdb)
	for _, d := range []*rlcommon.RateLimitDescriptor{
		desc("api_key", "random-1", "route", "create-order"),
		desc("api_key", "", "route", "create-order"),
		desc("route", "create-order"),
		desc("tenant", "shop-a", "route", "create-order"), // rls_trust_tenant is off
		desc("api_key", "key-shop-a", "api_key", "random-2"),
		desc("api_key", "key-shop-a", "tenant", "shop-a"),
	} {
		if r := shouldRateLimit(t, c, 0, d); r.OverallCode != rlsOver || len(r.ResponseHeadersToAdd) != 0 {
			t.Fatalf("%v: %v headers %v, want OVER_LIMIT without rate headers", d.Entries, r.OverallCode, r.ResponseHeadersToAdd)
		}
	}
	if after := size(); after != before {
		t.Fatalf("DBSIZE %d -> %d: an unauthenticated descriptor created keys", before, after)
	}
	if got := evalCalls(t, rdb); got != evals {
		t.Fatalf("unauthenticated descriptors ran %d scripts", got-evals)
	}
	if got := scrapeURL(t, gw.admin.URL).sum("ratelimit_requests_total", "interface", "rls", "decision", "unauthenticated"); got != 6 {
		t.Errorf("rls unauthenticated %v, want 6", got)
	}
	// The check proves something: a valid key does reach Redis.
	if r := shouldRateLimit(t, c, 0, desc("api_key", "key-shop-a", "route", "create-order")); r.OverallCode != rlsOK || size() == before {
		t.Fatalf("valid key: %v, DBSIZE %d", r.OverallCode, size())
	}
}

// TestRLSTrustedTenant: with rls_trust_tenant the tenant entry is the identity.
func TestRLSTrustedTenant(t *testing.T) {
	up := newUpstream(t, 0)
	cfg := rlsConfig(up.URL, "")
	cfg.RLSTrustTenant = true
	gw := newInProcess(t, cfg)
	c := rlsClient(t, gw.g)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsOK, rlsOK, rlsOver} {
		if r := shouldRateLimit(t, c, 0, desc("tenant", "shop-a", "route", "create-order")); r.OverallCode != want {
			t.Fatalf("call %d: %v, want %v", i+1, r.OverallCode, want)
		}
	}
	if r := shouldRateLimit(t, c, 0, desc("tenant", "no/such", "route", "create-order")); r.OverallCode != rlsOver {
		t.Fatalf("an invalid tenant id: %v, want OVER_LIMIT", r.OverallCode)
	}
}

// TestRLSRedisOutageUsesFallback: with Redis gone the answers are over the limit until
// the breaker opens, then come from the fallback, whose bucket starts empty and earns
// the rule's refill over N (expected_instances = 1 here): never a gRPC error, never more
// than was earned.
func TestRLSRedisOutageUsesFallback(t *testing.T) {
	up := newUpstream(t, 0)
	rp := testenv.Redis(t)
	cfg := rlsConfig(up.URL, testenv.RedisURL(rp))
	cfg.Redis.Timeout = 20 * time.Millisecond
	cfg.Redis.Breaker = BreakerConfig{Failures: 2, FailureSpan: time.Millisecond, OpenFor: time.Minute}
	cfg.ExpectedInstances = 1
	gw := newInProcess(t, cfg)
	c := rlsClient(t, gw.g)
	if err := rp.Kill(); err != nil {
		t.Fatal(err)
	}
	d := desc("api_key", "key-shop-a", "route", "get-order") // the default rule: 20, 10/s
	start := time.Now()
	first := shouldRateLimit(t, c, 0, d).OverallCode
	if first != rlsOver {
		t.Errorf("the first call, breaker closed: %v, want OVER_LIMIT (a failed call is refused)", first)
	}
	ok := 0
	for i := 0; i < 400 && ok < 3; i++ {
		if shouldRateLimit(t, c, 0, d).OverallCode == rlsOK {
			ok++
		}
		time.Sleep(10 * time.Millisecond) // pacing, not synchronisation: the bound below uses the elapsed time
	}
	elapsed := time.Since(start)
	if ok < 3 {
		t.Fatalf("%d OK in %v of the outage, want 3 from the fallback's refill", ok, elapsed)
	}
	s := scrapeURL(t, gw.admin.URL)
	if got := s.sum("ratelimit_requests_total", "interface", "rls", "source", "fallback", "decision", "allowed"); got != float64(ok) {
		t.Errorf("rls fallback admissions %v, want %d", got, ok)
	}
	if earned := 10*elapsed.Seconds() + 1; float64(ok) > earned {
		t.Errorf("the fallback admitted %d in %v: more than its refill, %.1f", ok, elapsed, earned)
	}
	if got := s.sum("ratelimit_fallback_refused_total", "reason", "breaker_closed"); got < 1 {
		t.Errorf("refusals with the breaker closed %v, want at least the first call", got)
	}
}

// FuzzRLSDescriptor drives the descriptor parser with arbitrary entries and hits: no
// panic, no error but InvalidArgument-worthy shapes, and an identity only for the one
// valid key (unknown, missing or doubled identities never reach the limiter).
func FuzzRLSDescriptor(f *testing.F) {
	for _, s := range [][6]string{
		{"api_key", "key-shop-a", "route", "create-order", "remote_address", "10.0.0.1"},
		{"api_key", "nope", "route", "search", "remote_address", "2001:db8::1"},
		{"tenant", "shop-a", "route", "*", "", ""},
		{"api_key", "key-shop-a", "api_key", "key-shop-a", "route", "x"},
		{"route", "search", "remote_address", "10.0.0.1%eth0", "api_key", "key-shop-a"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], uint32(0), uint64(3), false)
	}
	cfg := rlsConfig("http://127.0.0.1:1", "")
	g, err := New(cfg, Options{})
	if err != nil {
		f.Fatal(err)
	}
	snap := g.snap.Load()
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string, reqHits uint32, hits uint64, setHits bool) {
		d := desc(k1, v1, k2, v2, k3, v3)
		if setHits {
			d.HitsAddend = wrapperspb.UInt64(hits)
		}
		c, refund, err := g.descriptorClaim(d, reqHits)
		if err != nil {
			return // more than one route entry
		}
		if c.rt == nil {
			t.Fatal("no route")
		}
		if refund {
			return
		}
		a := g.admit(ctx, snap, &c)
		if a.refused != admitted {
			return
		}
		nKeys := 0
		for _, e := range d.Entries {
			if e.Key == "api_key" || e.Key == "tenant" {
				nKeys++
			}
			if e.Key == "tenant" {
				t.Fatalf("an untrusted tenant entry authenticated: %v", d.Entries)
			}
		}
		if nKeys != 1 || (a.tenant != "shop-a" && a.tenant != "shop-b") {
			t.Fatalf("entries %v authenticated as %q", d.Entries, a.tenant)
		}
		if a.rt.id == routeUnmatched {
			t.Fatalf("entries %v decided under no route", d.Entries)
		}
		if a.cost < 1 || (a.rt.cost.Max > 0 && a.cost > a.rt.cost.Max) {
			t.Fatalf("cost %d for route %s (cap %d)", a.cost, a.rt.id, a.rt.cost.Max)
		}
		if a.rt.limitBy.kind != limitByNone {
			if a.value == "" || len(a.value) > 256 || strings.ContainsAny(a.value, ",;\"") || a.value != strings.TrimSpace(a.value) {
				t.Fatalf("route %s limited by value %q", a.rt.id, a.value)
			}
		}
	})
}

// TestRLSServedByRun: Run serves rls_listen beside the proxy and stops it on shutdown.
func TestRLSServedByRun(t *testing.T) {
	up := newUpstream(t, 0)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := rlsConfig(up.URL, "")
	cfg.RLSListen = "127.0.0.1:" + strconv.Itoa(port)
	gw := runInProcess(t, cfg, Options{})
	conn, err := grpc.NewClient(cfg.RLSListen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	var r *rlsv3.RateLimitResponse
	waitFor(t, 10*time.Second, "the RLS listener", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", "key-shop-a", "route", "create-order")}})
		return err == nil
	})
	if r.OverallCode != rlsOK || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("first RLS call: %v", r)
	}
	if resp, _ := call(t, "POST", gw.url+"/orders", "key-shop-a"); resp.StatusCode != 200 {
		t.Fatalf("proxy: %d", resp.StatusCode)
	}
}

// TestRLSUnauthenticatedLimit: failed authentications over RLS are charged to the
// client's unauthenticated_limit by remote_address, as the proxy charges them; once it
// is used up, even a valid key from that client is OVER_LIMIT, so a guesser learns
// nothing, while other clients are unaffected.
func TestRLSUnauthenticatedLimit(t *testing.T) {
	up := newUpstream(t, 0)
	cfg := rlsConfig(up.URL, "")
	cfg.UnauthenticatedLimit = UnauthLimitConfig{Capacity: 2, RefillPerSecond: 0.01}
	gw := newInProcess(t, cfg)
	c := rlsClient(t, gw.g)
	guesser, other := "203.0.113.7", "203.0.113.8"
	for i := range 3 {
		if r := shouldRateLimit(t, c, 0, desc("api_key", "guess-"+strconv.Itoa(i), "remote_address", guesser)); r.OverallCode != rlsOver {
			t.Fatalf("guess %d: %v", i, r.OverallCode)
		}
	}
	if r := shouldRateLimit(t, c, 0, desc("api_key", "key-shop-a", "route", "get-order", "remote_address", guesser)); r.OverallCode != rlsOver {
		t.Fatalf("a valid key from a blocked client: %v, want OVER_LIMIT", r.OverallCode)
	}
	if r := shouldRateLimit(t, c, 0, desc("api_key", "key-shop-a", "route", "get-order", "remote_address", other)); r.OverallCode != rlsOK {
		t.Fatalf("a valid key from another client: %v, want OK", r.OverallCode)
	}
	if got := scrapeURL(t, gw.admin.URL).sum("ratelimit_unauthenticated_throttled_total"); got != 2 {
		t.Errorf("unauthenticated throttled %v, want 2 (the third guess and the blocked valid key)", got)
	}
}

// BenchmarkRLSShouldRateLimit is one RLS decision without gRPC or Redis (the local
// limiter): descriptor parsing, the shared decision path and the response.
func BenchmarkRLSShouldRateLimit(b *testing.B) {
	cfg := rlsConfig("http://127.0.0.1:1", "")
	cfg.Tenants[0].Rules[0].Capacity = 1 << 40
	cfg.Tenants[0].Rules[0].RefillPerSecond = 1 << 30
	g, err := New(cfg, Options{})
	if err != nil {
		b.Fatal(err)
	}
	s := &rlsService{g: g}
	req := &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", "key-shop-a", "route", "create-order")}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
