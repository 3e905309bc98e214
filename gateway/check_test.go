package gateway

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// checkConfig is the article's scenario with a cost-by-header route and a per-header route.
func checkConfig(upstream string) Config {
	cfg := articleConfig("us-east", upstream, "")
	cfg.Routes = append(cfg.Routes,
		RouteConfig{ID: "export", Match: "POST /export", Upstream: upstream, Cost: CostConfig{Header: "X-Cost", Max: 5}},
		RouteConfig{ID: "search", Match: "GET /search", Upstream: upstream, LimitBy: "header:X-User",
			PerValue: &PerValueConfig{Capacity: 1, RefillPerSecond: 0.01}},
	)
	cfg.Tenants[0].Rules = append(cfg.Tenants[0].Rules,
		TenantRuleConfig{Route: "export", Capacity: 10, RefillPerSecond: 0.01},
		TenantRuleConfig{Route: "search", Capacity: 3, RefillPerSecond: 0.01},
	)
	return cfg
}

// TestCheckEndpoint: /v1/check answers for nginx (X-Original-*) and Traefik
// (X-Forwarded-*) with the proxy's route matching and buckets, forwarding nothing.
func TestCheckEndpoint(t *testing.T) {
	up := newCountingUpstream(t)
	gw := newInProcess(t, checkConfig(up.URL))
	check := gw.srv.URL + "/v1/check"
	nginx := func(method, uri string) []string { return []string{"X-Original-Method", method, "X-Original-URI", uri} }
	traefik := func(method, uri string) []string {
		return []string{"X-Forwarded-Method", method, "X-Forwarded-Uri", uri}
	}
	for i, want := range []int{200, 200, 429} {
		hdr := nginx("POST", "/orders?x=1")
		if i == 1 {
			hdr = traefik("POST", "/orders")
		}
		resp, body := call(t, "GET", check, "key-shop-a", hdr...)
		if resp.StatusCode != want {
			t.Fatalf("call %d: %d %s, want %d", i+1, resp.StatusCode, body, want)
		}
		if resp.Header.Get("X-RateLimit-Limit") != "2" || resp.Header.Get("RateLimit") == "" {
			t.Errorf("call %d: rate headers missing: %v", i+1, resp.Header)
		}
		if want == 429 {
			if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || n < 1 {
				t.Errorf("429 with Retry-After %q", resp.Header.Get("Retry-After"))
			}
		} else if resp.Header.Get("X-Tenant-Id") != "shop-a" {
			t.Errorf("200 without X-Tenant-Id: %v", resp.Header)
		}
	}
	// The proxy shares the bucket that the check spent.
	if resp, _ := call(t, "POST", gw.srv.URL+"/orders", "key-shop-a"); resp.StatusCode != 429 {
		t.Fatalf("proxy after the check spent the bucket: %d", resp.StatusCode)
	}
	for _, tc := range []struct {
		name, key string
		hdr       []string
		status    int
	}{
		{"no key", "", nginx("POST", "/orders"), 401},
		{"unknown key", "nope", nginx("POST", "/orders"), 401},
		{"no original method", "key-shop-a", []string{"X-Original-URI", "/orders"}, 400},
		{"no original uri", "key-shop-a", []string{"X-Original-Method", "POST"}, 400},
		{"uri not a path", "key-shop-a", nginx("POST", "orders"), 400},
		{"cost missing", "key-shop-a", nginx("POST", "/export"), 400},
		{"cost zero", "key-shop-a", append(nginx("POST", "/export"), "X-Cost", "0"), 400},
		{"cost negative", "key-shop-a", append(nginx("POST", "/export"), "X-Cost", "-3"), 400},
		{"cost above the cap", "key-shop-a", append(nginx("POST", "/export"), "X-Cost", "6"), 400},
		{"cost not a number", "key-shop-a", append(nginx("POST", "/export"), "X-Cost", "2.5"), 400},
		{"two costs", "key-shop-a", append(nginx("POST", "/export"), "X-Cost", "1", "X-Cost", "1"), 400},
		{"cost 5 of 10", "key-shop-a", append(nginx("POST", "/export"), "X-Cost", "5"), 200},
		{"cost 5 of the 5 left", "key-shop-a", append(nginx("POST", "/export"), "X-Cost", "5"), 200},
		{"cost 1 of none left", "key-shop-a", append(nginx("POST", "/export"), "X-Cost", "1"), 429},
		{"per-user value missing", "key-shop-a", nginx("GET", "/search"), 400},
		{"per-user value too long", "key-shop-a", append(nginx("GET", "/search"), "X-User", strings.Repeat("u", 257)), 400},
		{"user a", "key-shop-a", append(nginx("GET", "/search"), "X-User", "a"), 200},
		{"user b has a bucket of its own", "key-shop-a", append(nginx("GET", "/search"), "X-User", "b"), 200},
		{"user a again", "key-shop-a", append(nginx("GET", "/search"), "X-User", "a"), 429},
		{"user c", "key-shop-a", append(nginx("GET", "/search"), "X-User", "c"), 200},
		{"user d: the route's 3 are spent", "key-shop-a", append(nginx("GET", "/search"), "X-User", "d"), 429},
		{"no route: refused", "key-shop-a", nginx("DELETE", "/anything"), 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := call(t, "GET", check, tc.key, tc.hdr...)
			if tc.status == 200 {
				if resp.StatusCode != 200 {
					t.Fatalf("status %d %s, want 200", resp.StatusCode, body)
				}
				return
			}
			checkProblem(t, resp, body, tc.status)
		})
	}
	if n := up.hits.Load(); n != 0 {
		t.Errorf("the check endpoint forwarded %d requests", n)
	}
	s := scrapeURL(t, gw.admin.URL)
	if got := s.sum("ratelimit_requests_total", "route", "create-order", "interface", "check", "decision", "allowed"); got != 2 {
		t.Errorf("check allowed on create-order %v, want 2", got)
	}
	if got := s.sum("ratelimit_requests_total", "route", "create-order", "interface", "check", "decision", "unauthenticated"); got != 2 {
		t.Errorf("check unauthenticated on create-order %v, want 2", got)
	}
	if got := s.sum("ratelimit_requests_total", "route", "*", "interface", "check"); got != 0 {
		t.Errorf("check decisions under the * rule %v, want none: routing.unmatched refuses", got)
	}
	if got := s.sum("ratelimit_unmatched_requests_total"); got != 1 {
		t.Errorf("unmatched %v, want 1", got)
	}
}

