package figures_test

import (
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/demand/demandtest"
	"github.com/quotaplane/quotaplane/rebalancer/status/figures"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTestsNoLeaks(m)) }

const (
	usEast = "us-east"
	euWest = "eu-west"
)

// gauges serves the gateways' gauges that Read reads besides the request counters.
func gauges(t *testing.T, reloadedAt time.Time) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	vec := func(name string, labels ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: name + " (test exporter)."}, labels)
		reg.MustRegister(g)
		return g
	}
	fallback := vec(figures.FallbackMetric, "region")
	instances := vec(figures.InstancesMetric, "region")
	reload := vec(figures.ReloadMetric, "region")
	share := vec(figures.ShareMetric, "region", "scope")
	// us-east: healthy, 3 gateways; eu-west: on its fallback, 2 gateways, rules 200 s old.
	fallback.WithLabelValues(usEast).Set(0)
	fallback.WithLabelValues(euWest).Set(1)
	instances.WithLabelValues(usEast).Set(3)
	instances.WithLabelValues(euWest).Set(2)
	reload.WithLabelValues(usEast).Set(float64(reloadedAt.Unix()))
	reload.WithLabelValues(euWest).Set(float64(reloadedAt.Unix() - 200))
	share.WithLabelValues(usEast, "*").Set(0.7)
	share.WithLabelValues(euWest, "*").Set(0.3)
	share.WithLabelValues(usEast, "shop-a").Set(0.5)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func promAPI(t *testing.T, u string) promv1.API {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: u})
	if err != nil {
		t.Fatal(err)
	}
	return promv1.NewAPI(c)
}

func near(v *float64, want, tol float64) bool { return v != nil && math.Abs(*v-want) <= tol }

func val[T any](v *T) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprint(*v)
}

