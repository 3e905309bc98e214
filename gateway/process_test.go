package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// These tests run cmd/gateway as a real process against real Redis and PostgreSQL
// servers, as production does.

func routesYAML(upstream string) string {
	return fmt.Sprintf(`routes:
  - {id: create-order, match: "POST /orders", upstream: %q}
  - {id: get-order, match: "GET /orders/{id}", upstream: %q}
`, upstream, upstream)
}

// standaloneYAML is the article's tenant in a file: shop-a, capacity 2 on POST /orders.
func standaloneYAML(region, upstream string, capacity int, refill float64) string {
	return fmt.Sprintf(`region: %s
redis: {timeout: 250ms}
%stenants:
  - id: shop-a
    keys: [{secret: key-shop-a}]
    rules: [{route: create-order, capacity: %d, refill_per_second: %v}]
`, region, routesYAML(upstream), capacity, refill)
}

func databaseYAML(region, upstream string) string {
	return fmt.Sprintf(`region: %s
redis: {timeout: 250ms}
reload_interval: 1s
heartbeat_interval: 200ms
%s`, region, routesYAML(upstream))
}

// withoutRedis drops the redis section of a test config, for a gateway that is given no
// Redis URL: a redis section without a URL is refused (it means RATELIMIT_REDIS_URL was
// meant to be set).
func withoutRedis(yaml string) string {
	return strings.Replace(yaml, "redis: {timeout: 250ms}\n", "", 1)
}

func TestProcessArticleStandalone(t *testing.T) {
	up := newUpstream(t, 0)
	t.Run("redis", func(t *testing.T) {
		rp := testenv.Redis(t)
		p := startProc(t, standaloneYAML("us-east", up.URL, 2, 0.5), "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
		checkArticle(t, p.url, "key-shop-a")
		if got := scrapeURL(t, p.admin).sum("ratelimit_requests_total", "route", "create-order", "source", "redis"); got != 3 {
			t.Errorf("redis decisions %v, want 3", got)
		}
		if w := p.logLines("limits are enforced per instance"); len(w) != 0 {
			t.Errorf("per-instance warning with Redis configured: %v", w)
		}
	})
	t.Run("no redis", func(t *testing.T) {
		p := startProc(t, withoutRedis(standaloneYAML("us-east", up.URL, 2, 0.5)))
		checkArticle(t, p.url, "key-shop-a")
		w := p.logLines("limits are enforced per instance")
		if len(w) != 1 || w[0]["level"] != "WARN" {
			t.Errorf("want one startup WARN that limits are per instance, got %v", w)
		}
	})
}

func TestProcessArticleDatabase(t *testing.T) {
	up := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	db.setRule(t, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 2, RefillPerSecond: 0.5})
	key, _ := db.createKey(t, "shop-a")
	rp := testenv.Redis(t)
	p := startProc(t, databaseYAML("us-east", up.URL),
		"RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	p.waitReady(t, 10*time.Second)
	checkArticle(t, p.url, key)
	s := scrapeURL(t, p.admin)
	if got := s.sum("ratelimit_rules_loaded", "region", "us-east"); got != 2 {
		t.Errorf("rules loaded %v, want 2 (the default and shop-a's)", got)
	}
	if got := s.sum("ratelimit_rules_last_reload_success_timestamp_seconds"); got < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("last reload timestamp %v", got)
	}
	if got := s.sum("ratelimit_region_share_ratio", "scope", "*"); got != 1 {
		t.Errorf("share of * %v, want 1 (one region)", got)
	}
}

// result counts the answers of a load run.
type result struct {
	ok, throttled, other atomic.Int64
	statuses             sync.Map // status -> *atomic.Int64
}

