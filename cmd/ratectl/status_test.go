package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// gatewayExporter exports the gateway's metric names (issue 3) with fixed rates. Each
// sample carries the scrape time as its timestamp and counters are exactly rate x
// (timestamp - t0), t0 being the first scrape truncated to the second, so Prometheus's
// rate() and time() at a fixed time after t0 give exact, repeatable figures.
type gatewayExporter struct {
	mu sync.Mutex
	t0 time.Time

	requests, tenantRequests, fallback, instances, reload, share *prometheus.Desc
}

func newGatewayExporter() *gatewayExporter {
	return &gatewayExporter{
		requests:       prometheus.NewDesc("ratelimit_requests_total", "Requests by decision.", []string{"region", "route", "decision", "source"}, nil),
		tenantRequests: prometheus.NewDesc("ratelimit_tenant_requests_total", "Requests of the busiest tenants.", []string{"region", "tenant", "route", "decision"}, nil),
		fallback:       prometheus.NewDesc("ratelimit_fallback_active", "1 while deciding locally.", []string{"region"}, nil),
		instances:      prometheus.NewDesc("ratelimit_gateway_instances", "Live gateways of the region.", []string{"region"}, nil),
		reload:         prometheus.NewDesc("ratelimit_rules_last_reload_success_timestamp_seconds", "Last good reload.", []string{"region"}, nil),
		share:          prometheus.NewDesc("ratelimit_region_share_ratio", "Effective share.", []string{"region", "scope"}, nil),
	}
}

func (e *gatewayExporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{e.requests, e.tenantRequests, e.fallback, e.instances, e.reload, e.share} {
		ch <- d
	}
}

func (e *gatewayExporter) Collect(ch chan<- prometheus.Metric) {
	now := time.Now().Truncate(time.Millisecond)
	e.mu.Lock()
	if e.t0.IsZero() {
		e.t0 = now.Truncate(time.Second)
	}
	t0 := e.t0
	e.mu.Unlock()
	el := now.Sub(t0).Seconds()
	emit := func(d *prometheus.Desc, vt prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.NewMetricWithTimestamp(now, prometheus.MustNewConstMetric(d, vt, v, labels...))
	}
	counter := func(d *prometheus.Desc, rate float64, labels ...string) {
		emit(d, prometheus.CounterValue, rate*el, labels...)
	}
	// us-east: 70 allowed/s over two routes, 7 throttled/s, 3 gateways, healthy.
	counter(e.requests, 50, "us-east", "create-order", "allowed", "redis")
	counter(e.requests, 20, "us-east", "default", "allowed", "redis")
	counter(e.requests, 7, "us-east", "create-order", "throttled", "redis")
	counter(e.requests, 1, "us-east", "default", "unauthenticated", "redis")
	emit(e.fallback, prometheus.GaugeValue, 0, "us-east")
	emit(e.instances, prometheus.GaugeValue, 3, "us-east")
	emit(e.reload, prometheus.GaugeValue, float64(t0.Unix()-5), "us-east")
	emit(e.share, prometheus.GaugeValue, 0.7, "us-east", "*")
	emit(e.share, prometheus.GaugeValue, 0.5, "us-east", "shop-a")
	// eu-west: 30 allowed/s, 12 throttled/s (some by the local fallback), 2 gateways, its
	// rules not reloaded for 200 s.
	counter(e.requests, 24, "eu-west", "create-order", "allowed", "redis")
	counter(e.requests, 6, "eu-west", "create-order", "allowed", "fallback")
	counter(e.requests, 12, "eu-west", "create-order", "throttled", "fallback")
	emit(e.fallback, prometheus.GaugeValue, 1, "eu-west")
	emit(e.instances, prometheus.GaugeValue, 2, "eu-west")
	emit(e.reload, prometheus.GaugeValue, float64(t0.Unix()-200), "eu-west")
	emit(e.share, prometheus.GaugeValue, 0.3, "eu-west", "*")
	// shop-a has its own series and share in us-east only; eu-west sees it under the default.
	counter(e.tenantRequests, 20, "us-east", "shop-a", "create-order", "allowed")
	counter(e.tenantRequests, 4, "us-east", "shop-a", "create-order", "throttled")
	counter(e.tenantRequests, 5, "eu-west", "shop-a", "create-order", "allowed")
	counter(e.tenantRequests, 5, "eu-west", "shop-a", "create-order", "throttled")
	counter(e.tenantRequests, 40, "us-east", "_other", "_other", "allowed")
	// shop-b runs under a shadow rule on one of its routes in us-east: 8/s the rule would
	// have refused but let through. They are offered traffic, as the rebalancer counts it.
	counter(e.tenantRequests, 6, "us-east", "shop-b", "create-order", "allowed")
	counter(e.tenantRequests, 2, "us-east", "shop-b", "create-order", "throttled")
	counter(e.tenantRequests, 8, "us-east", "shop-b", "default", "shadow_throttled")
}

