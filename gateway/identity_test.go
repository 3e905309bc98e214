package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Issue 21, item 1: every door computes one canonical identity (route, tenant, value)
// before any bucket is chosen. These tests send the spellings of one route and one
// value that escaped their rule, each at the lowest level that shows it.

// checkReq is one /v1/check request in nginx's style (X-Original-*).
func checkReq(g *Gateway, method, uri string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", checkPath, nil)
	r.Header["X-Api-Key"] = []string{"key-shop-a"}
	r.Header["X-Original-Method"] = []string{method}
	r.Header["X-Original-Uri"] = []string{uri}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header[hdr[i]] = append(r.Header[hdr[i]], hdr[i+1])
	}
	w := httptest.NewRecorder()
	g.Handler().ServeHTTP(w, r)
	return w
}

// TestCheckRouteSpellings: the spellings of POST /orders at the check door are
// decided under create-order's rule (capacity 2, X-RateLimit-Limit 2), never under the
// "*" rule (20), or refused. An application that routes like Express (case-insensitive,
// optional trailing slash) or like a servlet container (;params stripped) runs each of
// them as create-order.
func TestCheckRouteSpellings(t *testing.T) {
	cfg := checkConfig("http://127.0.0.1:1")
	cfg.Tenants[0].Rules[0].Capacity = 100 // room for every spelling
	g, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, uri := range []string{"/orders", "/Orders", "/orders/", "/ORDERS/", "/orders;jsessionid=1", "/%6Frders", "/orders?x=1"} {
		w := checkReq(g, "POST", uri)
		if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "100" {
			t.Errorf("POST %s: %d with X-RateLimit-Limit %q, want 200 under create-order (100)", uri, w.Code, w.Header().Get("X-RateLimit-Limit"))
		}
	}
	for _, uri := range []string{"/orders#frag", "/x/%2e%2e/orders", "/x/../orders", "/orders%2Fx", "/x/%2E%2E/orders", "//orders", "/orders/./", "/orders%00"} {
		if w := checkReq(g, "POST", uri); w.Code != 400 {
			t.Errorf("POST %s: %d with X-RateLimit-Limit %q, want 400 (a spelling the routing rules refuse)", uri, w.Code, w.Header().Get("X-RateLimit-Limit"))
		}
	}
	// No route matches: refused (404), never decided under "*" unless configured.
	if w := checkReq(g, "DELETE", "/anything"); w.Code != 404 {
		t.Errorf("DELETE /anything: %d with X-RateLimit-Limit %q, want 404", w.Code, w.Header().Get("X-RateLimit-Limit"))
	}
}

// TestProxyRouteSpellings: the proxy door matches the same spellings to the same
// routes as the check door, and forwards the path as the client sent it.
func TestProxyRouteSpellings(t *testing.T) {
	up := newUpstream(t, 0)
	gw := newInProcess(t, articleConfig("us-east", up.URL, ""))
	for i, tc := range []struct {
		path   string
		status int
	}{{"/Orders", 200}, {"/ORDERS/", 200}, {"/orders/", 429}} {
		resp, body := call(t, "POST", gw.srv.URL+tc.path, "key-shop-a")
		if resp.StatusCode != tc.status || resp.Header.Get("X-RateLimit-Limit") != "2" {
			t.Fatalf("request %d POST %s: %d %s, want %d under create-order (X-RateLimit-Limit 2)", i+1, tc.path, resp.StatusCode, body, tc.status)
		}
	}
	addr := strings.TrimPrefix(gw.srv.URL, "http://")
	for _, target := range []string{"/orders#frag", "/x/%2e%2e/orders", "/orders%2Fx"} {
		req := "POST " + target + " HTTP/1.1\r\nHost: x\r\nX-Api-Key: key-shop-a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
		if got := rawRequest(t, addr, req); got != 400 {
			t.Errorf("POST %s through the proxy: %d, want 400", target, got)
		}
	}
}

// valueConfig: shop-a may search 1 per X-User value.
func valueConfig() Config {
	cfg := checkConfig("http://127.0.0.1:1")
	cfg.RLSListen = "127.0.0.1:0"
	return cfg
}