// TestRead reads every figure from a real Prometheus scraping gateway-shaped metrics with
// known values: from one server for every region, from regional sources, with one of
// them down, and for one tenant.
func TestRead(t *testing.T) {
	t.Parallel()
	reqs := demandtest.New()
	t.Cleanup(reqs.Close)
	reqs.SetRegion(usEast, 70, 7, 0)
	reqs.SetRegion(euWest, 30, 12, 0)
	reqs.SetTenant(usEast, "shop-a", "create-order", 20, 4)
	reqs.SetTenant(usEast, "shop-a", "default", 5, 0)
	reqs.SetTenantShadow(usEast, "shop-a", "default", 1)
	reqs.SetTenant(euWest, "shop-a", "create-order", 5, 5)
	reqs.SetTenant(euWest, "shop-b", "create-order", 9, 9)
	reloadedAt := time.Now()
	prom := testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{
		{Name: "gateway", Targets: []string{reqs.Addr(), gauges(t, reloadedAt)}}}})
	all := []figures.Source{{API: promAPI(t, prom.URL())}}
	// A short window: rate() over a longer one underestimates while the series are young.
	o := figures.Options{Window: 4 * time.Second}

	// Wait until the rates have settled at the set values.
	var res figures.Result
	for deadline := time.Now().Add(40 * time.Second); ; {
		o.At = time.Now()
		res = figures.Read(t.Context(), all, o)
		us, eu := res.Region(usEast), res.Region(euWest)
		if res.Errors[0] == nil && us.Rates != nil && eu.Rates != nil && math.Abs(us.Rates.Allowed-70) < 0.5 &&
			math.Abs(eu.Rates.Throttled-12) < 0.5 && us.Share != nil && eu.ReloadAge != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no settled figures within 40 s: errors %v, %s, %s", res.Errors, show(res.Region(usEast)), show(res.Region(euWest)))
		}
		time.Sleep(250 * time.Millisecond)
	}

	t.Run("every region", func(t *testing.T) {
		rs := res.Regions()
		if len(rs) != 2 || rs[0].Name != euWest || rs[1].Name != usEast {
			t.Fatalf("regions %v, want eu-west and us-east", names(rs))
		}
		eu, us := rs[0], rs[1]
		if r := us.Rates; math.Abs(r.Allowed-70) > 1 || math.Abs(r.Throttled-7) > 0.5 || r.ShadowThrottled != 0 {
			t.Errorf("us-east rates %+v, want 70 allowed, 7 throttled", *r)
		}
		if ratio, ok := figures.ThrottleRatio(*eu.Rates); !ok || math.Abs(ratio-12.0/42) > 0.02 {
			t.Errorf("eu-west throttle ratio %v, want %.3f", ratio, 12.0/42)
		}
		if val(us.Fallback) != "false" || val(eu.Fallback) != "true" || val(us.Gateways) != "3" || val(eu.Gateways) != "2" ||
			!near(us.Share, 0.7, 0) || !near(eu.Share, 0.3, 0) {
			t.Errorf("gauges: %s; %s", show(us), show(eu))
		}
		age := o.At.Sub(reloadedAt).Seconds()
		if !near(us.ReloadAge, age, 1.5) || !near(eu.ReloadAge, age+200, 1.5) {
			t.Errorf("reload ages us-east %s, eu-west %s; want about %.0f and %.0f", val(us.ReloadAge), val(eu.ReloadAge), age, age+200)
		}
		if got := []string{figures.State(eu, time.Minute), figures.State(us, time.Minute)}; got[0] != "fallback,stale-rules" || got[1] != "ok" {
			t.Errorf("states %v, want fallback,stale-rules and ok", got)
		}
	})
	t.Run("known regions", func(t *testing.T) {
		rs := res.Regions("ap-south", usEast, "")
		if len(rs) != 3 || rs[0].Name != "ap-south" || rs[0] != (figures.Region{Name: "ap-south"}) || figures.State(rs[0], time.Minute) != figures.StateNoData {
			t.Errorf("regions %v, want ap-south without figures first", names(rs))
		}
	})
	t.Run("one tenant", func(t *testing.T) {
		to := o
		to.Tenant = "shop-a"
		res := figures.Read(t.Context(), all, to)
		us, eu := res.Region(usEast), res.Region(euWest)
		// Summed over the tenant's routes; shop-b is not counted.
		if res.Errors[0] != nil || us.Rates == nil || eu.Rates == nil || math.Abs(us.Rates.Allowed-25) > 1 || math.Abs(us.Rates.Throttled-4) > 0.5 ||
			math.Abs(us.Rates.ShadowThrottled-1) > 0.2 || math.Abs(eu.Rates.Allowed-5) > 0.5 || math.Abs(eu.Rates.Throttled-5) > 0.5 {
			t.Fatalf("shop-a: %v; %s; %s", res.Errors, show(us), show(eu))
		}
		// The tenant's own share where exported, else the default one.
		if !near(us.Share, 0.5, 0) || !near(eu.Share, 0.3, 0) {
			t.Errorf("shop-a shares us-east %s, eu-west %s; want 0.5 and 0.3", val(us.Share), val(eu.Share))
		}
		to.Tenant = "nobody"
		if res := figures.Read(t.Context(), all, to); res.Region(usEast).Rates != nil || res.Region(usEast).Gateways == nil {
			t.Errorf("a tenant without series: %s, want no rates but the gateways", show(res.Region(usEast)))
		}
	})
	t.Run("regional sources", func(t *testing.T) {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		// us-east reads the one server, which holds eu-west's series too: they are not
		// us-east's to report. eu-west's own server is down.
		srcs := []figures.Source{{Region: usEast, API: promAPI(t, prom.URL())}, {Region: euWest, API: promAPI(t, fmt.Sprintf("http://127.0.0.1:%d", port))}}
		res := figures.Read(t.Context(), srcs, o)
		if res.Errors[0] != nil || res.Errors[1] == nil {
			t.Fatalf("errors %v, want eu-west's only", res.Errors)
		}
		rs := res.Regions()
		if len(rs) != 2 || rs[0] != (figures.Region{Name: euWest}) || rs[1].Name != usEast || rs[1].Rates == nil || val(rs[1].Gateways) != "3" {
			t.Fatalf("regions %s; %s, want eu-west without figures and us-east's", show(rs[0]), show(rs[1]))
		}
		if figures.State(rs[0], time.Minute) != figures.StateNoData {
			t.Errorf("eu-west state %s, want no-data", figures.State(rs[0], time.Minute))
		}
		if !strings.Contains(res.Errors[1].Error(), " figures: ") {
			t.Errorf("error %q does not name the figure", res.Errors[1])
		}
	})
}

func names(rs []figures.Region) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
}

// show prints r's figures, nil ones as "-".
func show(r figures.Region) string {
	rates := "-"
	if r.Rates != nil {
		rates = fmt.Sprintf("%+v", *r.Rates)
	}
	return fmt.Sprintf("%s: rates=%s fallback=%s gateways=%s reload=%s share=%s",
		r.Name, rates, val(r.Fallback), val(r.Gateways), val(r.ReloadAge), val(r.Share))
}