// TestCheckUnmatchedNamedRule: routing.unmatched names the rule an unmatched check
// request is decided under, "*" or a route id; the proxy still answers 404.
func TestCheckUnmatchedNamedRule(t *testing.T) {
	for _, tc := range []struct {
		unmatched, route, limit string
	}{{"*", "*", "20"}, {"create-order", "create-order", "2"}} {
		t.Run(tc.unmatched, func(t *testing.T) {
			up := newCountingUpstream(t)
			cfg := checkConfig(up.URL)
			cfg.Routing.Unmatched = tc.unmatched
			gw := newInProcess(t, cfg)
			w := checkReq(gw.g, "DELETE", "/anything")
			if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != tc.limit {
				t.Fatalf("unmatched check: %d limit %q, want 200 under %s (%s)", w.Code, w.Header().Get("X-RateLimit-Limit"), tc.route, tc.limit)
			}
			if got := scrapeURL(t, gw.admin.URL).sum("ratelimit_requests_total", "route", tc.route, "interface", "check", "decision", "allowed"); got != 1 {
				t.Errorf("check decisions under %s: %v, want 1", tc.route, got)
			}
			resp, body := call(t, "DELETE", gw.srv.URL+"/anything", "key-shop-a")
			checkProblem(t, resp, body, 404)
			if up.hits.Load() != 0 {
				t.Errorf("the proxy forwarded an unmatched request")
			}
		})
	}
}

// TestCheckEndpointDisabled: with check.disabled the path is routed like any other.
func TestCheckEndpointDisabled(t *testing.T) {
	up := newCountingUpstream(t)
	cfg := checkConfig(up.URL)
	cfg.Check.Disabled = true
	gw := newInProcess(t, cfg)
	resp, body := call(t, "GET", gw.srv.URL+"/v1/check", "key-shop-a", "X-Original-Method", "POST", "X-Original-URI", "/orders")
	checkProblem(t, resp, body, 404) // no route matches GET /v1/check
}

// TestProxyCostHeader: through the proxy, a missing or malformed cost is 400, never free.
func TestProxyCostHeader(t *testing.T) {
	up := newCountingUpstream(t)
	gw := newInProcess(t, checkConfig(up.URL))
	for _, tc := range []struct {
		cost   []string
		status int
	}{{nil, 400}, {[]string{"X-Cost", "abc"}, 400}, {[]string{"X-Cost", "9"}, 400}, {[]string{"X-Cost", "5"}, 200}, {[]string{"X-Cost", "5"}, 200}, {[]string{"X-Cost", "1"}, 429}} {
		resp, body := call(t, "POST", gw.srv.URL+"/export", "key-shop-a", tc.cost...)
		if tc.status == 200 {
			if resp.StatusCode != 200 {
				t.Fatalf("cost %v: %d %s", tc.cost, resp.StatusCode, body)
			}
			continue
		}
		checkProblem(t, resp, body, tc.status)
	}
	if n := up.hits.Load(); n != 2 {
		t.Errorf("upstream saw %d requests, want the 2 allowed", n)
	}
}

