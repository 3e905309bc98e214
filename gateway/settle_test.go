package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// usageUpstream answers 200 with X-Usage-Tokens set to the request's X-Test-Usage (none:
// no header at all), as an LLM API reports the tokens a request used.
func usageUpstream(t testing.TB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.Header.Get("X-Test-Usage"); u != "none" {
			w.Header().Set("X-Usage-Tokens", u)
		}
		w.Header().Set("X-RateLimit-Limit", "999999") // stripped as always
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// settleConfig: route chat (estimate 1, the real cost in X-Usage-Tokens, max 100); one
// tenant per case, so that each has its own bucket.
func settleConfig(upstream, redisURL string) Config {
	cfg := Config{
		Region:      "us-east",
		Redis:       RedisConfig{URL: redisURL},
		DefaultRule: RuleConfig{Capacity: 10, RefillPerSecond: 0.01},
		Routes: []RouteConfig{
			{ID: "chat", Match: "POST /chat", Upstream: upstream, Cost: CostConfig{Max: 100, ResponseHeader: "x-usage-tokens"}},
		},
	}
	if redisURL != "" {
		cfg.Redis.Timeout = 500 * time.Millisecond // a loaded test machine must not fall back
	}
	for _, tc := range []struct {
		id     string
		refill float64
		shadow bool
	}{{"debt", 1, false}, {"zero", 0.01, false}, {"bad", 0.01, false}, {"none", 0.01, false}, {"capped", 0.01, false}, {"shadow", 0.01, true}} {
		cfg.Tenants = append(cfg.Tenants, TenantConfig{ID: tc.id, Keys: []KeyConfig{{Secret: "key-" + tc.id}},
			Rules: []TenantRuleConfig{{Route: "chat", Capacity: 10, RefillPerSecond: tc.refill, Shadow: tc.shadow}}})
	}
	return cfg
}

// settles is the sum of ratelimit_settles_total{route=chat} with the extra labels.
func settles(t testing.TB, gw *inProcess, match ...string) float64 {
	t.Helper()
	return max(scrapeURL(t, gw.admin.URL).sum("ratelimit_settles_total", append([]string{"route", "chat"}, match...)...), 0)
}

// waitSettles waits (bounded) until ratelimit_settles_total{route=chat, outcome} is n.
func waitSettles(t testing.TB, gw *inProcess, outcome string, n float64) {
	t.Helper()
	waitFor(t, 5*time.Second, outcome+" settles", func() bool { return settles(t, gw, "outcome", outcome) == n })
}

func chat(t *testing.T, gw *inProcess, tenant, usage string) *http.Response {
	t.Helper()
	resp, _ := call(t, "POST", gw.srv.URL+"/chat", "key-"+tenant, "X-Test-Usage", usage)
	return resp
}

// TestResponseCostSettles: a request admitted on its estimate (1) is settled at the
// real cost its response states: 50 on a bucket of 10 refilling 1/s goes 40 into debt,
// so the next request waits about 41 s (not 0, and not the 11 s a debt clipped at -10
// would give); 0 gives the estimate back; a malformed or missing value charges nothing
// more; a value above cost.max is charged as max.
func TestResponseCostSettles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		redis bool
	}{{"local limiter", false}, {"redis", true}} {
		t.Run(tc.name, func(t *testing.T) {
			up := usageUpstream(t)
			var redisURL string
			if tc.redis {
				redisURL = testenv.RedisURL(testenv.Redis(t))
			}
			gw := newInProcess(t, settleConfig(up.URL, redisURL))

			resp := chat(t, gw, "debt", "50")
			if resp.StatusCode != 200 || resp.Header.Get("X-Usage-Tokens") != "50" || resp.Header.Get(hdrLimit) != "10" {
				t.Fatalf("first request: %d, X-Usage-Tokens %q, limit %q: want 200, the upstream's 50 passed through, the gateway's 10",
					resp.StatusCode, resp.Header.Get("X-Usage-Tokens"), resp.Header.Get(hdrLimit))
			}
			waitSettles(t, gw, "settled", 1)
			resp = chat(t, gw, "debt", "1")
			retry, _ := strconv.Atoi(resp.Header.Get(hdrRetryAfter))
			if resp.StatusCode != http.StatusTooManyRequests || retry < 39 || retry > 42 {
				t.Fatalf("after a real cost of 50: %d Retry-After %q, want 429 about 41 s (the debt)", resp.StatusCode, resp.Header.Get(hdrRetryAfter))
			}

			for _, c := range []struct {
				tenant, usage, outcome string
				second                 string // X-RateLimit-Remaining of the second request
			}{
				{"zero", "0", "settled", "9"}, // the estimate given back
				{"bad", "12a", "malformed", "8"},
				{"none", "none", "missing", "8"},
			} {
				before := settles(t, gw, "outcome", c.outcome)
				if r := chat(t, gw, c.tenant, c.usage); r.StatusCode != 200 || r.Header.Get(hdrRemaining) != "9" {
					t.Fatalf("%s: first %d remaining %q, want 200 9", c.tenant, r.StatusCode, r.Header.Get(hdrRemaining))
				}
				waitSettles(t, gw, c.outcome, before+1)
				if r := chat(t, gw, c.tenant, c.usage); r.StatusCode != 200 || r.Header.Get(hdrRemaining) != c.second {
					t.Fatalf("%s: second %d remaining %q, want 200 %s", c.tenant, r.StatusCode, r.Header.Get(hdrRemaining), c.second)
				}
				waitSettles(t, gw, c.outcome, before+2)
			}

			if r := chat(t, gw, "capped", "1000"); r.StatusCode != 200 {
				t.Fatalf("capped: %d, want 200", r.StatusCode)
			}
			waitSettles(t, gw, "capped", 1)
			if r := chat(t, gw, "capped", "1"); r.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("after a real cost charged as max 100: %d, want 429", r.StatusCode)
			}
		})
	}
}

