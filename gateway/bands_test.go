package gateway

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// bandsConfig is the article's scenario where shop-a's create-order rule is 2/s burst 4
// with a band "minute" of 10 per minute, and an export route whose cost (X-Cost, at most
// 50) can exceed that band's capacity but not the rule's.
func bandsConfig(upstream, redisURL string) Config {
	cfg := articleConfig("us-east", upstream, redisURL)
	cfg.RLSListen = "127.0.0.1:0"
	cfg.Redis.Timeout = 500 * time.Millisecond // a loaded test machine must not fall back
	cfg.Routes = append(cfg.Routes,
		RouteConfig{ID: "export", Match: "POST /export", Upstream: upstream, Cost: CostConfig{Header: "X-Cost", Max: 50}})
	minute := []BandConfig{{Name: "minute", Capacity: 10, Per: "1m"}}
	cfg.Tenants[0].Rules = []TenantRuleConfig{
		{Route: "create-order", Capacity: 4, RefillPerSecond: 2, Bands: minute},
		{Route: "export", Capacity: 20, RefillPerSecond: 1, Bands: minute},
	}
	return cfg
}

// bandAnswer is what a door said about one request: allowed, and the rate headers.
type bandAnswer struct {
	allowed bool
	hdr     http.Header
	status  *rlsv3.RateLimitResponse_DescriptorStatus // RLS only
}

// bandDoors ask each door of gw for one create-order request of shop-a.
func bandDoors(t *testing.T, gw *inProcess) map[string]func() bandAnswer {
	t.Helper()
	rls := rlsClient(t, gw.g)
	httpAnswer := func(resp *http.Response, body []byte) bandAnswer {
		t.Helper()
		switch resp.StatusCode {
		case 200:
			return bandAnswer{allowed: true, hdr: resp.Header}
		case 429:
			return bandAnswer{hdr: resp.Header}
		}
		t.Fatalf("status %d: %s", resp.StatusCode, body)
		return bandAnswer{}
	}
	return map[string]func() bandAnswer{
		"proxy": func() bandAnswer { return httpAnswer(call(t, "POST", gw.srv.URL+"/orders", "key-shop-a")) },
		"check": func() bandAnswer {
			return httpAnswer(call(t, "GET", gw.srv.URL+"/v1/check", "key-shop-a", "X-Original-Method", "POST", "X-Original-URI", "/orders"))
		},
		"rls": func() bandAnswer {
			r := shouldRateLimit(t, rls, 0, desc("api_key", "key-shop-a", "route", "create-order"))
			h := http.Header{}
			for _, hv := range r.ResponseHeadersToAdd {
				h.Add(hv.Key, hv.Value)
			}
			return bandAnswer{allowed: r.OverallCode == rlsOK, hdr: h, status: r.Statuses[0]}
		},
	}
}