func (r *result) add(status int) {
	switch status {
	case 200:
		r.ok.Add(1)
	case 429:
		r.throttled.Add(1)
	default:
		r.other.Add(1)
		v, _ := r.statuses.LoadOrStore(status, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
}

func (r *result) String() string {
	s := fmt.Sprintf("200: %d, 429: %d, other: %d", r.ok.Load(), r.throttled.Load(), r.other.Load())
	r.statuses.Range(func(k, v any) bool {
		s += fmt.Sprintf(" [%v: %d]", k, v.(*atomic.Int64).Load())
		return true
	})
	return s
}

// load sends n POST /orders with key, spread over urls, from workers goroutines; it
// returns the counts and the time from the first send to the last answer.
func load(t *testing.T, urls []string, key string, n, workers int) (*result, time.Duration) {
	t.Helper()
	var (
		res  result
		next atomic.Int64
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				req, _ := http.NewRequest("POST", urls[i%int64(len(urls))]+"/orders", nil)
				req.Header.Set("X-Api-Key", key)
				resp, err := testClient.Do(req)
				if err != nil {
					res.add(-1)
					continue
				}
				_ = resp.Body.Close()
				res.add(resp.StatusCode)
			}
		})
	}
	wg.Wait()
	return &res, time.Since(start)
}

