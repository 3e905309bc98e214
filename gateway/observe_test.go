package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines are the JSON log lines whose msg is msg.
func (l *lockedBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// observed is an in-process gateway with a JSON log and an adjustable clock.
type observed struct {
	*inProcess
	logs *lockedBuffer
	now  atomic.Int64 // Unix ns
}

func newObserved(t *testing.T, cfg Config) *observed {
	t.Helper()
	o := &observed{logs: &lockedBuffer{}}
	o.now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	reg := prometheus.NewRegistry()
	g, err := New(cfg, Options{
		Registerer: reg,
		Logger:     slog.New(slog.NewJSONHandler(o.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Now:        func() time.Time { return time.Unix(0, o.now.Load()) },
	})
	if err != nil {
		t.Fatal(err)
	}
	o.inProcess = &inProcess{g: g, srv: httptest.NewServer(g.Handler()), admin: httptest.NewServer(g.AdminHandler()), reg: reg}
	t.Cleanup(func() {
		o.srv.Close()
		o.admin.Close()
		g.closeClients()
	})
	return o
}

// TestProxyDurationMetrics: every request lands in the request histogram under its route
// and status class, refusals included; forwarded ones also in the upstream histogram,
// under the upstream's class.
func TestProxyDurationMetrics(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/orders/broken" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	gw := newObserved(t, articleConfig("us-east", up.URL, ""))
	base := gw.srv.URL
	call(t, "POST", base+"/orders", "key-shop-a")         // 201 from upstream
	call(t, "POST", base+"/orders", "key-shop-a")         // 201
	call(t, "POST", base+"/orders", "key-shop-a")         // 429: capacity 2
	call(t, "GET", base+"/orders/broken", "key-shop-a")   // 503 from upstream
	call(t, "GET", base+"/orders/1", "")                  // 401
	call(t, "GET", base+"/nowhere", "key-shop-a")         // 404, no route
	call(t, "GET", base+"/nowhere", "key-shop-a")         // 404
	call(t, "GET", base+"/nowhere?x=1", "not-a-real-key") // 401, no route
	s := scrapeURL(t, gw.admin.URL)
	for _, tc := range []struct {
		metric, route, class string
		want                 float64
	}{
		{"ratelimit_gateway_request_duration_seconds", "create-order", "2xx", 2},
		{"ratelimit_gateway_request_duration_seconds", "create-order", "4xx", 1},
		{"ratelimit_gateway_request_duration_seconds", "get-order", "5xx", 1},
		{"ratelimit_gateway_request_duration_seconds", "get-order", "4xx", 1},
		{"ratelimit_gateway_request_duration_seconds", "get-order", "2xx", 0},
		{"ratelimit_gateway_request_duration_seconds", routeUnmatched, "4xx", 3},
		{"ratelimit_upstream_duration_seconds", "create-order", "2xx", 2},
		{"ratelimit_upstream_duration_seconds", "create-order", "4xx", 0},
		{"ratelimit_upstream_duration_seconds", "get-order", "5xx", 1},
	} {
		if got := s.sum(tc.metric, "region", "us-east", "route", tc.route, "code_class", tc.class); got != tc.want {
			t.Errorf("%s{route=%q,code_class=%q} count %v, want %v", tc.metric, tc.route, tc.class, got, tc.want)
		}
	}
	// Bounded: every (route, class) is pre-initialised and nothing else exists.
	if n := s.series("ratelimit_gateway_request_duration_seconds"); n != 3*5 {
		t.Errorf("request histogram series %d, want 15 (2 routes + %s, 5 classes)", n, routeUnmatched)
	}
	if n := s.series("ratelimit_upstream_duration_seconds"); n != 2*5 {
		t.Errorf("upstream histogram series %d, want 10", n)
	}
}

// TestUpstreamErrorsByReasonAndRateLimitedLog: failures are counted by reason and logged
// at WARN, one line per second at most, the next line saying how many were not logged.
func TestUpstreamErrorsByReasonAndRateLimitedLog(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there: connection refused
	hangup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close() // no response at all
		}
	}))
	t.Cleanup(hangup.Close)
	cfg := articleConfig("us-east", dead, "")
	cfg.Routes[1].Upstream = hangup.URL
	cfg.Tenants[0].Rules[0].Capacity = 1000
	cfg.Tenants[0].Rules[0].RefillPerSecond = 1000
	cfg.DefaultRule = RuleConfig{Capacity: 1000, RefillPerSecond: 1000}
	gw := newObserved(t, cfg)

	for range 20 {
		resp, _ := call(t, "POST", gw.srv.URL+"/orders", "key-shop-a")
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("dead upstream: %d, want 502", resp.StatusCode)
		}
	}
	if n := len(gw.logs.lines(t, "upstream failed")); n != 1 {
		t.Fatalf("20 failures within one (frozen) second: %d WARN lines, want 1", n)
	}
	gw.now.Add(int64(time.Second))
	call(t, "GET", gw.srv.URL+"/orders/1", "key-shop-a")
	lines := gw.logs.lines(t, "upstream failed")
	if len(lines) != 2 {
		t.Fatalf("after a second: %d WARN lines, want 2", len(lines))
	}
	first, second := lines[0], lines[1]
	if first["level"] != "WARN" || first["route"] != "create-order" || first["reason"] != upReasonConnect || first["suppressed"] != 0.0 {
		t.Errorf("first line %v", first)
	}
	if second["route"] != "get-order" || second["reason"] != upReasonReset || second["suppressed"] != 19.0 {
		t.Errorf("second line %v: want get-order, reset, 19 suppressed", second)
	}
	s := scrapeURL(t, gw.admin.URL)
	if got := s.sum("ratelimit_upstream_errors_total", "route", "create-order", "reason", upReasonConnect); got != 20 {
		t.Errorf("connect errors %v, want 20", got)
	}
	if got := s.sum("ratelimit_upstream_errors_total", "route", "get-order", "reason", upReasonReset); got != 1 {
		t.Errorf("reset errors %v, want 1", got)
	}
	if got := s.sum("ratelimit_upstream_errors_total"); got != 21 {
		t.Errorf("all upstream errors %v, want 21", got)
	}
	if got := s.sum("ratelimit_gateway_request_duration_seconds", "route", "create-order", "code_class", "5xx"); got != 20 {
		t.Errorf("502s in the request histogram %v, want 20", got)
	}
}