// TestNginxCheckEndpoint runs the shipped deploy/nginx/quotaplane.conf in a real nginx in
// front of a test upstream, asking the gateway's /v1/check: 200, 200, 429 with
// Retry-After at the client for capacity 2, 401 for an unknown key, and nothing reaches
// the upstream when throttled.
func TestNginxCheckEndpoint(t *testing.T) {
	var hits atomic.Int64
	var lastTenant atomic.Value
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		lastTenant.Store(r.Header.Get("X-Tenant-Id") + "|" + r.Header.Get("X-Api-Key"))
		// The application's own rate headers must not reach the client beside ours.
		for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Reset"} {
			w.Header().Set(h, "999")
		}
		_, _ = w.Write([]byte("app\n"))
	}))
	defer app.Close()
	gw := newInProcess(t, checkConfig(app.URL))
	conf, err := os.ReadFile("../deploy/nginx/quotaplane.conf")
	if err != nil {
		t.Fatal(err)
	}
	site := strings.NewReplacer(
		"127.0.0.1:8080", strings.TrimPrefix(gw.srv.URL, "http://"),
		"127.0.0.1:9000", strings.TrimPrefix(app.URL, "http://"),
		"127.0.0.1:8000", "127.0.0.1:{{PORT}}",
	).Replace(string(conf))
	ngx := testenv.Nginx(t, testenv.NginxOptions{HTTP: site})
	base := "http://" + ngx.Addr()

	for i, want := range []int{200, 200, 429} {
		// A client cannot move its request to another route's bucket with Traefik's headers.
		resp, body := call(t, "POST", base+"/orders", "key-shop-a", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/orders/1")
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d %s, want %d", i+1, resp.StatusCode, body, want)
		}
		if resp.Header.Get("X-RateLimit-Limit") != "2" || resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("X-RateLimit-Reset") == "" {
			t.Errorf("request %d: rate headers missing at the client: %v", i+1, resp.Header)
		}
		for name, v := range resp.Header {
			if strings.Contains(strings.Join(v, ","), "999") {
				t.Errorf("request %d: the application's %s: %q reached the client", i+1, name, v)
			}
		}
		if want == 429 {
			if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || n < 1 {
				t.Errorf("429 at the client with Retry-After %q", resp.Header.Get("Retry-After"))
			}
			if !strings.Contains(string(body), `"status":429`) {
				t.Errorf("429 body %s", body)
			}
		}
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("upstream saw %d requests, want 2: a throttled request reached it", n)
	}
	if got := lastTenant.Load(); got != "shop-a|" {
		t.Errorf("upstream saw tenant|key %q, want shop-a and no key", got)
	}
	resp, _ := call(t, "POST", base+"/orders", "nope")
	if resp.StatusCode != 401 {
		t.Fatalf("unknown key through nginx: %d, want 401", resp.StatusCode)
	}
	resp, _ = call(t, "POST", base+"/export", "key-shop-a", "X-Cost", "x")
	if resp.StatusCode != 400 {
		t.Fatalf("bad cost through nginx: %d, want 400", resp.StatusCode)
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("upstream saw %d requests, want still 2", n)
	}
}

// FuzzCheckRequest drives /v1/check with arbitrary original methods, URIs, costs and
// values: no panic, only the documented statuses (404 for no route), a fixed problem body on refusals, and
// 200 only with the rate headers of a decided request.
func FuzzCheckRequest(f *testing.F) {
	for _, s := range [][4]string{
		{"POST", "/orders", "", ""}, {"POST", "/export", "5", ""}, {"GET", "/search", "", "u"},
		{"", "/orders", "", ""}, {"POST", "orders", "", ""}, {"GET", "//x/../search?q=%zz", "", ""},
		{"POST", "/export", "-1", ""}, {"POST", "/export", "99999999999999999999", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], true)
	}
	cfg := checkConfig("http://127.0.0.1:1")
	cfg.Tenants[0].Rules[0].Capacity = 1 << 40 // never throttled here
	cfg.Tenants[0].Rules[0].RefillPerSecond = 1 << 30
	g, err := New(cfg, Options{})
	if err != nil {
		f.Fatal(err)
	}
	h := g.Handler()
	f.Fuzz(func(t *testing.T, method, uri, cost, user string, traefik bool) {
		r := httptest.NewRequest("GET", "/v1/check", nil)
		r.Header["X-Api-Key"] = []string{"key-shop-a"}
		if traefik {
			r.Header["X-Forwarded-Method"], r.Header["X-Forwarded-Uri"] = []string{method}, []string{uri}
		} else {
			r.Header["X-Original-Method"], r.Header["X-Original-Uri"] = []string{method}, []string{uri}
		}
		if cost != "" {
			r.Header["X-Cost"] = []string{cost}
		}
		if user != "" {
			r.Header["X-User"] = []string{user}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		switch w.Code {
		case 200:
			if w.Header().Get("X-Tenant-Id") != "shop-a" {
				t.Fatalf("200 without the tenant: %v", w.Header())
			}
		case 400, 404, 429: // 404: no route matches (routing.unmatched: refuse)
			if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("%d with Content-Type %q", w.Code, ct)
			}
		default:
			t.Fatalf("status %d for %q %q cost %q user %q", w.Code, method, uri, cost, user)
		}
	})
}