// TestProcessFourGatewaysShareOneBucket: four gateways of one region on one Redis admit,
// together, at most capacity + refill x elapsed, and the whole burst.
func TestProcessFourGatewaysShareOneBucket(t *testing.T) {
	const (
		capacity = 100
		refill   = 20.0
		requests = 2000
	)
	up := newUpstream(t, 0)
	rp := testenv.Redis(t)
	var urls []string
	var procs []*proc
	for range 4 {
		p := startProc(t, standaloneYAML("us-east", up.URL, capacity, refill)+"expected_instances: 4\n",
			"RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
		urls = append(urls, p.url)
		procs = append(procs, p)
	}
	res, elapsed := load(t, urls, "key-shop-a", requests, 64)
	bound := capacity + refill*elapsed.Seconds()
	t.Logf("%d requests through 4 gateways in %s: %s; bound capacity + refill x elapsed = %.1f",
		requests, elapsed.Round(time.Millisecond), res, bound)
	if res.other.Load() != 0 {
		t.Fatalf("unexpected statuses: %s", res)
	}
	if got := float64(res.ok.Load()); got > bound {
		t.Errorf("admitted %v > capacity + refill x elapsed = %.1f", got, bound)
	}
	if got := res.ok.Load(); got < capacity {
		t.Errorf("admitted %d < capacity %d: the burst was not served", got, capacity)
	}
	var fallback float64
	for _, p := range procs {
		fallback += scrapeURL(t, p.admin).sum("ratelimit_requests_total", "source", "fallback")
	}
	if fallback != 0 {
		t.Errorf("%v decisions fell back: the bound above only holds while Redis decides", fallback)
	}
}

// TestProcessTwoRegionsAdmitTheirShares: with shares 0.7/0.3, each region's gateway on
// its own Redis admits its scaled part of the limit.
func TestProcessTwoRegionsAdmitTheirShares(t *testing.T) {
	const capacity, refill = 100, 1.0
	up := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east", "eu-west")
	db.setRule(t, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: capacity, RefillPerSecond: refill})
	key, _ := db.createKey(t, "shop-a")
	if err := db.store.SetOverride(context.Background(), regions.GlobalScope,
		map[string]float64{"us-east": 0.7, "eu-west": 0.3}, "test", "two regions", 0); err != nil {
		t.Fatal(err)
	}
	db.forgetRaises(t)
	for _, rg := range []struct {
		name  string
		share float64
	}{{"us-east", 0.7}, {"eu-west", 0.3}} {
		t.Run(rg.name, func(t *testing.T) {
			rp := testenv.Redis(t)
			p := startProc(t, databaseYAML(rg.name, up.URL),
				"RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
			p.waitReady(t, 10*time.Second)
			res, elapsed := load(t, []string{p.url}, key, 200, 16)
			scaled := float64(capacity) * rg.share
			bound := scaled + refill*rg.share*elapsed.Seconds()
			t.Logf("%s: %s in %s; scaled capacity %.0f, bound %.1f", rg.name, res, elapsed.Round(time.Millisecond), scaled, bound)
			if res.other.Load() != 0 {
				t.Fatalf("unexpected statuses: %s", res)
			}
			if got := float64(res.ok.Load()); got < scaled || got > bound {
				t.Errorf("admitted %v, want within [%.0f, %.1f]", got, scaled, bound)
			}
			resp, _ := call(t, "POST", p.url+"/orders", key)
			if got, want := resp.Header.Get("X-RateLimit-Limit"), strconv.Itoa(int(scaled)); got != want {
				t.Errorf("X-RateLimit-Limit %q, want %q", got, want)
			}
			if got := scrapeURL(t, p.admin).sum("ratelimit_region_share_ratio", "scope", "*"); got != rg.share {
				t.Errorf("share ratio of * %v, want %v", got, rg.share)
			}
		})
	}
}

// TestProcessHeldIncreaseIsNotReported: us-east's share rises 0.5 -> 0.8 while an eu-west
// gateway has not acknowledged the write (it heartbeats an old snapshot, as one cut off
// from PostgreSQL does), so us-east enforces 0.5 (X-RateLimit-Limit 50): the share gauge
// must say 0.5 too. It said 0.8 for as long as the increase was held (the black-box
// attack read 0.95 on the gauge beside an advertised 0.1); once eu-west acknowledges,
// both say 0.8.
func TestProcessHeldIncreaseIsNotReported(t *testing.T) {
	ctx := context.Background()
	up := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east", "eu-west")
	db.setRule(t, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 100, RefillPerSecond: 1})
	key, _ := db.createKey(t, "shop-a")
	db.forgetRaises(t)
	beat := func() {
		t.Helper()
		snap, err := db.store.LoadSnapshot(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.store.HeartbeatAt(ctx, "eu-west-cut", "eu-west", snap.Xmin()); err != nil {
			t.Fatal(err)
		}
	}
	beat() // eu-west's gateway holds the equal split
	rp := testenv.Redis(t)
	p := startProc(t, databaseYAML("us-east", up.URL),
		"RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	p.waitReady(t, 10*time.Second)
	if err := db.store.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.8, "eu-west": 0.2}, "test", "move", 0); err != nil {
		t.Fatal(err)
	}
	state := func() (limit string, gauge, held float64) {
		resp, _ := call(t, "POST", p.url+"/orders", key)
		s := scrapeURL(t, p.admin)
		return resp.Header.Get("X-RateLimit-Limit"), s.sum("ratelimit_region_share_ratio", "scope", "*"), s.sum("ratelimit_share_increases_held")
	}
	deadline := time.Now().Add(10 * time.Second)
	limit, gauge, held := state()
	for held == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		limit, gauge, held = state()
	}
	if held == 0 {
		t.Fatalf("us-east never held the increase: limit %s, gauge %v", limit, gauge)
	}
	if limit != "50" || gauge != 0.5 {
		t.Errorf("increase held: X-RateLimit-Limit %s and share gauge %v, want 50 and 0.5 (the share in force)", limit, gauge)
	}
	beat() // eu-west has loaded the move
	for (held != 0 || limit != "80") && time.Now().Before(deadline.Add(10*time.Second)) {
		time.Sleep(50 * time.Millisecond)
		limit, gauge, held = state()
	}
	if limit != "80" || gauge != 0.8 {
		t.Errorf("acknowledged: X-RateLimit-Limit %s and share gauge %v, want 80 and 0.8", limit, gauge)
	}
}

