package gateway

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// countingUpstream is an upstream that counts the requests it received.
type countingUpstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newCountingUpstream(t testing.TB) *countingUpstream {
	t.Helper()
	u := &countingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		_, _ = io.WriteString(w, "ok\n")
	}))
	t.Cleanup(u.Close)
	return u
}

// running is a gateway served by Run in this process, so the real http.Server settings
// (header limits, timeouts) apply.
type running struct {
	g          *Gateway
	url, admin string
	reg        *prometheus.Registry
}

func runInProcess(t testing.TB, cfg Config, opts Options) *running {
	t.Helper()
	lp, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ap, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = fmt.Sprintf("127.0.0.1:%d", lp)
	cfg.AdminListen = fmt.Sprintf("127.0.0.1:%d", ap)
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	g, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return")
		}
	})
	r := &running{g: g, url: "http://" + cfg.Listen, admin: "http://" + cfg.AdminListen, reg: reg}
	waitFor(t, 10*time.Second, "gateway serving", func() bool {
		resp, err := testClient.Get(r.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return r
}

// rawRequest writes req to the gateway as bytes and returns the response status.
func rawRequest(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(addr, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// Write in the background: a server may answer (431) and close before it has read
	// a huge request.
	go func() { _, _ = io.WriteString(c, req) }()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestHostileHeaders sends malformed and abusive headers to a gateway with Redis: each
// gets its 4xx, and none reaches Redis or the upstream.
func TestHostileHeaders(t *testing.T) {
	up := newCountingUpstream(t)
	rp := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	defer rdb.Close()
	cfg := articleConfig("us-east", up.URL, testenv.RedisURL(rp))
	cfg.Redis.Timeout = 500 * time.Millisecond
	cfg.UnauthenticatedLimit.Disabled = true // this test is about the answers, not the limit
	gw := runInProcess(t, cfg, Options{})
	good := "key-shop-a"
	req := func(headers ...string) string {
		return "POST /orders HTTP/1.1\r\nHost: gw\r\n" + strings.Join(headers, "") + "Content-Length: 0\r\nConnection: close\r\n\r\n"
	}
	before := evalCalls(t, rdb)
	for _, tc := range []struct {
		name string
		req  string
		want int
	}{
		{"header block over max_header_bytes", req("X-Api-Key: "+good+"\r\n", "X-Pad: "+strings.Repeat("a", 80<<10)+"\r\n"), 431},
		{"key over max_header_bytes", req("X-Api-Key: " + strings.Repeat("k", 100<<10) + "\r\n"), 431},
		{"a megabyte of headers", req(strings.Repeat("X-Pad: "+strings.Repeat("b", 1000)+"\r\n", 1100)), 431},
		{"two X-Api-Key headers, both valid", req("X-Api-Key: "+good+"\r\n", "X-Api-Key: "+good+"\r\n"), 400},
		{"two X-Api-Key headers, one valid", req("X-Api-Key: nope\r\n", "X-Api-Key: "+good+"\r\n"), 400},
		{"key with invalid UTF-8", req("X-Api-Key: \xff\xfe\xfd" + good + "\r\n"), 401},
		{"key over 256 bytes", req("X-Api-Key: " + good + strings.Repeat("x", 300) + "\r\n"), 401},
		{"bare CR in the key", req("X-Api-Key: " + good + "\rX-Tenant-Id: shop-b\r\n"), 400},
		{"NUL in the key", req("X-Api-Key: " + good + "\x00\r\n"), 400},
		// net/http unfolds obs-fold into one value with a space: an unknown key.
		{"obsolete line folding", req("X-Api-Key: nope\r\n " + good + "\r\n"), 401},
		{"space before the colon", req("X-Api-Key : " + good + "\r\n"), 400},
		{"percent-encoded CRLF", req("X-Api-Key: " + good + "%0d%0aX-Tenant-Id:%20shop-b\r\n"), 401},
		{"empty key", req("X-Api-Key: \r\n"), 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rawRequest(t, gw.url, tc.req); got != tc.want {
				t.Errorf("status %d, want %d", got, tc.want)
			}
		})
	}
	if n := up.hits.Load(); n != 0 {
		t.Errorf("the upstream received %d hostile requests", n)
	}
	if after := evalCalls(t, rdb); after != before {
		t.Errorf("hostile requests ran %d Redis scripts", after-before)
	}
	// The same connection path still serves a good request (and that one reaches both).
	if got := rawRequest(t, gw.url, req("X-Api-Key: "+good+"\r\n")); got != 200 {
		t.Fatalf("good request: %d", got)
	}
	if up.hits.Load() != 1 || evalCalls(t, rdb) == before {
		t.Fatalf("the good request did not reach the upstream and Redis: the checks above prove nothing")
	}
}

// seriesCount is the number of series the registry holds.
func seriesCount(t testing.TB, reg prometheus.Gatherer) int {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fams {
		n += len(f.GetMetric())
	}
	return n
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// randomKey is a well-formed key that no tenant holds.
func randomKey() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "qp_" + base64.RawURLEncoding.EncodeToString(b[:])
}

// flood sends n requests at about rate per second from workers connections, each with
// header(i) set, and returns the status counts and the achieved rate.
func flood(t *testing.T, url string, n int, rate float64, header func(i int, h http.Header)) (map[int]int, float64) {
	t.Helper()
	const workers = 32
	var (
		mu    sync.Mutex
		codes = map[int]int{}
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if due := start.Add(time.Duration(float64(i) / rate * float64(time.Second))); time.Until(due) > 0 {
					time.Sleep(time.Until(due))
				}
				req, _ := http.NewRequest("POST", url+"/orders", nil)
				header(i, req.Header)
				resp, err := testClient.Do(req)
				code := 0
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return codes, float64(n) / time.Since(start).Seconds()
}

// TestRandomKeyFlood sends 10,000 distinct random API keys per second for two seconds:
// every one is a 401, no Redis script runs, the upstream sees nothing, the metric series
// do not grow, and the heap stays bounded. With the per-client limit on, the same flood
// from one address is refused 429 after the budget, while another address is served.
func TestRandomKeyFlood(t *testing.T) {
	const rate, n = 10000, 20000
	up := newCountingUpstream(t)
	rp := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	defer rdb.Close()

	t.Run("limit off", func(t *testing.T) {
		cfg := articleConfig("us-east", up.URL, testenv.RedisURL(rp))
		cfg.Redis.Timeout = 500 * time.Millisecond
		cfg.UnauthenticatedLimit.Disabled = true
		gw := runInProcess(t, cfg, Options{})
		// Warm up the series and pools, then measure.
		flood(t, gw.url, 200, rate, func(_ int, h http.Header) { h.Set("X-Api-Key", randomKey()) })
		series, heap, evals, hits := seriesCount(t, gw.reg), heapInuse(), evalCalls(t, rdb), up.hits.Load()
		codes, got := flood(t, gw.url, n, rate, func(_ int, h http.Header) { h.Set("X-Api-Key", randomKey()) })
		heapAfter := heapInuse()
		t.Logf("%d random keys at %.0f/s: %v; heap in use %.1f MB -> %.1f MB; %d series", n, got, codes, float64(heap)/1e6, float64(heapAfter)/1e6, series)
		if codes[401] != n {
			t.Errorf("status counts %v, want %d x 401", codes, n)
		}
		if d := evalCalls(t, rdb) - evals; d != 0 {
			t.Errorf("random keys ran %d Redis scripts", d)
		}
		if d := up.hits.Load() - hits; d != 0 {
			t.Errorf("random keys reached the upstream %d times", d)
		}
		if after := seriesCount(t, gw.reg); after != series {
			t.Errorf("metric series %d -> %d: random keys created series", series, after)
		}
		// Nothing is kept per key; what the heap holds after a GC is connections and
		// buffers. 16 MB is far above that and far below 20,000 of anything per key.
		if heapAfter > heap+16<<20 {
			t.Errorf("heap in use grew %.1f MB over the flood", float64(heapAfter-heap)/1e6)
		}
		s := scrapeURL(t, gw.admin)
		if got := s.sum("ratelimit_requests_total", "decision", "unauthenticated"); got != n+200 {
			t.Errorf("unauthenticated count %v, want %d", got, n+200)
		}
	})

	t.Run("limit on", func(t *testing.T) {
		cfg := articleConfig("us-east", up.URL, testenv.RedisURL(rp))
		cfg.Redis.Timeout = 500 * time.Millisecond
		// A slow refill: the valid-key call after the flood must find the budget still
		// spent (at 10/s, a tenth of a second of scheduling refilled a token: flaky).
		const refill = 0.5
		cfg.UnauthenticatedLimit = UnauthLimitConfig{Capacity: 50, RefillPerSecond: refill, MaxClients: 1000}
		cfg.TrustedProxies = []string{"127.0.0.1"}
		gw := runInProcess(t, cfg, Options{})
		evals, hits := evalCalls(t, rdb), up.hits.Load()
		// One client (as vouched for by the trusted proxy 127.0.0.1).
		codes, got := flood(t, gw.url, n/2, rate, func(_ int, h http.Header) {
			h.Set("X-Api-Key", randomKey())
			h.Set("X-Forwarded-For", "198.51.100.7")
		})
		t.Logf("one client, %d random keys at %.0f/s: %v", n/2, got, codes)
		// 50 at once plus the refill over the run (about a second; longer under -race).
		if elapsed := float64(n/2) / got; codes[401] < 50 || float64(codes[401]) > 50+refill*elapsed+1 || codes[401]+codes[429] != n/2 {
			t.Errorf("status counts %v: want 50 + refill x elapsed 401s, the rest 429", codes)
		}
		// Blocked: even the valid key is refused from that client, not from another.
		resp, body := call(t, "POST", gw.url+"/orders", "key-shop-a", "X-Forwarded-For", "198.51.100.7")
		checkProblem(t, resp, body, 429)
		if resp.Header.Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
		if resp, _ := call(t, "POST", gw.url+"/orders", "key-shop-a", "X-Forwarded-For", "198.51.100.8"); resp.StatusCode != 200 {
			t.Errorf("another client with a valid key: %d, want 200", resp.StatusCode)
		}
		// A spray of client addresses: each gets its own small budget, and the buckets
		// held stay within max_clients.
		heap := heapInuse()
		codes, got = flood(t, gw.url, n, rate, func(i int, h http.Header) {
			h.Set("X-Api-Key", randomKey())
			h.Set("X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
		})
		heapAfter := heapInuse()
		t.Logf("%d client addresses, one random key each, at %.0f/s: %v; guard buckets %d; heap %.1f MB -> %.1f MB",
			n, got, codes, gw.g.guard.fails.Len(), float64(heap)/1e6, float64(heapAfter)/1e6)
		if codes[401] != n {
			t.Errorf("status counts %v, want %d x 401 (a fresh budget per address)", codes, n)
		}
		if l := gw.g.guard.fails.Len(); l > 1000 {
			t.Errorf("guard holds %d buckets, max_clients is 1000", l)
		}
		if heapAfter > heap+16<<20 {
			t.Errorf("heap in use grew %.1f MB over the spray", float64(heapAfter-heap)/1e6)
		}
		if d := evalCalls(t, rdb) - evals; d != 1 {
			t.Errorf("%d Redis scripts ran, want 1 (the one valid request)", d)
		}
		if d := up.hits.Load() - hits; d != 1 {
			t.Errorf("the upstream saw %d requests, want 1 (the one valid request)", d)
		}
	})
}

// fakeClock is a settable clock for the per-client limit.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestUnauthenticatedLimit walks one client through its budget with a fake clock: failed
// attempts are 401 until the budget is spent, then every request of that client is 429
// (a valid key too, so hits cannot be told from misses), other clients are unaffected,
// and the refill lets the client back in. Without trusted proxies, X-Forwarded-For is
// ignored: a client cannot buy a new budget by naming another address.
func TestUnauthenticatedLimit(t *testing.T) {
	up := newUpstream(t, 0)
	clock := newFakeClock()
	cfg := articleConfig("us-east", up.URL, "")
	cfg.UnauthenticatedLimit = UnauthLimitConfig{Capacity: 3, RefillPerSecond: 0.5, MaxClients: 100}
	cfg.TrustedProxies = []string{"127.0.0.0/8"}
	gw := newInProcessOpts(t, cfg, Options{Now: clock.Now})
	a := []string{"X-Forwarded-For", "203.0.113.7"}
	b := []string{"X-Forwarded-For", "203.0.113.8"}
	status := func(key string, client []string) (int, string) {
		t.Helper()
		resp, _ := call(t, "POST", gw.srv.URL+"/orders", key, client...)
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	steps := []struct {
		name   string
		key    string
		client []string
		want   int
	}{
		{"a: unknown key 1", "guess-1", a, 401},
		{"a: no key", "", a, 401},
		{"a: unknown key 3", "guess-3", a, 401},
		{"a: budget spent", "guess-4", a, 429},
		{"a: valid key while blocked", "key-shop-b", a, 429},
		{"b: valid key", "key-shop-b", b, 200},
		{"b: unknown key", "guess-b", b, 401},
	}
	for _, s := range steps {
		got, retry := status(s.key, s.client)
		if got != s.want {
			t.Fatalf("%s: status %d, want %d", s.name, got, s.want)
		}
		if got == 429 && retry != "2" {
			t.Errorf("%s: Retry-After %q, want 2 (one attempt every 2 s)", s.name, retry)
		}
	}
	clock.Advance(2 * time.Second)
	if got, _ := status("key-shop-b", a); got != 200 {
		t.Fatalf("a after the refill, valid key: %d, want 200", got)
	}
	if got, _ := status("guess-5", a); got != 401 {
		t.Fatalf("a after the refill, one more guess: %d, want 401", got)
	}
	if got, _ := status("guess-6", a); got != 429 {
		t.Fatalf("a, a second guess after one refill: %d, want 429", got)
	}
	s := scrapeURL(t, gw.admin.URL)
	if got := s.sum("ratelimit_unauthenticated_throttled_total"); got != 3 {
		t.Errorf("ratelimit_unauthenticated_throttled_total %v, want 3", got)
	}

	// No trusted proxies: the peer is the client, whatever X-Forwarded-For says.
	cfg.TrustedProxies = nil
	gw2 := newInProcessOpts(t, cfg, Options{Now: clock.Now})
	for i := range 4 {
		resp, _ := call(t, "POST", gw2.srv.URL+"/orders", "guess", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
		if want := map[bool]int{true: 401, false: 429}[i < 3]; resp.StatusCode != want {
			t.Fatalf("spoofed X-Forwarded-For #%d: %d, want %d", i, resp.StatusCode, want)
		}
	}
}

// newInProcessOpts is newInProcess with options (a clock).
func newInProcessOpts(t testing.TB, cfg Config, opts Options) *inProcess {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	g, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	p := &inProcess{g: g, srv: httptest.NewServer(g.Handler()), admin: httptest.NewServer(g.AdminHandler()), reg: reg}
	t.Cleanup(func() {
		p.srv.Close()
		p.admin.Close()
	})
	return p
}

func TestClientAddr(t *testing.T) {
	trusted, err := newTrustedProxies([]string{"10.0.0.0/8", "192.0.2.1", "fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"untrusted peer: X-Forwarded-For ignored", "198.51.100.1:5000", []string{"1.2.3.4"}, "198.51.100.1"},
		{"trusted peer, one hop", "10.1.1.1:5000", []string{"1.2.3.4"}, "1.2.3.4"},
		{"client-written entries left of the real one", "10.1.1.1:5000", []string{"6.6.6.6, 1.2.3.4"}, "1.2.3.4"},
		{"chain of trusted proxies", "10.1.1.1:5000", []string{"1.2.3.4, 192.0.2.1, 10.9.9.9"}, "1.2.3.4"},
		{"several headers, read from the last", "10.1.1.1:5000", []string{"6.6.6.6", "1.2.3.4, 10.2.2.2"}, "1.2.3.4"},
		{"garbage stops at the last trusted hop", "10.1.1.1:5000", []string{"1.2.3.4, bogus, 10.2.2.2"}, "10.2.2.2"},
		{"empty entry stops too", "10.1.1.1:5000", []string{"1.2.3.4,,"}, "10.1.1.1"},
		{"all trusted: the leftmost", "10.1.1.1:5000", []string{"10.3.3.3"}, "10.3.3.3"},
		{"no header", "10.1.1.1:5000", nil, "10.1.1.1"},
		{"IPv4-mapped peer", "[::ffff:10.1.1.1]:5000", []string{"::ffff:1.2.3.4"}, "1.2.3.4"},
		{"IPv6 proxy", "[fd00::1]:5000", []string{"2001:db8::5"}, "2001:db8::5"},
		{"zone in an entry", "10.1.1.1:5000", []string{"fe80::1%eth0"}, "10.1.1.1"},
		{"not an IP peer", "@", []string{"1.2.3.4"}, "invalid IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			if tc.xff != nil {
				r.Header["X-Forwarded-For"] = tc.xff
			}
			if got := trusted.clientAddr(r).String(); got != tc.want {
				t.Errorf("clientAddr = %s, want %s", got, tc.want)
			}
		})
	}
	for _, tc := range []struct{ a, b string }{
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff"},
		{"1.2.3.4", "1.2.3.4"},
	} {
		if ka, kb := clientKey(netip.MustParseAddr(tc.a)), clientKey(netip.MustParseAddr(tc.b)); ka != kb {
			t.Errorf("clientKey(%s) = %s, clientKey(%s) = %s: want one client", tc.a, ka, tc.b, kb)
		}
	}
	if clientKey(netip.MustParseAddr("2001:db8:1:2::1")) == clientKey(netip.MustParseAddr("2001:db8:1:3::1")) {
		t.Error("two /64s are one client")
	}
	if clientKey(netip.MustParseAddr("1.2.3.4")) == clientKey(netip.MustParseAddr("1.2.3.5")) {
		t.Error("two IPv4 addresses are one client")
	}
}

// FuzzClientAddr: whatever X-Forwarded-For holds, the client is the peer or an address
// written in the header, and an untrusted peer is always itself.
func FuzzClientAddr(f *testing.F) {
	for _, s := range []string{"1.2.3.4", "1.2.3.4, 10.0.0.1", ",,", " , 10.0.0.1", "::ffff:10.0.0.1", "fe80::1%lo, 10.0.0.2", strings.Repeat("10.0.0.1,", 100)} {
		f.Add(s, true)
	}
	trusted, err := newTrustedProxies([]string{"10.0.0.0/8"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, xff string, trustedPeer bool) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "198.51.100.1:1"
		if trustedPeer {
			r.RemoteAddr = "10.0.0.9:1"
		}
		r.Header["X-Forwarded-For"] = []string{xff}
		got := trusted.clientAddr(r)
		if !got.IsValid() {
			t.Fatalf("no client for %q", xff)
		}
		if !trustedPeer && got.String() != "198.51.100.1" {
			t.Fatalf("untrusted peer, client %s", got)
		}
		written := got.String() == "10.0.0.9" || got.String() == "198.51.100.1"
		for _, part := range strings.Split(xff, ",") {
			if a, err := netip.ParseAddr(strings.TrimSpace(part)); err == nil && a.Unmap() == got {
				written = true
			}
		}
		if !written {
			t.Fatalf("client %s is neither the peer nor in %q", got, xff)
		}
	})
}

// FuzzAPIKeyHeader drives authentication with arbitrary X-Api-Key values (any number of
// them) and X-Forwarded-For: no panic, only 200 for exactly one valid key, otherwise a
// fixed problem response with a 4xx, and nothing reaches the upstream but a valid key.
func FuzzAPIKeyHeader(f *testing.F) {
	for _, s := range []struct {
		k1, k2 string
		n      uint8
	}{{"key-shop-a", "", 1}, {"key-shop-a", "key-shop-a", 2}, {"", "", 0}, {"\xff\xfe", "", 1}, {"key-shop-a\r\n", "", 1}, {strings.Repeat("k", 300), "", 1}} {
		f.Add(s.k1, s.k2, s.n, "1.2.3.4")
	}
	up := newCountingUpstream(f)
	cfg := articleConfig("us-east", up.URL, "")
	cfg.TrustedProxies = []string{"192.0.2.0/24"}
	cfg.UnauthenticatedLimit = UnauthLimitConfig{Capacity: 1000, RefillPerSecond: 1000}
	cfg.Tenants[0].Rules[0].Capacity = 1 << 40 // never throttled here
	cfg.Tenants[0].Rules[0].RefillPerSecond = 1 << 30
	g, err := New(cfg, Options{})
	if err != nil {
		f.Fatal(err)
	}
	h := g.Handler()
	valid := map[string]bool{"key-shop-a": true, "key-shop-b": true}
	f.Fuzz(func(t *testing.T, k1, k2 string, n uint8, xff string) {
		r := httptest.NewRequest("POST", "/orders", nil)
		r.RemoteAddr = "192.0.2.10:1234"
		r.Header["X-Forwarded-For"] = []string{xff}
		var keys []string
		for i := range int(n % 4) {
			keys = append(keys, []string{k1, k2}[i%2])
		}
		if len(keys) > 0 {
			r.Header["X-Api-Key"] = keys
		}
		before := up.hits.Load()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		hit := up.hits.Load() != before
		ok := len(keys) == 1 && valid[keys[0]]
		switch w.Code {
		case 200:
			if !ok || !hit {
				t.Fatalf("200 for keys %q (upstream hit %v)", keys, hit)
			}
		case 400, 401, 429:
			if hit {
				t.Fatalf("%d for keys %q, yet the upstream was called", w.Code, keys)
			}
			if w.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%d without a problem body", w.Code)
			}
			if w.Code == 400 && len(keys) < 2 || w.Code != 400 && w.Code != 429 && len(keys) >= 2 {
				t.Fatalf("%d for %d keys", w.Code, len(keys))
			}
			if ok && w.Code != 429 {
				t.Fatalf("%d for a valid key", w.Code)
			}
		default:
			t.Fatalf("status %d for keys %q", w.Code, keys)
		}
	})
}
