package usage

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestTrackerSyncs: two regions' trackers over one real PostgreSQL. What one reports the
// other reads back as the fleet's usage; a lower report of the same counter (a late one,
// or another gateway's older view) never lowers it; before its first load a tracker says
// it has not loaded. With the server stopped a sync fails, the last usage read stays in
// force (a cut-off region keeps its allowance, never a fresh one), raised by what the
// gateway saw itself, and the counters seen meanwhile are reported once the server is
// back.
func TestTrackerSyncs(t *testing.T) {
	pg := testenv.PostgresServer(t)
	ctx := context.Background()
	st, err := store.Open(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	reg := prometheus.NewRegistry()
	east, err := New("us-east", st, Options{Now: func() time.Time { return now }, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	west, err := New("eu-west", st, Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	start, _ := regions.Band{Name: "month", Capacity: 100, Period: regions.PeriodMonth}.Window(now)
	k := regions.QuotaKey{Tenant: "t", Route: "r", Band: "month", Start: start.Unix()}
	if _, loaded := west.Usage(k); loaded {
		t.Fatal("loaded before the first sync")
	}
	east.Saw(k, 30)
	east.Saw(k, 20) // an older answer of the same counter
	west.Saw(k, 5)
	for _, tr := range []*Tracker{east, west, east} {
		if err := tr.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if u, _ := east.Usage(k); u != (regions.QuotaUsage{Mine: 30, Total: 35}) {
		t.Errorf("us-east reads %+v, want mine 30 of 35", u)
	}
	if u, _ := west.Usage(k); u.Mine != 5 || u.Total < 5 {
		t.Errorf("eu-west reads %+v, want mine 5", u)
	}
	east.Saw(k, 25) // a late report below what the store holds
	if err := east.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if u, _ := east.Usage(k); u != (regions.QuotaUsage{Mine: 30, Total: 35}) {
		t.Errorf("after a lower report us-east reads %+v, want 30 of 35 still", u)
	}

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	east.Saw(k, 40)
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	if err := east.Sync(sctx); err == nil {
		t.Error("a sync with the server stopped succeeded")
	}
	cancel()
	// The last read stays, with what this gateway saw itself on top: 40 of 45.
	if u, loaded := east.Usage(k); !loaded || u != (regions.QuotaUsage{Mine: 40, Total: 45}) {
		t.Errorf("with the store down us-east reads %+v (loaded %v), want the last read and its own 40, 40 of 45", u, loaded)
	}
	if n := testutil.ToFloat64(east.errors); n < 1 {
		t.Errorf("ratelimit_quota_sync_errors_total %v, want at least 1", n)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for east.Sync(ctx) != nil { // the pool reconnects
		if time.Now().After(deadline) {
			t.Fatal("no sync within 20 s of the restart")
		}
		time.Sleep(100 * time.Millisecond) // polling a real server's restart; no clock to inject
	}
	if u, _ := east.Usage(k); u != (regions.QuotaUsage{Mine: 40, Total: 45}) {
		t.Errorf("after the store came back us-east reads %+v, want the 40 it saw meanwhile, of 45", u)
	}
}