// TestProcessLiveChanges: rules, shares and revocations made in SQL take effect within
// a second, with no restart.
func TestProcessLiveChanges(t *testing.T) {
	up := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	db.setRule(t, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 40, RefillPerSecond: 100})
	key, apiKey := db.createKey(t, "shop-a")
	rp := testenv.Redis(t)
	p := startProc(t, databaseYAML("us-east", up.URL),
		"RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	p.waitReady(t, 10*time.Second)

	limit := func() string {
		resp, _ := call(t, "POST", p.url+"/orders", key)
		return resp.Header.Get("X-RateLimit-Limit")
	}
	if got := limit(); got != "40" {
		t.Fatalf("X-RateLimit-Limit %q, want 40", got)
	}
	steps := []struct {
		name string
		sql  string
		args []any
		done func() bool
	}{
		{"rule changed", `UPDATE rate_limit_rule SET capacity = 60 WHERE tenant_id = 'shop-a' AND route_id = 'create-order'`, nil,
			func() bool { return limit() == "60" }},
		{"region added: equal split", `INSERT INTO region (name) VALUES ('eu-west')`, nil,
			func() bool { return limit() == "30" }},
		{"share overridden", `INSERT INTO region_share (scope, region, share, source) VALUES ('shop-a', 'us-east', 0.25, 'override'), ('shop-a', 'eu-west', 0.75, 'override')`, nil,
			func() bool { return limit() == "15" }},
		{"key revoked", `UPDATE api_key SET revoked_at = now() WHERE id = $1`, []any{apiKey.ID},
			func() bool {
				resp, _ := call(t, "POST", p.url+"/orders", key)
				return resp.StatusCode == 401
			}},
	}
	for _, st := range steps {
		start := time.Now()
		db.exec(t, st.sql, st.args...)
		waitFor(t, 5*time.Second, st.name, st.done)
		took := time.Since(start)
		t.Logf("%s: in effect after %s", st.name, took.Round(time.Millisecond))
		if took > time.Second {
			t.Errorf("%s: took %s, want < 1s", st.name, took)
		}
	}
}

// TestProcessRedisStoppedAndBack: with Redis gone the gateway answers from the fallback
// (no 5xx, visible in metrics); when Redis is back, Redis decides again.
func TestProcessRedisStoppedAndBack(t *testing.T) {
	up := newUpstream(t, 0)
	rp := testenv.Redis(t)
	cfg := strings.Replace(standaloneYAML("us-east", up.URL, 1000, 1000), "redis: {timeout: 250ms}", "redis: {timeout: 5ms}", 1)
	p := startProc(t, cfg+"expected_instances: 2\n", "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	redisDecisions := func() float64 {
		return scrapeURL(t, p.admin).sum("ratelimit_requests_total", "route", "create-order", "source", "redis")
	}
	waitFor(t, 10*time.Second, "first redis decision", func() bool {
		call(t, "POST", p.url+"/orders", "key-shop-a")
		return redisDecisions() > 0
	})

	if err := rp.Stop(); err != nil {
		t.Fatal(err)
	}
	res, elapsed := load(t, []string{p.url}, "key-shop-a", 300, 8)
	t.Logf("Redis stopped: %s in %s", res, elapsed.Round(time.Millisecond))
	if res.other.Load() != 0 || res.ok.Load() == 0 {
		t.Fatalf("with Redis stopped: %s; want only 200/429", res)
	}
	s := scrapeURL(t, p.admin)
	if got := s.sum("ratelimit_requests_total", "route", "create-order", "source", "fallback"); got == 0 {
		t.Errorf("no fallback decisions counted while Redis was down")
	}
	if got := s.sum("ratelimit_fallback_active"); got != 1 {
		t.Errorf("ratelimit_fallback_active %v, want 1", got)
	}

	if err := rp.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := redisDecisions()
	took := waitFor(t, 15*time.Second, "redis deciding again", func() bool {
		call(t, "POST", p.url+"/orders", "key-shop-a")
		return redisDecisions() > before
	})
	t.Logf("Redis back: deciding again after %s", took.Round(time.Millisecond))
	waitFor(t, 5*time.Second, "fallback inactive", func() bool {
		call(t, "POST", p.url+"/orders", "key-shop-a")
		return scrapeURL(t, p.admin).sum("ratelimit_fallback_active") == 0
	})
}

