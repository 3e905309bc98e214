package job_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/demand/demandtest"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTestsNoLeaks(m)) }

const (
	usEast     = "us-east"
	euWest     = "eu-west"
	longWindow = 4 * time.Second
	reloadWait = 300 * time.Millisecond
)

var (
	pair     = regions.Scope{Tenant: "shop-a", Route: "create-order"}
	pairRule = regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 200, RefillPerSecond: 100, Shards: 1}
)

// env is one test's world: a migrated database with two live regions and a rule for
// shop-a/create-order, an exporter of gateway counters and a real Prometheus scraping it.
type env struct {
	dbURL  string
	store  *store.Store
	exp    *demandtest.Exporter
	prom   *testenv.Prometheus
	reader *demand.Reader
}

func newEnv(t *testing.T, dbURL string) *env {
	t.Helper()
	ctx := t.Context()
	store, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{usEast, euWest} {
		if err := store.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := store.Heartbeat(ctx, "gw-"+r, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.SetRule(ctx, pairRule); err != nil {
		t.Fatal(err)
	}
	exp := demandtest.New()
	t.Cleanup(exp.Close)
	prom := testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{{Name: "gateway", Targets: []string{exp.Addr()}}}})
	reader, err := demand.New(demand.Config{Sources: []demand.Source{{URL: prom.URL()}},
		LongWindow: longWindow, ShortWindow: 2 * time.Second, MaxAge: 5 * time.Second, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &env{dbURL: dbURL, store: store, exp: exp, prom: prom, reader: reader}
}

// setDemand70_30 offers 140/60 rps region-wide and 70/30 rps for shop-a/create-order,
// throttled where the 50/50 split cannot serve it.
func (e *env) setDemand70_30() {
	e.exp.SetRegion(usEast, 50, 90, 0)
	e.exp.SetRegion(euWest, 50, 10, 0)
	e.exp.SetTenant(usEast, pair.Tenant, pair.Route, 50, 20)
	e.exp.SetTenant(euWest, pair.Tenant, pair.Route, 30, 0)
}

// expected70_30 is the answer for setDemand70_30's true rates: for the pair, water-filling
// its rule; for "*", the proportional split of the traffic it governs, the region totals
// minus the pair (140-70 / 60-30 rps).
func expected70_30(t *testing.T, sc regions.Scope) map[string]float64 {
	t.Helper()
	if sc == regions.GlobalScope {
		return map[string]float64{usEast: 70.0 / 100, euWest: 30.0 / 100}
	}
	limit := regions.Limit{Capacity: pairRule.Capacity, RefillPerSecond: pairRule.RefillPerSecond}
	offered := map[string]float64{usEast: 70, euWest: 30}
	var in []rebalancer.RegionInput
	for _, r := range []string{euWest, usEast} {
		rt := rebalancer.Rates{Allowed: offered[r]}
		in = append(in, rebalancer.RegionInput{Region: r, Status: rebalancer.StatusOK, Long: rt, Short: rt, Share: 0.5})
	}
	a, err := rebalancer.Allocate(rebalancer.DefaultConfig(2), limit, time.Now(), in, rebalancer.State{})
	if err != nil {
		t.Fatal(err)
	}
	return a.Shares
}

// waitHistory waits until Prometheus holds more than one long window of every series.
func (e *env) waitHistory(t *testing.T) {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: e.prom.URL()})
	if err != nil {
		t.Fatal(err)
	}
	q := fmt.Sprintf("min(count_over_time(%s[1m]))", demand.RequestsMetric)
	need := float64(longWindow/time.Second + 2)
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		v, _, _, err := v1.NewAPI(c).Query(context.Background(), q, time.Now())
		if vec, ok := v.(model.Vector); err == nil && ok && len(vec) == 1 && float64(vec[0].Value) >= need {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("prometheus: fewer than %v samples per series after 40s", need)
}

func (e *env) newJob(t *testing.T, reg prometheus.Registerer, mod func(*job.Config)) *job.Job {
	t.Helper()
	cfg := job.Config{Interval: longWindow, CheckInterval: time.Second, ReloadWait: reloadWait,
		InstanceTTL: time.Hour, Registerer: reg}
	if mod != nil {
		mod(&cfg)
	}
	j, err := job.New(cfg, e.store, e.reader)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// rebalancerShares reads the stored rebalancer shares of scope.
func (e *env) rebalancerShares(t *testing.T, sc regions.Scope) map[string]float64 {
	t.Helper()
	all, err := e.store.Shares(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, s := range all {
		if s.Scope == sc && s.Source == regions.SourceRebalancer {
			out[s.Region] = s.Share
		}
	}
	return out
}

func sharesNear(t *testing.T, what string, got, want map[string]float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: shares %v, want %v", what, got, want)
		return
	}
	for r, w := range want {
		if math.Abs(got[r]-w) > tol {
			t.Errorf("%s: shares %v, want %v (±%v)", what, got, want, tol)
			return
		}
	}
}

// metric returns the value of the series of name whose labels include labels (0 if none).
func metric(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return 0
}

// stopPostgres ends every session, then stops the server. local's Stop sends SIGTERM,
// PostgreSQL's smart shutdown, which waits for open pools and after 10 s is killed,
// leaving orphaned backends that can make the restart fail.
func stopPostgres(t *testing.T, pg *testenv.Postgres, dbURL string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'`)
	_ = conn.Close(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("postgres took %s to stop", d)
	}
}
