package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// TestHostileClientSpellings attacks the three doors from outside the process, as a
// hostile client would: built gateway binaries on real Redis and PostgreSQL, the shipped
// deploy/nginx config in a real nginx in front of /v1/check, and an RLS client. Each
// spelling of one route, one API key and one limit_by value, and each forged
// X-Forwarded-For, must be decided under the route the application runs it as, or be
// refused. What each was decided under is read from the gateways' /metrics (which
// route's series moved) and from Redis (whether a per-value bucket was created), and
// logged as the table docs/proxies.md and the issue ask for.
func TestHostileClientSpellings(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Limit", "999")
		_, _ = io.WriteString(w, "app\n")
	}))
	defer app.Close()
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	for _, r := range []regions.Rule{
		{Tenant: "shop-a", Route: "create-order", Capacity: 1000, RefillPerSecond: 0.01},
		{Tenant: "shop-a", Route: "search", Capacity: 1000, RefillPerSecond: 0.01},
		{Tenant: "shop-a", Route: "users", Capacity: 1000, RefillPerSecond: 0.01},
	} {
		db.setRule(t, r)
	}
	key, _ := db.createKey(t, "shop-a")
	db.forgetRaises(t)
	rp := testenv.Redis(t)
	env := []string{"RATELIMIT_DATABASE_URL=" + db.url, "RATELIMIT_REDIS_URL=" + testenv.RedisURL(rp)}
	rlsPort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf(`region: us-east
mode: database
redis: {timeout: 250ms}
reload_interval: 1s
heartbeat_interval: 200ms
routes:
  - {id: create-order, match: "POST /orders", upstream: %[1]q}
  - {id: get-order, match: "GET /orders/{id}", upstream: %[1]q}
  - {id: search, match: "GET /search", upstream: %[1]q, limit_by: client_ip,
     per_value: {capacity: 2, refill_per_second: 0.001}}
  - {id: users, match: "GET /users", upstream: %[1]q, limit_by: "header:X-User", limit_by_case: fold}
`, app.URL)
	// The proxy and RLS doors face clients (no trusted proxy); the check door sits
	// behind nginx, which it trusts for X-Forwarded-For.
	direct := startProc(t, base+fmt.Sprintf("rls_listen: 127.0.0.1:%d\n", rlsPort), env...)
	behind := startProc(t, base+"trusted_proxies: [127.0.0.1]\n", env...)
	direct.waitReady(t, 15*time.Second)
	behind.waitReady(t, 15*time.Second)
	conf, err := os.ReadFile("../deploy/nginx/quotaplane.conf")
	if err != nil {
		t.Fatal(err)
	}
	ngx := testenv.Nginx(t, testenv.NginxOptions{HTTP: strings.NewReplacer(
		"127.0.0.1:8080", strings.TrimPrefix(behind.url, "http://"),
		"127.0.0.1:9000", strings.TrimPrefix(app.URL, "http://"),
		"127.0.0.1:8000", "127.0.0.1:{{PORT}}",
	).Replace(string(conf))})
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	defer rdb.Close()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", rlsPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)

	valueKeys := func() int {
		keys, err := rdb.Keys(context.Background(), "rl:{shop-a}:users:v:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	// observe runs send against a gateway and says what it was decided under.
	observe := func(admin, iface string, send func() string) string {
		before, keys := decisions(scrapeURL(t, admin), iface), valueKeys()
		answer := send()
		after := decisions(scrapeURL(t, admin), iface)
		var moved []string
		for k, v := range after {
			if v > before[k] {
				moved = append(moved, k)
			}
		}
		sort.Strings(moved)
		under := "refused"
		if len(moved) > 0 {
			under = strings.Join(moved, "+")
		}
		if n := valueKeys() - keys; n > 0 {
			under += fmt.Sprintf(" (+%d value bucket)", n)
		}
		return answer + " " + under
	}
	hdr := func(kv ...string) [][2]string {
		var h [][2]string
		for i := 0; i+1 < len(kv); i += 2 {
			h = append(h, [2]string{kv[i], kv[i+1]})
		}
		return h
	}
	withKey := func(h ...[2]string) [][2]string { return append([][2]string{{"X-Api-Key", key}}, h...) }

	type step struct {
		name, method, target string
		header               [][2]string
		want                 string // the decision's prefix: "200 create-order/allowed", "400 refused", ...
	}
	routeSteps := func() []step {
		var s []step
		for _, tc := range []struct{ target, want string }{
			{"/orders", "create-order/allowed"}, {"/Orders", "create-order/allowed"},
			{"/ORDERS/", "create-order/allowed"}, {"/orders/", "create-order/allowed"},
			{"/orders;jsessionid=1", "create-order/allowed"}, {"/%6Frders", "create-order/allowed"},
			{"/orders?x=1", "create-order/allowed"}, {"/orders#frag", "refused"},
			{"/orders%2F", "refused"}, {"/x/%2e%2e/orders", "refused"}, {"/x/../orders", "refused"},
			{"/./orders", "refused"}, {"//orders", "refused"}, {"/nowhere", "refused"},
		} {
			s = append(s, step{"route " + tc.target, "POST", tc.target, withKey(), tc.want})
		}
		return s
	}
	keySteps := []step{
		{"key as issued", "GET", "/orders/1", hdr("X-Api-Key", key), "get-order/allowed"},
		{"key header lower-case", "GET", "/orders/1", hdr("x-api-key", key), "get-order/allowed"},
		{"key padded", "GET", "/orders/1", hdr("X-Api-Key", " "+key+"\t"), "get-order/allowed"},
		{"key upper-case", "GET", "/orders/1", hdr("X-Api-Key", strings.ToUpper(key)), "get-order/unauthenticated"},
		{"key twice", "GET", "/orders/1", hdr("X-Api-Key", key, "X-Api-Key", key), "get-order/unauthenticated"},
		{"key and X_Api_Key", "GET", "/orders/1", hdr("X-Api-Key", key, "X_Api_Key", key), ""},
		{"key as Bearer (auth.bearer off)", "GET", "/orders/1", hdr("Authorization", "Bearer "+key), "get-order/unauthenticated"},
	}
	valueSteps := []step{
		{"value acme", "GET", "/users", withKey([2]string{"X-User", "acme"}), ""}, // a bucket at the first door only
		{"value ACME", "GET", "/users", withKey([2]string{"X-User", "ACME"}), "users/allowed"},
		{"value padded", "GET", "/users", withKey([2]string{"X-User", "  acme "}), "users/allowed"},
		{"value a list", "GET", "/users", withKey([2]string{"X-User", "acme, x"}), "refused"},
		{"value trailing comma", "GET", "/users", withKey([2]string{"X-User", "acme,"}), "refused"},
		{"value with ;param", "GET", "/users", withKey([2]string{"X-User", "acme;x"}), "refused"},
		{"value with NBSP", "GET", "/users", withKey([2]string{"X-User", "acme\u00a0"}), "refused"},
		{"value with NEL", "GET", "/users", withKey([2]string{"X-User", "acme\u0085"}), "refused"},
		{"value quoted", "GET", "/users", withKey([2]string{"X-User", `"acme"`}), "refused"},
		{"value repeated", "GET", "/users", withKey([2]string{"X-User", "acme"}, [2]string{"X-User", "other"}), "refused"},
		{"value beside X_User", "GET", "/users", withKey([2]string{"X-User", "fresh"}, [2]string{"X_User", "acme"}), ""},
	}
	xffSteps := []step{}
	for i, xff := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3, 203.0.113.4", "127.0.0.1"} {
		xffSteps = append(xffSteps, step{fmt.Sprintf("forged X-Forwarded-For %q (#%d)", xff, i+1), "GET", "/search", withKey([2]string{"X-Forwarded-For", xff}), ""})
	}

	var report []string
	run := func(door, addr, admin, iface string, steps []step) {
		for _, s := range steps {
			got := observe(admin, iface, func() string {
				return fmt.Sprint(rawStatus(t, addr, s.method, s.target, s.header))
			})
			report = append(report, fmt.Sprintf("%-6s %-45s -> %s", door, s.name, got))
			if s.want != "" && !strings.HasSuffix(got, " "+s.want) {
				t.Errorf("%s %s: %s, want ... %s", door, s.name, got, s.want)
			}
		}
	}
	ngxAddr := ngx.Addr()
	run("proxy", strings.TrimPrefix(direct.url, "http://"), direct.admin, "proxy", routeSteps())
	run("check", ngxAddr, behind.admin, "check", routeSteps())
	run("proxy", strings.TrimPrefix(direct.url, "http://"), direct.admin, "proxy", keySteps)
	run("check", ngxAddr, behind.admin, "check", keySteps)
	run("proxy", strings.TrimPrefix(direct.url, "http://"), direct.admin, "proxy", valueSteps)
	run("check", ngxAddr, behind.admin, "check", valueSteps)
	run("proxy", strings.TrimPrefix(direct.url, "http://"), direct.admin, "proxy", xffSteps)
	run("check", ngxAddr, behind.admin, "check", xffSteps)

	// RLS: the route is an id Envoy sends; keys, values and remote_address as entries.
	rlsSteps := []struct {
		name string
		kv   []string
		want string
	}{
		{"route create-order", []string{"api_key", key, "route", "create-order"}, "create-order/allowed"},
		{"route Create-Order", []string{"api_key", key, "route", "Create-Order"}, "refused"},
		{"route \"create-order \"", []string{"api_key", key, "route", "create-order "}, "refused"},
		{"route *", []string{"api_key", key, "route", "*"}, "*/allowed"},
		{"no route entry", []string{"api_key", key}, "refused"},
		{"key padded", []string{"api_key", " " + key, "route", "create-order"}, "create-order/allowed"},
		{"key upper-case", []string{"api_key", strings.ToUpper(key), "route", "create-order"}, "create-order/unauthenticated"},
		{"key twice", []string{"api_key", key, "api_key", key, "route", "create-order"}, "create-order/unauthenticated"},
		{"tenant entry (untrusted)", []string{"tenant", "shop-a", "route", "create-order"}, "create-order/unauthenticated"},
		{"user ACME", []string{"api_key", key, "route", "users", "X-User", "ACME"}, "users/allowed"},
		{"user \" acme\"", []string{"api_key", key, "route", "users", "x_user", " acme"}, "users/allowed"},
		{"user \"acme,x\"", []string{"api_key", key, "route", "users", "X-User", "acme,x"}, "users/throttled"},
		{"user twice", []string{"api_key", key, "route", "users", "X-User", "acme", "x-user", "acme"}, "users/throttled"},
		{"remote_address 192.0.2.1", []string{"api_key", key, "route", "search", "remote_address", "192.0.2.1"}, "search/allowed"},
		{"remote_address ::ffff:192.0.2.1", []string{"api_key", key, "route", "search", "remote_address", "::ffff:192.0.2.1"}, "search/allowed"},
		{"remote_address 192.0.2.1 again", []string{"api_key", key, "route", "search", "remote_address", "192.0.2.1"}, "search/throttled"},
		{"remote_address 2001:db8::1", []string{"api_key", key, "route", "search", "remote_address", "2001:db8::1"}, "search/allowed"},
		{"remote_address 2001:DB8:0:0::2 (same /64)", []string{"api_key", key, "route", "search", "remote_address", "2001:DB8:0:0::2"}, "search/allowed"},
		{"remote_address twice", []string{"api_key", key, "route", "search", "remote_address", "192.0.2.9", "remote_address", "192.0.2.10"}, "search/throttled"},
	}
	for _, s := range rlsSteps {
		got := observe(direct.admin, "rls", func() string {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc(s.kv...)}})
			if err != nil {
				return "error:" + err.Error()
			}
			return r.OverallCode.String()
		})
		report = append(report, fmt.Sprintf("%-6s %-45s -> %s", "rls", s.name, got))
		if !strings.Contains(got, " "+s.want) {
			t.Errorf("rls %s: %s, want ... %s", s.name, got, s.want)
		}
	}
	// One bucket for acme in every spelling; the only other is "fresh", which nginx
	// left alone when it dropped X_User (and so did the application's copy).
	if n := valueKeys(); n != 2 {
		t.Errorf("%d per-value buckets, want 2 (acme, and fresh through nginx)", n)
	}
	// However the client spells its address, it gets the one bucket of 127.0.0.1 (2
	// tokens) at both doors together.
	allowed := 0
	for _, line := range report {
		if strings.Contains(line, "X-Forwarded-For") && strings.Contains(line, "search/allowed") {
			allowed++
		}
	}
	if allowed > 2 {
		t.Errorf("forged X-Forwarded-For admitted %d on a limit_by client_ip route of capacity 2", allowed)
	}
	t.Logf("what each spelling was decided under (status, then ratelimit_requests_total series that moved: route/decision; refused: none moved):\n%s", strings.Join(report, "\n"))
}

// decisions are one scrape's ratelimit_requests_total of one interface, by
// "route/decision".
func decisions(s scrape, iface string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range s["ratelimit_requests_total"].GetMetric() {
		var route, dec, door string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "route":
				route = l.GetValue()
			case "decision":
				dec = l.GetValue()
			case "interface":
				door = l.GetValue()
			}
		}
		if door == iface {
			out[route+"/"+dec] += m.GetCounter().GetValue()
		}
	}
	return out
}

// rawStatus sends one request as written (no client-side normalisation of the target or
// the headers) and returns the status.
func rawStatus(t *testing.T, addr, method, target string, header [][2]string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\nContent-Length: 0\r\n", method, target)
	for _, h := range header {
		fmt.Fprintf(&b, "%s: %s\r\n", h[0], h[1])
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