// TestCheckValueSpellings: spellings of one limit_by value map to one bucket or are
// refused; a list-valued or doubled header never gets a bucket of its own.
func TestCheckValueSpellings(t *testing.T) {
	g, err := New(valueConfig(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if w := checkReq(g, "GET", "/search", "X-User", "acme"); w.Code != 200 {
		t.Fatalf("acme: %d, want 200", w.Code)
	}
	for _, tc := range []struct {
		name string
		hdr  []string
		want int
	}{
		{"acme again", []string{"X-User", "acme"}, 429},
		{"padded", []string{"X-User", " acme\t"}, 429},
		{"list", []string{"X-User", "acme, x"}, 400},
		{"trailing comma", []string{"X-User", "acme,"}, 400},
		{"parameter", []string{"X-User", "acme;x"}, 400},
		{"quoted", []string{"X-User", `"acme"`}, 400},
		{"NEL after (a C1 control)", []string{"X-User", "acme\u0085"}, 400},
		{"NBSP after", []string{"X-User", "acme\u00a0"}, 400},
		{"em space inside", []string{"X-User", "ac\u2003me"}, 400},
		{"repeated", []string{"X-User", "acme", "X-User", "other"}, 400},
		{"underscore spelling beside", []string{"X-User", "fresh-1", "X_User", "acme"}, 400},
		{"lower-case name beside", []string{"X-User", "fresh-2", "x-user", "acme"}, 400},
	} {
		if w := checkReq(g, "GET", "/search", tc.hdr...); w.Code != tc.want {
			t.Errorf("%s %q: %d, want %d", tc.name, tc.hdr, w.Code, tc.want)
		}
	}
}

// TestRLSValueAndRouteSpellings: the RLS door reads values by the same rule, and a route
// entry it does not know (or none) is refused, not decided under "*".
func TestRLSValueAndRouteSpellings(t *testing.T) {
	cfg := rlsConfig("http://127.0.0.1:1", "")
	cfg.Routes = append(cfg.Routes, RouteConfig{ID: "users", Match: "GET /users", Upstream: "http://127.0.0.1:1", LimitBy: "descriptor:user"})
	cfg.Tenants[0].Rules = append(cfg.Tenants[0].Rules, TenantRuleConfig{Route: "users", Capacity: 1, RefillPerSecond: 0.01})
	g, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := rlsClient(t, g)
	for _, step := range []struct {
		value string
		want  rlsv3.RateLimitResponse_Code
	}{
		{"acme", rlsOK}, {"acme", rlsOver}, {" acme", rlsOver}, {"acme ", rlsOver},
		{"acme,", rlsOver}, {"acme;x", rlsOver}, {"acme, x", rlsOver}, {"", rlsOver},
	} {
		r := shouldRateLimit(t, c, 0, desc("api_key", "key-shop-a", "route", "users", "user", step.value))
		if r.OverallCode != step.want {
			t.Errorf("user %q: %v, want %v", step.value, r.OverallCode, step.want)
		}
	}
	for _, d := range []struct {
		name  string
		entry []string
	}{
		{"unknown route id", []string{"api_key", "key-shop-a", "route", "Create-Order"}},
		{"no route entry", []string{"api_key", "key-shop-a"}},
	} {
		r := shouldRateLimit(t, c, 0, desc(d.entry...))
		if r.OverallCode != rlsOver || len(r.ResponseHeadersToAdd) != 0 {
			t.Errorf("%s: %v headers %v, want OVER_LIMIT (refused, not the * rule)", d.name, r.OverallCode, r.ResponseHeadersToAdd)
		}
	}
	// "*" named by the caller is the * rule.
	if r := shouldRateLimit(t, c, 0, desc("api_key", "key-shop-a", "route", "*")); r.OverallCode != rlsOK || respHeader(r, "X-Ratelimit-Limit") != "20" {
		t.Errorf("route *: %v limit %q, want OK under the * rule (20)", r.OverallCode, respHeader(r, "X-Ratelimit-Limit"))
	}
}

// TestProxyHidesUpstreamRateHeaders: every RateLimit* and X-RateLimit-* header an
// upstream sends is dropped; the client sees only the gateway's.
func TestProxyHidesUpstreamRateHeaders(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Reset", "X-RateLimit-Used", "RateLimit-Limit", "RateLimit-Reset", "RateLimit-Remaining", "Ratelimit-Policy"} {
			w.Header().Set(h, "999")
		}
	}))
	defer up.Close()
	gw := newInProcess(t, articleConfig("us-east", up.URL, ""))
	resp, _ := call(t, "GET", gw.srv.URL+"/orders/1", "key-shop-a")
	for name, v := range resp.Header {
		lower := strings.ToLower(name)
		if (strings.HasPrefix(lower, "ratelimit") || strings.HasPrefix(lower, "x-ratelimit")) && strings.Contains(strings.Join(v, ","), "999") {
			t.Errorf("the upstream's %s: %q reached the client", name, v)
		}
	}
}