// startExporter serves the registry on 127.0.0.1 and returns host:port.
func startExporter(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// waitForSamples polls Prometheus until it holds samples of the exporter at or after at.
func waitForSamples(t *testing.T, promURL string, at time.Time) {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: promURL})
	if err != nil {
		t.Fatal(err)
	}
	p := promv1.NewAPI(c)
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		v, _, _, err := p.Query(context.Background(), `min(timestamp(ratelimit_gateway_instances))`, time.Time{})
		if err == nil {
			if vec, ok := v.(model.Vector); ok && len(vec) == 1 && float64(vec[0].Value) >= float64(at.Unix()) {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("prometheus at %s has no samples at %s after 45s", promURL, at)
}

func TestStatusAgainstPrometheus(t *testing.T) {
	t.Parallel()
	exp := newGatewayExporter()
	target := startExporter(t, exp)
	prom := testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{{Name: "gateway", Targets: []string{target}}}})
	// The first scrape sets t0; evaluating at t0+8s, the 5s rate window is covered by samples.
	waitForSamples(t, prom.URL(), time.Time{})
	exp.mu.Lock()
	at := exp.t0.Add(8 * time.Second)
	exp.mu.Unlock()
	waitForSamples(t, prom.URL(), at.Add(time.Second))

	c := newCLI(t, map[string]string{envPrometheusURL: prom.URL()})
	c.clock = func() time.Time { return at }
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"status", []string{"status", "--window", "5s"}},
		{"status_tenant", []string{"status", "--window", "5s", "--tenant", "shop-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, format := range []string{"table", "json"} {
				r := c.ok(append(tc.args, "-o", format)...)
				golden(t, tc.name+"."+format, normTimes(r.stdout))
				if r.stderr != "" {
					t.Errorf("stderr: %s", r.stderr)
				}
			}
		})
	}

	t.Run("dark region from the database", func(t *testing.T) {
		d, _ := newDB(t)
		for _, r := range []string{"us-east", "eu-west", "ap-south"} {
			d.ok("regions", "add", r)
		}
		d.env[envPrometheusURL] = prom.URL()
		d.clock = c.clock
		r := d.ok("status", "--window", "5s")
		golden(t, "status_with_db.table", normTimes(r.stdout))
	})
	t.Run("shadow_throttled is offered traffic", func(t *testing.T) {
		// throttled / offered = 2 / (6 + 2 + 8); leaving shadow_throttled out of offered,
		// as ratectl once did, would give 2 / 8.
		r := c.ok("status", "--window", "5s", "--tenant", "shop-b", "-o", "json")
		var rep statusReport
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatalf("%v:\n%s", err, r.stdout)
		}
		ratios := map[string]*float64{"total": rep.Total.ThrottleRatio}
		for _, st := range rep.Regions {
			ratios[st.Region] = st.ThrottleRatio
		}
		for _, region := range []string{"us-east", "total"} {
			if got := ratios[region]; got == nil || *got != 0.125 {
				t.Errorf("%s throttle_ratio = %s, want 12.5%% (shadow_throttled counts as offered):\n%s", region, optPercent(got), r.stdout)
			}
		}
		if r.stderr != "" {
			t.Errorf("stderr: %s", r.stderr)
		}
	})
	t.Run("unknown tenant warns", func(t *testing.T) {
		r := c.ok("status", "--window", "5s", "--tenant", "nobody")
		if !strings.Contains(r.stderr, "warning: tenant nobody has no series") {
			t.Errorf("stderr = %q, want the warning", r.stderr)
		}
	})
	t.Run("at flag", func(t *testing.T) {
		r := c.ok("status", "--window", "5s", "-o", "json", "--at", at.UTC().Format(time.RFC3339))
		if want := `"at": "` + at.UTC().Format(time.RFC3339) + `"`; !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %s:\n%s", want, r.stdout)
		}
	})
}

