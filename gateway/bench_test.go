package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// BenchmarkServeHTTP is the in-process hot path: authentication, rule and share
// resolution, the decision (real Redis, or the local limiter), metrics, headers, and
// either the 429 or the proxied request to an in-process upstream.
func BenchmarkServeHTTP(b *testing.B) {
	up := newUpstream(b, 0)
	rp := testenv.Redis(b)
	for i, bc := range []struct {
		name     string
		redis    bool
		capacity int64 // 1: every request after the first is throttled
	}{
		{"redis/throttled", true, 1},
		{"redis/allowed+proxy", true, 1 << 40},
		{"local/throttled", false, 1},
		{"local/allowed+proxy", false, 1 << 40},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := articleConfig("us-east", up.URL, "")
			if bc.redis {
				cfg.Redis.URL = testenv.RedisURL(rp)
				cfg.Redis.Timeout = time.Second // measure Redis, not the fallback
			}
			cfg.Tenants[0].Rules[0].Capacity = bc.capacity
			cfg.Tenants[0].Rules[0].RefillPerSecond = 1e-3
			if bc.capacity > 1 {
				cfg.Tenants[0].Rules[0].RefillPerSecond = 1e9
			}
			cfg.Tenants[0].ID = fmt.Sprintf("bench-%d", i) // a bucket of its own
			g, err := New(cfg, Options{Registerer: prometheus.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(g.closeClients)
			h := g.Handler()
			r := httptest.NewRequest("POST", "/orders", nil)
			r.Header.Set("X-Api-Key", "key-shop-a")
			w := &discardWriter{h: http.Header{}}
			h.ServeHTTP(w, r)
			want := 200
			if bc.capacity == 1 {
				want = 429
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				clear(w.h)
				delete(r.Header, hdrTenant)
				h.ServeHTTP(w, r)
			}
			b.StopTimer()
			if w.status != want {
				b.Fatalf("status %d, want %d", w.status, want)
			}
			if got := scrapeRegistry(b, g).sum("ratelimit_requests_total", "source", "fallback"); got != 0 {
				b.Fatalf("%v fallback decisions: not a Redis measurement", got)
			}
		})
	}
}

func scrapeRegistry(b testing.TB, g *Gateway) scrape {
	srv := httptest.NewServer(g.AdminHandler())
	defer srv.Close()
	return scrapeURL(b, srv.URL)
}

// BenchmarkAddedLatency is the latency a real gateway process (with Redis) adds to a
// request, against the same upstream called directly: p50 and p99 of each, in µs.
func BenchmarkAddedLatency(b *testing.B) {
	up := newUpstream(b, 0)
	rp := testenv.Redis(b)
	p := startProc(b, standaloneYAML("us-east", up.URL, 1<<40, 1e9), "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	send := func(method, url, key string) time.Duration {
		req, _ := http.NewRequest(method, url, nil)
		if key != "" {
			req.Header.Set("X-Api-Key", key)
		}
		start := time.Now()
		resp, err := testClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_ = resp.Body.Close()
		d := time.Since(start)
		if resp.StatusCode != 200 {
			b.Fatalf("%s %s: %d", method, url, resp.StatusCode)
		}
		return d
	}
	for range 100 { // warm both paths' connections
		send("POST", p.url+"/orders", "key-shop-a")
		send("POST", up.URL+"/orders", "")
	}
	var direct, via []time.Duration
	for b.Loop() {
		direct = append(direct, send("POST", up.URL+"/orders", ""))
		via = append(via, send("POST", p.url+"/orders", "key-shop-a"))
	}
	q := func(d []time.Duration, f float64) float64 {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return float64(s[int(f*float64(len(s)-1))].Microseconds())
	}
	b.ReportMetric(q(direct, 0.5), "direct-p50-µs")
	b.ReportMetric(q(direct, 0.99), "direct-p99-µs")
	b.ReportMetric(q(via, 0.5), "gateway-p50-µs")
	b.ReportMetric(q(via, 0.99), "gateway-p99-µs")
	b.ReportMetric(q(via, 0.5)-q(direct, 0.5), "added-p50-µs")
	b.ReportMetric(q(via, 0.99)-q(direct, 0.99), "added-p99-µs")
}