// checkBandAnswer asserts the headers every answer of a rule with bands carries: the
// policy lists both bands, RateLimit names band (when not ""), X-RateLimit-Reset equals
// its t, and a refusal's Retry-After equals t too; and over RLS, the status describes the
// reported band.
func checkBandAnswer(t *testing.T, step string, a bandAnswer, allowed bool, band string) (reset int) {
	t.Helper()
	if a.allowed != allowed {
		t.Fatalf("%s: allowed %v, want %v (headers %v)", step, a.allowed, allowed, a.hdr)
	}
	if got, want := a.hdr.Get("RateLimit-Policy"), `"rate";q=4;w=2, "minute";q=10;w=60`; got != want {
		t.Fatalf("%s: RateLimit-Policy %q, want %q", step, got, want)
	}
	rl := a.hdr.Get("RateLimit")
	name, rest, _ := strings.Cut(rl, ";")
	if band != "" && name != `"`+band+`"` {
		t.Errorf("%s: RateLimit %q, want band %q", step, rl, band)
	}
	_, tval, _ := strings.Cut(rest, ";t=")
	resetHdr := a.hdr.Get("X-RateLimit-Reset")
	if resetHdr == "" || resetHdr != tval {
		t.Errorf("%s: X-RateLimit-Reset %q, want RateLimit's t (%q)", step, resetHdr, rl)
	}
	limit := map[string]string{`"rate"`: "4", `"minute"`: "10"}[name]
	if got := a.hdr.Get("X-RateLimit-Limit"); got != limit {
		t.Errorf("%s: X-RateLimit-Limit %q, want %q (the capacity of %s)", step, got, limit, name)
	}
	if r, _ := strings.CutPrefix(rest, "r="); !strings.HasPrefix(r, a.hdr.Get("X-RateLimit-Remaining")+";") {
		t.Errorf("%s: X-RateLimit-Remaining %q, RateLimit %q", step, a.hdr.Get("X-RateLimit-Remaining"), rl)
	}
	if ra := a.hdr.Get("Retry-After"); allowed && ra != "" || !allowed && ra != tval {
		t.Errorf("%s: Retry-After %q, RateLimit %q", step, ra, rl)
	}
	if st := a.status; st != nil {
		wantPer := map[string]string{`"rate"`: "2/SECOND", `"minute"`: "10/MINUTE"}[name]
		if st.CurrentLimit == nil || strconv.Itoa(int(st.CurrentLimit.RequestsPerUnit))+"/"+st.CurrentLimit.Unit.String() != wantPer {
			t.Errorf("%s: current_limit %v, want %s (band %s)", step, st.CurrentLimit, wantPer, name)
		}
		if strconv.Itoa(int(st.LimitRemaining)) != a.hdr.Get("X-RateLimit-Remaining") {
			t.Errorf("%s: limit_remaining %d, X-RateLimit-Remaining %q", step, st.LimitRemaining, a.hdr.Get("X-RateLimit-Remaining"))
		}
		if d := st.GetDurationUntilReset().AsDuration(); strconv.FormatInt(ceilSeconds(d), 10) != tval && !(tval == "1" && d < time.Second) {
			t.Errorf("%s: duration_until_reset %v, RateLimit %q", step, d, rl)
		}
	}
	n, _ := strconv.Atoi(tval)
	return n
}

