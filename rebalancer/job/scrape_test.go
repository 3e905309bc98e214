package job_test

import (
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/demand/demandtest"
	"github.com/quotaplane/quotaplane/regions"
)

// TestLostScrapeTargetIsUnknown (issue 22): eu-west has two gateways and Prometheus
// loses one of them. The region's totals then hold half its traffic; read as demand,
// eu-west looked half as busy and lost share (0.857 -> 0.75 on the bare stack). Fewer
// fresh targets than running gateways make the region's demand unknown: its share stays.
func TestLostScrapeTargetIsUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	// A second eu-west gateway, scraped as a target of its own.
	second := demandtest.New()
	t.Cleanup(second.Close)
	if err := e.store.Heartbeat(t.Context(), "gw-eu-west-2", euWest); err != nil {
		t.Fatal(err)
	}
	prom := testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{{Name: "gateway", Targets: []string{e.exp.Addr(), second.Addr()}}}})
	reader, err := demand.New(demand.Config{Sources: []demand.Source{{URL: prom.URL()}},
		LongWindow: longWindow, ShortWindow: 2 * time.Second, MaxAge: 5 * time.Second, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e.prom, e.reader = prom, reader
	e.exp.SetRegion(usEast, 30, 0, 0)
	e.exp.SetRegion(euWest, 35, 0, 0)
	second.SetRegion(euWest, 35, 0, 0)
	e.waitHistory(t)
	j := e.newJob(t, nil, nil)
	if _, err := j.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := e.rebalancerShares(t, regions.GlobalScope)
	if math.Abs(before[euWest]-0.7) > 0.03 {
		t.Fatalf("* %v with both eu-west gateways scraped, want eu-west ~0.7", before)
	}

	second.Close() // its scrapes fail from now on; its series go stale
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := reader.Read(t.Context(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		// Wait until the rates hold only the first gateway's 35 rps, as the target count.
		if smp, ok := d.Sample(regions.GlobalScope, euWest); d.Targets[euWest] == 1 && ok && smp.Long.Offered() < 40 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu-west targets %d 20s after one closed, want 1 and rates of one gateway", d.Targets[euWest])
		}
		time.Sleep(250 * time.Millisecond)
	}
	rep, err := j.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if in := regionInput(t, scopeReport(t, rep, regions.GlobalScope), euWest); in.Status != "unknown" {
		t.Errorf("eu-west with one of two gateways unscraped: %s (offered %v), want unknown", in.Status, in.OfferedLong)
	}
	after := e.rebalancerShares(t, regions.GlobalScope)
	if math.Abs(after[euWest]-before[euWest]) > 1e-9 {
		t.Errorf("eu-west's * share %v -> %v after losing a scrape target, want kept", before[euWest], after[euWest])
	}
}