// TestProcessRedisPaused: a Redis that hangs (SIGSTOP) costs each request at most the
// decision timeout, then the breaker answers at once.
func TestProcessRedisPaused(t *testing.T) {
	const timeout = 5 * time.Millisecond
	up := newUpstream(t, 0)
	rp := testenv.Redis(t)
	cfg := strings.Replace(standaloneYAML("us-east", up.URL, 1000, 1000), "redis: {timeout: 250ms}", "redis: {timeout: 5ms}", 1)
	p := startProc(t, cfg, "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	// Warm the client's connections while Redis answers.
	for range 20 {
		call(t, "POST", p.url+"/orders", "key-shop-a")
	}
	// The direct cost of a request through this machine, to compare against.
	var base []time.Duration
	for range 20 {
		start := time.Now()
		call(t, "GET", up.URL+"/orders/1", "")
		base = append(base, time.Since(start))
	}
	if err := rp.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Resume() }()
	var lat []time.Duration
	for range 100 {
		start := time.Now()
		resp, body := call(t, "POST", p.url+"/orders", "key-shop-a")
		lat = append(lat, time.Since(start))
		if resp.StatusCode >= 500 {
			t.Fatalf("status %d with Redis paused: %s", resp.StatusCode, body)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sort.Slice(base, func(i, j int) bool { return base[i] < base[j] })
	// Generous: this runs on a small shared machine; the point is "milliseconds, not the
	// client's seconds-long read timeout".
	limit := timeout + 100*time.Millisecond + base[len(base)-1]
	t.Logf("Redis paused: latency p50 %s, max %s (direct upstream max %s); bound %s",
		lat[len(lat)/2], lat[len(lat)-1], base[len(base)-1], limit)
	if lat[len(lat)-1] > limit {
		t.Errorf("slowest answer %s with Redis paused, want <= %s", lat[len(lat)-1], limit)
	}
	if got := scrapeURL(t, p.admin).sum("ratelimit_requests_total", "source", "fallback"); got == 0 {
		t.Errorf("no fallback decisions while Redis was paused")
	}
}

// TestProcessPostgresStopped: the gateway keeps serving from its last snapshot while the
// database is down, and picks up changes again once it is back.
func TestProcessPostgresStopped(t *testing.T) {
	up := newUpstream(t, 0)
	pg := testenv.PostgresServer(t)
	url, err := pg.CreateDatabase(context.Background(), "gw")
	if err != nil {
		t.Fatal(err)
	}
	db := newDatabase(t, url, "us-east")
	db.setRule(t, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 50, RefillPerSecond: 100})
	key, _ := db.createKey(t, "shop-a")
	p := startProc(t, strings.Replace(withoutRedis(databaseYAML("us-east", up.URL)), "reload_interval: 1s", "reload_interval: 300ms", 1),
		"RATELIMIT_DATABASE_URL="+url)
	p.waitReady(t, 10*time.Second)

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a failed reload", func() bool {
		return scrapeURL(t, p.admin).sum("ratelimit_rule_reload_errors_total") > 0
	})
	for range 20 {
		resp, body := call(t, "POST", p.url+"/orders", key)
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "50" {
			t.Fatalf("with PostgreSQL down: %d %s %v", resp.StatusCode, body, resp.Header)
		}
	}
	if resp, _ := call(t, "GET", p.admin+"/readyz", ""); resp.StatusCode != 200 {
		t.Errorf("/readyz %d with a snapshot loaded and PostgreSQL down, want 200", resp.StatusCode)
	}

	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The test's own pool may hand out a connection the restart cut (57P01) first.
	waitFor(t, 10*time.Second, "a rule write after PostgreSQL is back", func() bool {
		return db.store.SetRule(context.Background(), regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 70, RefillPerSecond: 100}) == nil
	})
	took := waitFor(t, 15*time.Second, "change after PostgreSQL is back", func() bool {
		resp, _ := call(t, "POST", p.url+"/orders", key)
		return resp.Header.Get("X-RateLimit-Limit") == "70"
	})
	t.Logf("PostgreSQL back: change applied after %s", took.Round(time.Millisecond))
}