// TestAccessLog: off by default; on, one line per (sampled) request with a fixed set of
// fields, never the API key (in a header or the query), and only the gateway's own
// tenant, never one the client claims.
func TestAccessLog(t *testing.T) {
	up := newUpstream(t, 0)
	const key = "key-shop-a"
	t.Run("off by default", func(t *testing.T) {
		gw := newObserved(t, articleConfig("us-east", up.URL, ""))
		call(t, "POST", gw.srv.URL+"/orders", key)
		if n := len(gw.logs.lines(t, "access")); n != 0 {
			t.Fatalf("%d access lines with the access log off", n)
		}
	})
	t.Run("every request", func(t *testing.T) {
		cfg := articleConfig("us-east", up.URL, "")
		cfg.Observability.AccessLog.Enabled = true
		gw := newObserved(t, cfg)
		call(t, "POST", gw.srv.URL+"/orders?api_key="+key, key)
		call(t, "GET", gw.srv.URL+"/orders/7", "", "X-Tenant-Id", "evil-corp") // 401
		lines := gw.logs.lines(t, "access")
		if len(lines) != 2 {
			t.Fatalf("%d access lines, want 2", len(lines))
		}
		ok, refused := lines[0], lines[1]
		if ok["route"] != "create-order" || ok["method"] != "POST" || ok["path"] != "/orders" || ok["status"] != 200.0 ||
			ok["tenant"] != "shop-a" || ok["level"] != "INFO" || ok["region"] != "us-east" || ok["client"] != "127.0.0.1" {
			t.Errorf("forwarded request line %v", ok)
		}
		if d, _ := ok["duration_seconds"].(float64); !(d > 0) {
			t.Errorf("duration_seconds %v", ok["duration_seconds"])
		}
		if refused["status"] != 401.0 || refused["route"] != "get-order" {
			t.Errorf("refused request line %v", refused)
		}
		if _, ok := refused["tenant"]; ok {
			t.Errorf("a refused request logged the tenant the client claimed: %v", refused)
		}
		if strings.Contains(gw.logs.String(), key) || strings.Contains(gw.logs.String(), "evil-corp") {
			t.Errorf("the log holds the API key or a client-sent tenant:\n%s", gw.logs.String())
		}
	})
	t.Run("sampled", func(t *testing.T) {
		cfg := articleConfig("us-east", up.URL, "")
		cfg.Observability.AccessLog = AccessLogConfig{Enabled: true, SampleRatio: 0.2}
		gw := newObserved(t, cfg)
		const n = 500
		for range n {
			call(t, "GET", gw.srv.URL+"/nowhere", "")
		}
		// Binomial(500, 0.2): mean 100, sd ~9; [55, 145] is 5 sd either way.
		if got := len(gw.logs.lines(t, "access")); got < 55 || got > 145 {
			t.Errorf("%d of %d requests logged at sample_ratio 0.2", got, n)
		}
	})
}

func TestUpstreamReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "dial", Err: &net.AddrError{Err: "refused"}}, upReasonConnect},
		{&net.OpError{Op: "read", Err: timeoutErr{}}, upReasonTimeout},
		{http.ErrHandlerTimeout, upReasonOther},
	} {
		if got := upstreamReason(tc.err); got != tc.want {
			t.Errorf("upstreamReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