// TestResponseCostNotSettled: a shadow rule's request and one let through because the
// limiter failed are not settled: nothing decided them, so nothing is charged after.
func TestResponseCostNotSettled(t *testing.T) {
	up := usageUpstream(t)
	gw := newInProcess(t, settleConfig(up.URL, testenv.RedisURL(testenv.Redis(t))))
	for range 2 {
		if r := chat(t, gw, "shadow", "50"); r.StatusCode != 200 || r.Header.Get(hdrLimit) != "" {
			t.Fatalf("shadow: %d limit %q, want 200 and no headers", r.StatusCode, r.Header.Get(hdrLimit))
		}
	}
	gw.g.lim = failingLimiter{}
	if r := chat(t, gw, "debt", "50"); r.StatusCode != 200 {
		t.Fatalf("fail open: %d, want 200", r.StatusCode)
	}
	gw.g.settler.close() // waits for any settle in flight
	if got := settles(t, gw); got != 0 {
		t.Fatalf("settles %v, want 0", got)
	}
}

// TestRLSDoneSettles: a descriptor marked quotaplane_phase=done (Envoy's
// apply_on_stream_done) charges its hits_addend whole, into debt, answering OK; the next
// decision waits for the debt. Above cost.max it is charged as max; an unknown key
// charges nothing.
func TestRLSDoneSettles(t *testing.T) {
	up := newUpstream(t, 0)
	cfg := rlsConfig(up.URL, testenv.RedisURL(testenv.Redis(t)))
	cfg.Routes = append(cfg.Routes, RouteConfig{ID: "llm", Match: "POST /llm", Upstream: up.URL, Cost: CostConfig{Max: 1000}})
	cfg.Tenants[0].Rules = append(cfg.Tenants[0].Rules, TenantRuleConfig{Route: "llm", Capacity: 10, RefillPerSecond: 1})
	gw := newInProcess(t, cfg)
	c := rlsClient(t, gw.g)

	d := desc("api_key", "key-shop-a", "route", "llm")
	if r := shouldRateLimit(t, c, 1, d); r.OverallCode != rlsOK || r.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("request phase: %v remaining %d, want OK 9", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
	done := desc("api_key", "key-shop-a", "route", "llm", "quotaplane_phase", "done")
	done.HitsAddend = wrapperspb.UInt64(50)
	if r := shouldRateLimit(t, c, 0, done); r.OverallCode != rlsOK {
		t.Fatalf("done phase: %v, want OK", r.OverallCode)
	}
	r := shouldRateLimit(t, c, 1, d)
	if wait := r.Statuses[0].DurationUntilReset.AsDuration(); r.OverallCode != rlsOver || wait < 40*time.Second || wait > 43*time.Second {
		t.Fatalf("after 50 charged: %v reset %v, want OVER_LIMIT about 42 s", r.OverallCode, wait)
	}

	exp := desc("api_key", "key-shop-a", "route", "export", "quotaplane_phase", "done")
	exp.HitsAddend = wrapperspb.UInt64(50) // cost.max 5
	if r := shouldRateLimit(t, c, 0, exp, desc("api_key", "wrong", "route", "export", "quotaplane_phase", "done")); r.OverallCode != rlsOK {
		t.Fatalf("done phase above max, and unknown key: %v, want OK", r.OverallCode)
	}
	if r := shouldRateLimit(t, c, 1, desc("api_key", "key-shop-a", "route", "export")); r.OverallCode != rlsOK || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("export after 5 charged: %v remaining %d, want OK 4", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
	s := scrapeURL(t, gw.admin.URL)
	for route, outcome := range map[string]string{"llm": "settled", "export": "capped"} {
		if got := s.sum("ratelimit_settles_total", "route", route, "interface", "rls", "outcome", outcome); got != 1 {
			t.Errorf("settles{route=%s,outcome=%s} = %v, want 1", route, outcome, got)
		}
	}
	if got := s.sum("ratelimit_requests_total", "route", "llm", "interface", "rls"); got != 2 {
		t.Errorf("llm decisions %v, want 2 (a done-phase descriptor is not a decision)", got)
	}

	bad := desc("api_key", "key-shop-a", "route", "llm", "quotaplane_phase", "request")
	if _, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{bad}}); err == nil {
		t.Fatal("quotaplane_phase=request: no error, want InvalidArgument")
	}
}