// TestProcessDatabaseDownAtStart: the gateway starts, reports not ready and retries.
func TestProcessDatabaseDownAtStart(t *testing.T) {
	up := newUpstream(t, 0)
	pg := testenv.PostgresServer(t)
	url, err := pg.CreateDatabase(context.Background(), "gw")
	if err != nil {
		t.Fatal(err)
	}
	db := newDatabase(t, url, "us-east")
	key, _ := db.createKey(t, "shop-a")
	db.store.Close()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, withoutRedis(databaseYAML("us-east", up.URL)), "RATELIMIT_DATABASE_URL="+url)
	if resp, _ := call(t, "GET", p.admin+"/readyz", ""); resp.StatusCode != 503 {
		t.Fatalf("/readyz %d with the database down at start, want 503", resp.StatusCode)
	}
	resp, body := call(t, "POST", p.url+"/orders", key)
	checkProblem(t, resp, body, 503)

	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.waitReady(t, 15*time.Second)
	if resp, body := call(t, "POST", p.url+"/orders", key); resp.StatusCode != 200 {
		t.Fatalf("after the database came back: %d %s", resp.StatusCode, body)
	}
}

// TestProcessHeartbeats: gateways of a region count each other through heartbeats, and a
// gateway that stops is removed at once.
func TestProcessHeartbeats(t *testing.T) {
	up := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	cfg := strings.Replace(withoutRedis(databaseYAML("us-east", up.URL)), "reload_interval: 1s", "reload_interval: 300ms", 1)
	a := startProc(t, cfg, "RATELIMIT_DATABASE_URL="+db.url)
	b := startProc(t, cfg, "RATELIMIT_DATABASE_URL="+db.url)
	instances := func(p *proc) float64 {
		return scrapeURL(t, p.admin).sum("ratelimit_gateway_instances", "region", "us-east")
	}
	waitFor(t, 10*time.Second, "two live instances", func() bool { return instances(a) == 2 && instances(b) == 2 })
	if err := b.stop(t); err != nil {
		t.Fatalf("gateway b exited with %v", err)
	}
	took := waitFor(t, 10*time.Second, "one live instance", func() bool { return instances(a) == 1 })
	t.Logf("stopped instance gone from the count after %s", took.Round(time.Millisecond))
	list, err := db.store.Instances(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Errorf("gateway_instance rows %v, want only the running gateway", list)
	}
}

// TestProcessGracefulDrain: on SIGTERM an in-flight request completes and the process
// exits 0.
func TestProcessGracefulDrain(t *testing.T) {
	started := make(chan struct{}, 1)
	upstream := newSignalUpstream(t, started, 1500*time.Millisecond)
	p := startProc(t, withoutRedis(standaloneYAML("us-east", upstream, 5, 1)))
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", p.url+"/orders", nil)
		req.Header.Set("X-Api-Key", "key-shop-a")
		resp, err := testClient.Do(req)
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("request never reached the upstream")
	}
	stopErr := make(chan error, 1)
	go func() { stopErr <- p.stop(t) }()
	if status := <-done; status != 200 {
		t.Errorf("in-flight request during drain: %d, want 200", status)
	}
	if err := <-stopErr; err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
}

// newSignalUpstream answers 200 after delay, and signals started when a request arrives.
func newSignalUpstream(t *testing.T, started chan<- struct{}, delay time.Duration) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		time.Sleep(delay)
		w.WriteHeader(200)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestProcessBadConfig: a bad file stops the binary at once with one clear line.
func TestProcessBadConfig(t *testing.T) {
	bin := gatewayBinary(t)
	out, err := exec.Command(bin, "--config", "testdata/bad/unknown-nested-key.yaml").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1; output %s", err, out)
	}
	want := `gateway: config testdata/bad/unknown-nested-key.yaml: redis.timeuot: unknown key "timeuot"` + "\n"
	if string(out) != want {
		t.Fatalf("output %q, want %q", out, want)
	}
}