// TestBandsEveryDoor walks one client through a rule of 2/s burst 4 with a band of 10 a
// minute at each door, on the standalone limiter with a fake clock: the burst binds first
// (429 from "rate", Retry-After 1), then, after 10 requests in 4 seconds, the minute band
// (429 naming "minute" with its own Retry-After); an allowed request that leaves the
// minute band closest to empty reports it.
func TestBandsEveryDoor(t *testing.T) {
	up := newUpstream(t, 0)
	for _, door := range []string{"proxy", "check", "rls"} {
		t.Run(door, func(t *testing.T) {
			clock := newFakeClock()
			gw := newInProcess(t, bandsConfig(up.URL, ""))
			local, err := limiter.NewLocal(limiter.LocalOptions{Region: "us-east", Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			gw.g.lim = local // the same limiter a standalone gateway has, on the test's clock
			ask := bandDoors(t, gw)[door]
			for i := range 4 {
				checkBandAnswer(t, "burst "+strconv.Itoa(i+1), ask(), true, "")
			}
			if rt := checkBandAnswer(t, "burst spent", ask(), false, "rate"); rt != 1 {
				t.Errorf("burst spent: t=%d, want 1 (one token in 0.5 s)", rt)
			}
			// 2 more a second: 6 more in 3 s, 10 in all, which empties the minute band.
			for s := 1; s <= 3; s++ {
				clock.Advance(time.Second)
				checkBandAnswer(t, "second "+strconv.Itoa(s)+" #1", ask(), true, "")
				checkBandAnswer(t, "second "+strconv.Itoa(s)+" #2", ask(), true, "")
			}
			clock.Advance(time.Second)
			if rt := checkBandAnswer(t, "minute spent", ask(), false, "minute"); rt < 2 || rt > 6 {
				t.Errorf("minute spent: Retry-After %d, want the minute band's (about 2 s: 2/3 of a token there, one every 6 s)", rt)
			}
			// The burst is full again, the minute band almost empty: it is reported.
			clock.Advance(10 * time.Second)
			a := ask()
			if rt := checkBandAnswer(t, "minute closest", a, true, "minute"); rt < 40 {
				t.Errorf("minute closest: t=%d, want the minute band's time to refill (about 52 s)", rt)
			}
			if got := a.hdr.Get("X-RateLimit-Remaining"); got != "1" {
				t.Errorf("minute closest: X-RateLimit-Remaining %q, want 1", got)
			}
		})
	}
}

// TestBandsRedisProxy is the same walk on the shared bucket in Redis (whose clock is
// Redis's TIME, so the test paces itself on the wall clock): the burst refuses first,
// then after 10 admitted requests the minute band does.
func TestBandsRedisProxy(t *testing.T) {
	up := newUpstream(t, 0)
	gw := newInProcess(t, bandsConfig(up.URL, testenv.RedisURL(testenv.Redis(t))))
	ask := bandDoors(t, gw)["proxy"]
	allowed, rateRefusals := 0, 0
	deadline := time.Now().Add(15 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal by the minute band after %d admitted requests", allowed)
		}
		a := ask()
		if a.allowed {
			allowed++
			checkBandAnswer(t, "allowed "+strconv.Itoa(allowed), a, true, "")
			continue
		}
		if strings.HasPrefix(a.hdr.Get("RateLimit"), `"minute"`) {
			checkBandAnswer(t, "minute spent", a, false, "minute")
			break
		}
		rateRefusals++
		checkBandAnswer(t, "burst spent", a, false, "rate")
		if allowed < 4 {
			t.Fatalf("refused after %d requests, want a burst of 4", allowed)
		}
		time.Sleep(500 * time.Millisecond) // pacing: one token of the burst's refill
	}
	// 10 a minute, plus what refilled while the test ran (one every 6 s).
	if allowed < 10 || allowed > 12 || rateRefusals == 0 {
		t.Errorf("%d admitted, %d refused by the burst; want 10 (or a little more) and the burst first", allowed, rateRefusals)
	}
	s := scrapeURL(t, gw.admin.URL)
	if got := s.sum("ratelimit_requests_total", "route", "create-order", "interface", "proxy", "decision", "allowed", "source", "redis"); got != float64(allowed) {
		t.Errorf("allowed %v, want %d", got, allowed)
	}
}

// TestBandsCostAboveBand: a cost that fits the rule's capacity (20) but not the minute
// band's (10) is refused at every HTTP door and over RLS, naming the band, and takes
// nothing: a cost that fits still passes.
func TestBandsCostAboveBand(t *testing.T) {
	up := newUpstream(t, 0)
	gw := newInProcess(t, bandsConfig(up.URL, ""))
	resp, body := call(t, "POST", gw.srv.URL+"/export", "key-shop-a", "X-Cost", "15")
	if resp.StatusCode != 429 {
		t.Fatalf("cost 15 over a band of 10: %d %s", resp.StatusCode, body)
	}
	checkProblem(t, resp, body, 429)
	h := resp.Header
	if rl := h.Get("RateLimit"); !strings.HasPrefix(rl, `"minute";r=0;t=`) || h.Get("X-RateLimit-Limit") != "10" {
		t.Errorf("cost over the minute band: RateLimit %q, X-RateLimit-Limit %q; want the minute band", rl, h.Get("X-RateLimit-Limit"))
	}
	if got, want := h.Get("RateLimit-Policy"), `"rate";q=20;w=20, "minute";q=10;w=60`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if h.Get("Retry-After") == "" || h.Get("Retry-After") != h.Get("X-RateLimit-Reset") {
		t.Errorf("Retry-After %q, X-RateLimit-Reset %q", h.Get("Retry-After"), h.Get("X-RateLimit-Reset"))
	}
	resp, body = call(t, "GET", gw.srv.URL+"/v1/check", "key-shop-a", "X-Original-Method", "POST", "X-Original-URI", "/export", "X-Cost", "11")
	if resp.StatusCode != 429 || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"minute"`) {
		t.Fatalf("check, cost 11: %d %q %s", resp.StatusCode, resp.Header.Get("RateLimit"), body)
	}
	r := shouldRateLimit(t, rlsClient(t, gw.g), 12, desc("api_key", "key-shop-a", "route", "export"))
	if r.OverallCode != rlsOver || !strings.HasPrefix(respHeader(r, "Ratelimit"), `"minute"`) {
		t.Fatalf("rls, hits 12: %v %q", r.OverallCode, respHeader(r, "Ratelimit"))
	}
	if resp, body := call(t, "POST", gw.srv.URL+"/export", "key-shop-a", "X-Cost", "10"); resp.StatusCode != 200 {
		t.Fatalf("cost 10, the band's capacity: %d %s", resp.StatusCode, body)
	}
	s := scrapeURL(t, gw.admin.URL)
	if got := s.sum("ratelimit_requests_total", "route", "export", "decision", "throttled", "source", "none"); got != 3 {
		t.Errorf("throttled by no source %v, want 3", got)
	}
}

// TestRLSLimitOverrideRefused: a descriptor with Envoy's limit override is answered
// OVER_LIMIT and takes nothing, whether its rule has bands or not; the other
// descriptors of the request are decided as usual.
func TestRLSLimitOverrideRefused(t *testing.T) {
	up := newUpstream(t, 0)
	gw := newInProcess(t, bandsConfig(up.URL, ""))
	c := rlsClient(t, gw.g)
	for _, route := range []string{"create-order", "get-order"} {
		over := desc("api_key", "key-shop-a", "route", route)
		over.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_SECOND}
		r := shouldRateLimit(t, c, 0, over, desc("api_key", "key-shop-a", "route", "get-order"))
		if r.OverallCode != rlsOver || r.Statuses[0].Code != rlsOver || r.Statuses[1].Code != rlsOK {
			t.Fatalf("%s with a limit override: overall %v, statuses %v", route, r.OverallCode, r.Statuses)
		}
	}
	// Nothing was taken from create-order's burst of 4.
	for i := range 4 {
		if resp, body := call(t, "POST", gw.srv.URL+"/orders", "key-shop-a"); resp.StatusCode != 200 {
			t.Fatalf("request %d after the refused overrides: %d %s", i+1, resp.StatusCode, body)
		}
	}
}

// TestUpstreamRateHeadersStripped: whatever rate-limit headers the upstream sends, under
// any spelling (X-RateLimit-Reset, '_' for '-'), the client reads the gateway's only.
func TestUpstreamRateHeadersStripped(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		for _, name := range []string{"X-RateLimit-Reset", "X-RateLimit-Limit", "RateLimit-Policy", "RateLimit", "RateLimit-Reset"} {
			h[name] = []string{"999"}
		}
		h["x-ratelimit-reset"] = []string{"998"} // not canonical: written as is
		h["X_RateLimit_Reset"] = []string{"997"}
		h["X_Ratelimit_Remaining"] = []string{"996"}
		w.WriteHeader(200)
	}))
	t.Cleanup(up.Close)
	gw := newInProcess(t, articleConfig("us-east", up.URL, ""))
	resp, body := call(t, "POST", gw.srv.URL+"/orders", "key-shop-a")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	want := map[string]string{
		"X-Ratelimit-Limit": "2", "X-Ratelimit-Remaining": "1", "X-Ratelimit-Reset": "2",
		"Ratelimit-Policy": `"rate";q=2;w=4`, "Ratelimit": `"rate";r=1;t=2`,
	}
	for name, v := range resp.Header {
		n := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		if !strings.HasPrefix(n, "ratelimit") && !strings.HasPrefix(n, "x-ratelimit-") {
			continue
		}
		if len(v) != 1 || v[0] != want[name] {
			t.Errorf("%s: %q, want the gateway's %q only", name, v, want[name])
		}
	}
	for name := range want {
		if resp.Header.Get(name) == "" {
			t.Errorf("%s missing", name)
		}
	}
}
