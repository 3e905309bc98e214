package demand_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/demand/demandtest"
	"github.com/quotaplane/quotaplane/regions"
)

const (
	longWindow  = 6 * time.Second
	shortWindow = 3 * time.Second
)

var shopOrders = regions.Scope{Tenant: "shop-a", Route: "create-order"}

// startProm starts a real Prometheus scraping every exporter every second.
func startProm(t *testing.T, exps ...*demandtest.Exporter) *testenv.Prometheus {
	t.Helper()
	var targets []string
	for _, e := range exps {
		targets = append(targets, e.Addr())
	}
	return testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{{Name: "gateway", Targets: targets}}})
}

func newReader(t *testing.T, sources ...demand.Source) *demand.Reader {
	t.Helper()
	r, err := demand.New(demand.Config{Sources: sources, LongWindow: longWindow, ShortWindow: shortWindow, MaxAge: 5 * time.Second, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readUntil polls Read until ok accepts the result, within a bounded time; the result is
// then checked by the caller.
func readUntil(t *testing.T, r *demand.Reader, within time.Duration, ok func(demand.Demand) bool) demand.Demand {
	t.Helper()
	deadline := time.Now().Add(within)
	var (
		d   demand.Demand
		err error
	)
	for time.Now().Before(deadline) {
		d, err = r.Read(context.Background(), time.Time{})
		if err == nil && ok(d) {
			return d
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("demand not as expected after %s: last %+v, err %v", within, d, err)
	return d
}

// waitHistory waits until every series of the test exporters has been scraped for more
// than one long window, so rate() covers whole windows.
func waitHistory(t *testing.T, promURL string) {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: promURL})
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
	t.Fatalf("prometheus %s: fewer than %v samples per series after 40s", promURL, need)
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 0.03*math.Max(1, want) {
		t.Errorf("%s = %.3f, want %.3f (±3%%)", what, got, want)
	}
}

func TestReadOfferedDemand(t *testing.T) {
	t.Parallel()
	exp := demandtest.New()
	t.Cleanup(exp.Close)
	exp.SetRegion("us-east", 70, 30, 0)
	exp.SetRegion("eu-west", 40, 0, 5)
	exp.SetRegion("ap-south", 0, 0, 0) // live but idle: known zero, not unknown
	exp.SetTenant("us-east", "shop-a", "create-order", 20, 10)
	exp.SetTenant("eu-west", "shop-a", "create-order", 5, 0)
	exp.SetTenant("us-east", demand.OtherTenant, demand.OtherTenant, 500, 500)
	prom := startProm(t, exp)
	r := newReader(t, demand.Source{URL: prom.URL()})
	waitHistory(t, prom.URL())
	d, err := r.Read(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}

	us, _ := d.Sample(regions.GlobalScope, "us-east")
	near(t, "us-east long allowed", us.Long.Allowed, 70)
	near(t, "us-east long throttled", us.Long.Throttled, 30)
	near(t, "us-east long offered", us.Long.Offered(), 100)
	near(t, "us-east short offered", us.Short.Offered(), 100)
	eu, _ := d.Sample(regions.GlobalScope, "eu-west")
	near(t, "eu-west offered (shadow counts)", eu.Long.Offered(), 45)
	near(t, "eu-west shadow throttled", eu.Long.ShadowThrottled, 5)
	ap, ok := d.Sample(regions.GlobalScope, "ap-south")
	if !ok || ap.Long.Offered() != 0 {
		t.Errorf("ap-south = %+v, %v; want a known zero", ap, ok)
	}
	if _, ok := d.Sample(regions.GlobalScope, "sa-east"); ok {
		t.Error("a region with no series must be unknown")
	}
	if age := d.At.Sub(us.LastSeen); age < 0 || age > 3*time.Second {
		t.Errorf("last seen %s before the read, want a fresh sample", age)
	}

	if got := d.PairScopes(); len(got) != 1 || got[0] != shopOrders {
		t.Fatalf("pair scopes = %v, want only %v (tenant _other has no scope)", got, shopOrders)
	}
	pus, _ := d.Sample(shopOrders, "us-east")
	near(t, "shop-a us-east allowed", pus.Long.Allowed, 20)
	near(t, "shop-a us-east throttled", pus.Long.Throttled, 10)
	peu, _ := d.Sample(shopOrders, "eu-west")
	near(t, "shop-a eu-west offered", peu.Long.Offered(), 5)
	if _, ok := d.Sample(shopOrders, "ap-south"); ok {
		t.Error("shop-a has no series in ap-south: must be unknown, not zero")
	}
}

func TestVanishedRegionBecomesUnknown(t *testing.T) {
	t.Parallel()
	exp := demandtest.New()
	t.Cleanup(exp.Close)
	exp.SetRegion("us-east", 10, 0, 0)
	exp.SetRegion("eu-west", 10, 0, 0)
	r := newReader(t, demand.Source{URL: startProm(t, exp).URL()})
	readUntil(t, r, 30*time.Second, func(d demand.Demand) bool { return len(d.Scopes[regions.GlobalScope]) == 2 })

	exp.RemoveRegion("eu-west") // Prometheus writes staleness markers on the next scrape
	d := readUntil(t, r, 15*time.Second, func(d demand.Demand) bool {
		_, ok := d.Sample(regions.GlobalScope, "eu-west")
		return !ok
	})
	if _, ok := d.Sample(regions.GlobalScope, "us-east"); !ok {
		t.Error("us-east must stay known")
	}
}

func TestPrometheusDownIsAnError(t *testing.T) {
	t.Parallel()
	exp := demandtest.New()
	t.Cleanup(exp.Close)
	exp.SetRegion("us-east", 10, 0, 0)
	prom := startProm(t, exp)
	r := newReader(t, demand.Source{URL: prom.URL()})
	readUntil(t, r, 30*time.Second, func(d demand.Demand) bool { return len(d.Scopes[regions.GlobalScope]) == 1 })
	if err := prom.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err := r.Read(context.Background(), time.Time{})
	if !errors.Is(err, demand.ErrUnavailable) {
		t.Fatalf("Read with Prometheus stopped: err = %v, want ErrUnavailable", err)
	}
}

func TestPrometheusPerRegion(t *testing.T) {
	t.Parallel()
	expUS, expEU := demandtest.New(), demandtest.New()
	t.Cleanup(expUS.Close)
	t.Cleanup(expEU.Close)
	expUS.SetRegion("us-east", 30, 0, 0)
	expEU.SetRegion("eu-west", 20, 0, 0)
	// A stray series of another region in us-east's Prometheus must not be read from it.
	expUS.SetRegion("eu-west", 999, 0, 0)
	promUS, promEU := startProm(t, expUS), startProm(t, expEU)
	r := newReader(t, demand.Source{Region: "us-east", URL: promUS.URL()}, demand.Source{Region: "eu-west", URL: promEU.URL()})
	waitHistory(t, promUS.URL())
	waitHistory(t, promEU.URL())
	d, err := r.Read(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	us, _ := d.Sample(regions.GlobalScope, "us-east")
	eu, _ := d.Sample(regions.GlobalScope, "eu-west")
	near(t, "us-east offered", us.Long.Offered(), 30)
	near(t, "eu-west offered", eu.Long.Offered(), 20)

	if err := promEU.Stop(); err != nil {
		t.Fatal(err)
	}
	d, err = r.Read(context.Background(), time.Time{})
	if err != nil {
		t.Fatalf("one regional Prometheus down must not fail the read: %v", err)
	}
	if _, ok := d.Sample(regions.GlobalScope, "eu-west"); ok {
		t.Error("eu-west must be unknown while its Prometheus is down")
	}
	if !errors.Is(d.Unreachable["eu-west"], demand.ErrUnavailable) {
		t.Errorf("Unreachable = %v, want eu-west listed", d.Unreachable)
	}
	if _, ok := d.Sample(regions.GlobalScope, "us-east"); !ok {
		t.Error("us-east must stay known")
	}

	if err := promUS.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(context.Background(), time.Time{}); !errors.Is(err, demand.ErrUnavailable) {
		t.Fatalf("every Prometheus down: err = %v, want ErrUnavailable", err)
	}
}

func TestParseSources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      []string
		want    []demand.Source
		wantErr bool
	}{
		{name: "one url", in: []string{"http://127.0.0.1:9090"}, want: []demand.Source{{URL: "http://127.0.0.1:9090"}}},
		{name: "url with query", in: []string{"http://p:9090/?a=b"}, want: []demand.Source{{URL: "http://p:9090/?a=b"}}},
		{name: "per region", in: []string{"us-east=http://a:9090", "eu-west=https://b"},
			want: []demand.Source{{Region: "us-east", URL: "http://a:9090"}, {Region: "eu-west", URL: "https://b"}}},
		{name: "none", in: nil, wantErr: true},
		{name: "two plain urls", in: []string{"http://a", "http://b"}, wantErr: true},
		{name: "mixed", in: []string{"http://a", "us-east=http://b"}, wantErr: true},
		{name: "region twice", in: []string{"us-east=http://a", "us-east=http://b"}, wantErr: true},
		{name: "no scheme", in: []string{"127.0.0.1:9090"}, wantErr: true},
		{name: "bad region", in: []string{"us east=http://a"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := demand.ParseSources(tc.in)
			if tc.wantErr {
				if !errors.Is(err, regions.ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("[%d] = %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]demand.Config{
		"no source":    {},
		"short window": {Sources: []demand.Source{{URL: "http://a"}}, LongWindow: time.Millisecond},
		"bad region":   {Sources: []demand.Source{{Region: "a b", URL: "http://a"}}},
		"mixed":        {Sources: []demand.Source{{URL: "http://a"}, {Region: "x", URL: "http://b"}}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := demand.New(cfg); !errors.Is(err, regions.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}
