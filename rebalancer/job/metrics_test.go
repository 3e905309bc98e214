package job

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/regions/store"
)

// shareSeries counts the ratelimit_rebalancer_share_ratio series by scope.
func shareSeries(t *testing.T, g prometheus.Gatherer) map[string]int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Error(err)
		return nil
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_rebalancer_share_ratio" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "scope" {
					out[lp.GetValue()]++
				}
			}
		}
	}
	return out
}

// TestExportSharesNeverDropsLiveSeries: a scrape during an export always sees every
// series that was exported before and after it; only scopes no longer exported vanish.
func TestExportSharesNeverDropsLiveSeries(t *testing.T) {
	t.Parallel()
	r, err := demand.New(demand.Config{Sources: []demand.Source{{URL: "http://127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	j, err := New(Config{Registerer: reg, MaxShareSeries: 1}, &store.Store{}, r)
	if err != nil {
		t.Fatal(err)
	}
	scope := func(sc string, offered, share float64) ScopeReport {
		return ScopeReport{Written: true, Inputs: ScopeInputs{Scope: sc, Regions: []RegionInput{
			{Region: "us-east", OfferedLong: offered, Previous: 0.5, Share: share},
			{Region: "eu-west", OfferedLong: offered, Previous: 0.5, Share: 1 - share},
		}}}
	}
	busy, quiet := scope("shop-a/create-order", 100, 0.7), scope("shop-b/list", 10, 0.6)
	j.exportShares([]ScopeReport{scope("*", 1000, 0.7), busy, quiet})
	if got := shareSeries(t, reg); got["*"] != 2 || got["shop-a/create-order"] != 2 || got["shop-b/list"] != 0 {
		t.Fatalf("series by scope = %v, want * and the busiest pair (MaxShareSeries 1), 2 regions each", got)
	}

	// Scrapes while the same scopes are exported again and again never miss a series.
	var stop atomic.Bool
	var missing atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			if got := shareSeries(t, reg); got["*"] != 2 || got["shop-a/create-order"] != 2 {
				missing.Add(1)
			}
		}
	})
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; i < 20000 && time.Now().Before(deadline) && missing.Load() == 0; i++ {
		j.exportShares([]ScopeReport{scope("*", 1000, 0.7), busy, quiet})
	}
	stop.Store(true)
	wg.Wait()
	if n := missing.Load(); n > 0 {
		t.Errorf("%d scrapes saw a share series missing while it was being re-exported", n)
	}

	// A pair that is no longer among the busiest is removed; the new busiest appears.
	busy.Inputs.Regions[0].OfferedLong, busy.Inputs.Regions[1].OfferedLong = 1, 1
	j.exportShares([]ScopeReport{scope("*", 1000, 0.7), busy, quiet})
	if got := shareSeries(t, reg); got["*"] != 2 || got["shop-a/create-order"] != 0 || got["shop-b/list"] != 2 {
		t.Fatalf("series by scope after the busiest changed = %v, want * and shop-b/list only", got)
	}
}
