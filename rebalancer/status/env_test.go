package status_test

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer"
	"github.com/quotaplane/quotaplane/rebalancer/demand/demandtest"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/rebalancer/status"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTestsNoLeaks(m)) }

const (
	usEast = "us-east"
	euWest = "eu-west"
)

// openStore opens and migrates a store on dbURL.
func openStore(t *testing.T, dbURL string) *store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st
}

// seed writes the world every page test reads: two regions with live gateways, default
// shares moved from 50/50 to 70/30 by the rebalancer (with inputs), tenant shares that
// differ from the default by different amounts, and an operator override.
func seed(t *testing.T, st *store.Store) {
	t.Helper()
	ctx := t.Context()
	for _, r := range []string{usEast, euWest} {
		if err := st.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for id, r := range map[string]string{"gw-use-1": usEast, "gw-use-2": usEast, "gw-euw-1": euWest} {
		if err := st.Heartbeat(ctx, id, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.SetRule(ctx, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 200, RefillPerSecond: 100}); err != nil {
		t.Fatal(err)
	}
	write := func(scope regions.Scope, trigger string, shares map[string]float64, offered map[string]float64) {
		t.Helper()
		in := job.ScopeInputs{Scope: scope.String(), Reason: trigger, Kind: "run", RefillPerSecond: 10, Capacity: 20}
		var changes []store.ShareChange
		for _, r := range []string{euWest, usEast} {
			in.Regions = append(in.Regions, job.RegionInput{Region: r, Status: rebalancer.StatusOK,
				OfferedLong: offered[r], Allowed: offered[r] * 0.8, Throttled: offered[r] * 0.2, Demand: offered[r],
				Previous: 0.5, Share: shares[r]})
		}
		for _, r := range []string{euWest, usEast} {
			changes = append(changes, store.ShareChange{Scope: scope, Region: r, Old: 0.5, New: shares[r], Reason: "waterfill", Inputs: in})
		}
		if err := st.WriteRebalancerShares(ctx, changes, nil, job.DefaultActor); err != nil {
			t.Fatal(err)
		}
	}
	write(regions.GlobalScope, "interval", map[string]float64{usEast: 0.5, euWest: 0.5}, map[string]float64{usEast: 50, euWest: 50})
	write(regions.GlobalScope, "throttling", map[string]float64{usEast: 0.7, euWest: 0.3}, map[string]float64{usEast: 140, euWest: 60})
	write(regions.Scope{Tenant: "shop-a", Route: "create-order"}, "interval", map[string]float64{usEast: 0.9, euWest: 0.1}, map[string]float64{usEast: 90, euWest: 10})
	write(regions.Scope{Tenant: "shop-b", Route: regions.Wildcard}, "interval", map[string]float64{usEast: 0.72, euWest: 0.28}, map[string]float64{usEast: 72, euWest: 28})
	write(regions.Scope{Tenant: "shop-c", Route: regions.Wildcard}, "interval", map[string]float64{usEast: 0.7, euWest: 0.3}, map[string]float64{usEast: 7, euWest: 3})
	if err := st.SetOverride(ctx, regions.Scope{Tenant: "shop-d", Route: regions.Wildcard},
		map[string]float64{usEast: 0.2, euWest: 0.8}, "alice", "pinned to eu-west during the migration", time.Hour); err != nil {
		t.Fatal(err)
	}
}

// shareExporter serves ratelimit_region_share_ratio as the gateways export it.
type shareExporter struct {
	srv   *httptest.Server
	share *prometheus.GaugeVec
}

func newShareExporter(t *testing.T) *shareExporter {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ratelimit_region_share_ratio", Help: "Effective share (test exporter)."},
		[]string{"region", "scope"})
	reg.MustRegister(g)
	e := &shareExporter{srv: httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})), share: g}
	t.Cleanup(e.srv.Close)
	return e
}

func (e *shareExporter) addr() string {
	u, _ := url.Parse(e.srv.URL)
	return u.Host
}

// env is a seeded database, the two exporters with known rates, and a real Prometheus
// scraping them every second.
type env struct {
	store  *store.Store
	reqs   *demandtest.Exporter
	shares *shareExporter
	prom   *testenv.Prometheus
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{store: openStore(t, testenv.PostgresDB(t)), reqs: demandtest.New(), shares: newShareExporter(t)}
	t.Cleanup(e.reqs.Close)
	seed(t, e.store)
	e.reqs.SetRegion(usEast, 50, 20, 0)
	e.reqs.SetRegion(euWest, 30, 0, 0)
	e.shares.share.WithLabelValues(usEast, "*").Set(0.7)
	e.shares.share.WithLabelValues(euWest, "*").Set(0.3)
	e.prom = testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{
		{Name: "gateway", Targets: []string{e.reqs.Addr(), e.shares.addr()}}}})
	return e
}

func promAPI(t *testing.T, u string) promv1.API {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: u})
	if err != nil {
		t.Fatal(err)
	}
	return promv1.NewAPI(c)
}

// handler builds a Handler over the env's store and Prometheus, with a 2-minute chart.
func (e *env) handler(t *testing.T, mod func(*status.Config)) *status.Handler {
	t.Helper()
	// A short rate window: rate() over 1 min underestimates while the series are younger.
	cfg := status.Config{Prometheus: []status.Source{{API: promAPI(t, e.prom.URL())}}, ChartRange: 2 * time.Minute,
		RateWindow: 4 * time.Second, InstanceTTL: time.Minute, Timeout: 3 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	h, err := status.New(cfg, e.store)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// waitLive polls until Prometheus has the live rates of both regions (us-east throttled
// at its set 20/s) and a few chart points, so the page shows them.
func waitLive(t *testing.T, h *status.Handler) *status.Status {
	t.Helper()
	deadline := time.Now().Add(40 * time.Second)
	for {
		st, err := h.Collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		ok := st.Prometheus.Reachable && len(st.Regions) == 2
		for _, r := range st.Regions {
			ok = ok && r.ThrottledRPS != nil && (r.Name != usEast || math.Abs(*r.ThrottledRPS-20) < 0.5)
		}
		for _, s := range append(st.Charts.ThrottledRPS, st.Charts.Share...) {
			ok = ok && len(s.Points) >= 3
		}
		if ok {
			return st
		}
		if time.Now().After(deadline) {
			b, _ := json.Marshal(st)
			t.Fatalf("no live figures from Prometheus within 40 s: %s", b)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// get serves one request through h.
func get(t *testing.T, h http.Handler, path string) (int, http.Header, string) {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Code, rec.Header(), string(b)
}

func mustContain(t *testing.T, what, body string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(body, s) {
			t.Errorf("%s does not contain %q", what, s)
		}
	}
}

func mustNotContain(t *testing.T, what, body string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if strings.Contains(body, s) {
			t.Errorf("%s contains %q", what, s)
		}
	}
}

func decodeStatus(t *testing.T, body string) status.Status {
	t.Helper()
	var st status.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status.json: %v\n%s", err, body)
	}
	return st
}