func TestStatusErrors(t *testing.T) {
	t.Parallel()
	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	// A server that answers, but not as Prometheus does.
	notProm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "nope", http.StatusInternalServerError)
	}))
	t.Cleanup(notProm.Close)

	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		code     int
		contains string
		absent   string
	}{
		{"no url", nil, []string{"status"}, exitUsage, "no Prometheus: set --prometheus-url or RATELIMIT_PROMETHEUS_URL", ""},
		{"unreachable, password hidden", nil, []string{"status", "--prometheus-url", "http://ops:hunter2secret@127.0.0.1:" + port},
			exitUnreachable, "prometheus at 127.0.0.1:" + port + " unreachable", "hunter2secret"},
		{"unreachable from env", map[string]string{envPrometheusURL: "http://127.0.0.1:" + port}, []string{"status"},
			exitUnreachable, "prometheus at 127.0.0.1:" + port + " unreachable", ""},
		{"server error", nil, []string{"status", "--prometheus-url", notProm.URL}, exitFailure, "query prometheus:", ""},
		{"bad tenant", nil, []string{"status", "--prometheus-url", notProm.URL, "--tenant", "a b"}, exitUsage, `invalid tenant id "a b"`, ""},
		{"bad window", nil, []string{"status", "--prometheus-url", notProm.URL, "--window", "10ms"}, exitUsage, "--window 10ms: must be at least 1s", ""},
		{"bad at", nil, []string{"status", "--prometheus-url", notProm.URL, "--at", "yesterday"}, exitUsage, `--at "yesterday": want an RFC 3339 time`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newCLI(t, tc.env).run(tc.args...)
			checkError(t, r, tc.code, tc.contains, tc.absent)
		})
	}
}

// checkError asserts a failed run: exit code, one line on stderr starting "ratectl: "
// and containing contains, nothing on stdout, and absent nowhere.
func checkError(t *testing.T, r result, code int, contains, absent string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d (stderr %q)", r.code, code, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "ratectl: ") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("stderr is not one line starting with \"ratectl: \": %q", r.stderr)
	}
	if !strings.Contains(r.stderr, contains) {
		t.Errorf("stderr %q does not contain %q", r.stderr, contains)
	}
	if r.stdout != "" {
		t.Errorf("stdout not empty on error: %q", r.stdout)
	}
	if absent != "" && strings.Contains(r.stdout+r.stderr, absent) {
		t.Errorf("output contains %q:\n%s%s", absent, r.stdout, r.stderr)
	}
}

// regionOnly is a collector passing on only the series of one region, as a regional
// Prometheus would scrape them.
type regionOnly struct {
	prometheus.Collector
	region string
}

func (f regionOnly) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() { f.Collector.Collect(all); close(all) }()
	for m := range all {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			panic(err)
		}
		for _, l := range pb.GetLabel() {
			if l.GetName() == "region" && l.GetValue() == f.region {
				ch <- m
			}
		}
	}
}