func TestRealCost(t *testing.T) {
	for _, tc := range []struct {
		vals    []string
		want    int64
		outcome settleOutcome
	}{
		{nil, 0, settleMissing},
		{[]string{"0"}, 0, settleSettled},
		{[]string{" 42 "}, 42, settleSettled},
		{[]string{"100"}, 100, settleSettled},
		{[]string{"101"}, 100, settleCapped},
		{[]string{"99999999999999999999999"}, 100, settleCapped},
		{[]string{""}, 0, settleMalformed},
		{[]string{"-1"}, 0, settleMalformed},
		{[]string{"+1"}, 0, settleMalformed},
		{[]string{"1.5"}, 0, settleMalformed},
		{[]string{"1 2"}, 0, settleMalformed},
		{[]string{"1", "2"}, 0, settleMalformed},
	} {
		if got, o := realCost(tc.vals, 100); got != tc.want || o != tc.outcome {
			t.Errorf("realCost(%q) = %d %s, want %d %s", tc.vals, got, settleOutcomeNames[o], tc.want, settleOutcomeNames[tc.outcome])
		}
	}
}

// blockingLimiter's Settle waits for its ctx (a Redis that does not answer) and counts.
type blockingLimiter struct {
	failingLimiter
	mu    sync.Mutex
	calls int
}

func (l *blockingLimiter) Settle(ctx context.Context, _ limiter.Request, _ int64) error {
	<-ctx.Done()
	l.mu.Lock()
	l.calls++
	l.mu.Unlock()
	return nil
}

// TestSettlerDrains: close waits for the settles in flight (each bounded by the
// settler's timeout), and a settle after close runs in its caller: none outlives it.
func TestSettlerDrains(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	lim := &blockingLimiter{}
	s := newSettler(20 * time.Millisecond)
	var done atomic.Int32
	for range 3 {
		s.settle(lim, limiter.Request{}, 1, func(error) { done.Add(1) })
	}
	s.close()
	if got := done.Load(); got != 3 {
		t.Fatalf("%d settles done after close, want 3", got)
	}
	s.settle(lim, limiter.Request{}, 1, func(error) { done.Add(1) })
	if got := done.Load(); got != 4 {
		t.Fatalf("a settle after close: %d done on return, want 4 (run in the caller)", got)
	}
}

// FuzzRealCost: a response's cost is never negative nor above max, and is settled only
// when it is exactly the digits the upstream sent.
func FuzzRealCost(f *testing.F) {
	for _, s := range []string{"0", "50", "101", "-1", "1e3", " 7\t", "００", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, o := realCost([]string{s}, 100)
		switch o {
		case settleSettled:
			if n < 0 || n > 100 || strconv.FormatInt(n, 10) != strings.TrimLeft(trimOWS(s), "0") && n != 0 {
				t.Fatalf("realCost(%q) = %d settled", s, n)
			}
		case settleCapped:
			if n != 100 {
				t.Fatalf("realCost(%q) = %d capped, want 100", s, n)
			}
		case settleMalformed:
			if n != 0 {
				t.Fatalf("realCost(%q) = %d malformed, want 0", s, n)
			}
		default:
			t.Fatalf("realCost(%q): outcome %s", s, settleOutcomeNames[o])
		}
	})
}

// TestRunDrainsSettles: Run returns only after the settles of the responses it served
// have run, and leaves no goroutine behind.
func TestRunDrainsSettles(t *testing.T) {
	up := usageUpstream(t)
	rp := testenv.Redis(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	lp, _ := testenv.FreePort()
	ap, _ := testenv.FreePort()
	cfg := settleConfig(up.URL, testenv.RedisURL(rp))
	cfg.Listen = fmt.Sprintf("127.0.0.1:%d", lp)
	cfg.AdminListen = fmt.Sprintf("127.0.0.1:%d", ap)
	reg := prometheus.NewRegistry()
	g, err := New(cfg, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- g.Run(ctx) }()
	waitFor(t, 10*time.Second, "ready", func() bool {
		resp, err := testClient.Get("http://" + cfg.AdminListen + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	resp, _ := call(t, "POST", "http://"+cfg.Listen+"/chat", "key-debt", "X-Test-Usage", "50")
	if resp.StatusCode != 200 {
		t.Fatalf("chat: %d, want 200", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	testClient.CloseIdleConnections()
	if got := testutil.ToFloat64(g.m.settles.WithLabelValues("chat", "proxy", "settled")); got != 1 {
		t.Fatalf("settled after Run returned: %v, want 1", got)
	}
}