// TestStatusPrometheusPerRegion: with one Prometheus per region (--prometheus-url
// REGION=URL, repeated), each region reads its own server, and the figures are those of
// one Prometheus holding every region; a region known to the database without a URL of
// its own reads no-data, with a warning naming it.
func TestStatusPrometheusPerRegion(t *testing.T) {
	t.Parallel()
	exp := newGatewayExporter()
	proms := map[string]*testenv.Prometheus{}
	for _, r := range []string{"us-east", "eu-west"} {
		target := startExporter(t, regionOnly{exp, r})
		proms[r] = testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{{Name: "gateway", Targets: []string{target}}}})
	}
	for _, p := range proms {
		waitForSamples(t, p.URL(), time.Time{})
	}
	exp.mu.Lock()
	at := exp.t0.Add(8 * time.Second)
	exp.mu.Unlock()
	for _, p := range proms {
		waitForSamples(t, p.URL(), at.Add(time.Second))
	}
	args := []string{"status", "--window", "5s",
		"--prometheus-url", "us-east=" + proms["us-east"].URL(), "--prometheus-url", "eu-west=" + proms["eu-west"].URL()}

	c := newCLI(t, nil)
	c.clock = func() time.Time { return at }
	for _, format := range []string{"table", "json"} {
		r := c.ok(append(args, "-o", format)...)
		golden(t, "status."+format, normTimes(r.stdout))
		if r.stderr != "" {
			t.Errorf("stderr: %s", r.stderr)
		}
	}
	t.Run("from the environment", func(t *testing.T) {
		e := newCLI(t, map[string]string{envPrometheusURL: "us-east=" + proms["us-east"].URL() + ",eu-west=" + proms["eu-west"].URL()})
		e.clock = c.clock
		golden(t, "status.table", normTimes(e.ok("status", "--window", "5s").stdout))
	})
	t.Run("one region's Prometheus alone", func(t *testing.T) {
		// us-east's server holds no eu-west series: read plainly, eu-west is absent.
		r := c.ok("status", "--window", "5s", "--prometheus-url", "us-east="+proms["us-east"].URL(), "-o", "json")
		var rep statusReport
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatalf("%v:\n%s", err, r.stdout)
		}
		if len(rep.Regions) != 1 || rep.Regions[0].Region != "us-east" || rep.Regions[0].State != "ok" {
			t.Errorf("regions = %+v, want us-east ok only", rep.Regions)
		}
	})
	t.Run("region without a URL", func(t *testing.T) {
		d, _ := newDB(t)
		for _, r := range []string{"us-east", "eu-west", "ap-south"} {
			d.ok("regions", "add", r)
		}
		d.clock = c.clock
		r := d.ok(args...)
		golden(t, "status_with_db.table", normTimes(r.stdout))
		if want := "ratectl: warning: no --prometheus-url ap-south=URL given: ap-south shown as no-data\n"; r.stderr != want {
			t.Errorf("stderr = %q, want %q", r.stderr, want)
		}
	})
	t.Run("one regional Prometheus down", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := "http://127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		r := c.ok("status", "--window", "5s", "--prometheus-url", "us-east="+proms["us-east"].URL(), "--prometheus-url", "eu-west="+dead)
		if !strings.Contains(r.stderr, "warning: region eu-west shown as no-data: prometheus at 127.0.0.1:") {
			t.Errorf("stderr = %q, want a warning naming eu-west's Prometheus", r.stderr)
		}
		if !strings.Contains(r.stdout, "eu-west") || !strings.Contains(r.stdout, "no-data") {
			t.Errorf("eu-west not shown as no-data:\n%s", r.stdout)
		}
	})
}

func TestStatusPrometheusURLErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		contains string
	}{
		{"region twice", []string{"--prometheus-url", "us-east=http://127.0.0.1:1", "--prometheus-url", "us-east=http://127.0.0.1:2"}, "region us-east given twice"},
		{"mixed forms", []string{"--prometheus-url", "http://127.0.0.1:1", "--prometheus-url", "us-east=http://127.0.0.1:2"}, "a plain URL cannot be mixed with region=URL"},
		{"not a URL", []string{"--prometheus-url", "us-east=ftp://127.0.0.1:1"}, "want http(s)://host:port or region=http(s)://host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newCLI(t, nil).run(append([]string{"status"}, tc.args...)...)
			checkError(t, r, exitUsage, "--prometheus-url: ", "")
			if !strings.Contains(r.stderr, tc.contains) {
				t.Errorf("stderr %q does not contain %q", r.stderr, tc.contains)
			}
		})
	}
}
