package stack

import (
	"context"
	"math"
	"net/http"
	"os"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/e2e/deploycheck"
	"github.com/quotaplane/quotaplane/e2e/loadgen"
)

// TestStackSharesFollowDemand is the demo as a test: the whole stack, one tenant above its
// limit whose traffic moves from 70/30 to 30/70; the shares must follow, no gateway may
// answer 5xx, and every client must be either admitted or told 429.
func TestStackSharesFollowDemand(t *testing.T) {
	ctx := context.Background()
	s, err := Start(ctx, Options{RebalanceInterval: 4 * time.Second})
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(s.Close)

	const phase = 25 * time.Second
	a, b := s.Regions[0], s.Regions[1]
	live := &loadgen.Counts{}
	var streams []loadgen.Stream
	for _, g := range s.Gateways {
		rate := loadgen.Steps([]time.Duration{phase}, []float64{105, 45})
		if g.Region == b {
			rate = loadgen.Steps([]time.Duration{phase}, []float64{45, 105})
		}
		streams = append(streams, loadgen.Stream{
			Name: g.Region, Method: http.MethodPost, URL: g.URL + "/orders",
			Header: http.Header{"X-Api-Key": []string{s.Keys["shop-a"]}},
			Rate:   func(e time.Duration) float64 { return rate(e) / 2 },
		})
	}
	done := make(chan []loadgen.Result, 1)
	go func() {
		res, err := loadgen.Run(ctx, streams, 2*phase, live)
		if err != nil {
			t.Errorf("load: %v", err)
		}
		done <- res
	}()

	// Phase one: us-east (a) offers 70%. The water-filling answer above the limit is 0.7.
	waitShare(t, s, a, 0.7, 0.05, phase)
	// Phase two: the demand flips.
	waitShare(t, s, a, 0.3, 0.05, phase+5*time.Second)

	res := <-done
	for _, r := range res {
		for code, n := range r.Codes {
			if code != http.StatusOK && code != http.StatusTooManyRequests {
				t.Errorf("stream %s: %d responses with status %d (want only 200 and 429)", r.Name, n, code)
			}
		}
	}
	checkDashboards(t, s)

	// Each component connected as its own role (issue 25): the rebalancer's share writes
	// name its login role as the actor, and the gateways hold sessions as theirs.
	var written, gatewaySessions int
	if err := s.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM region_share_history
		WHERE actor = 'stack_rebalancer' AND on_behalf_of = 'rebalancer'`).Scan(&written); err != nil || written == 0 {
		t.Errorf("%d share history rows by the role stack_rebalancer on behalf of rebalancer (%v), want some", written, err)
	}
	if err := s.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = 'stack_gateway'`).Scan(&gatewaySessions); err != nil || gatewaySessions == 0 {
		t.Errorf("%d sessions of the role stack_gateway (%v), want the gateways'", gatewaySessions, err)
	}
}

// waitShare polls the store until region's share of shop-a/orders is within tol of want,
// failing after limit. Polling a running control loop: there is no clock to inject.
func waitShare(t *testing.T, s *Stack, region string, want, tol float64, limit time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(limit)
	var got float64
	for time.Now().Before(deadline) {
		snap, err := s.Store.LoadSnapshot(ctx, 3*time.Second)
		if err == nil {
			got, _ = snap.Share(region, "shop-a", Route)
			if math.Abs(got-want) <= tol {
				t.Logf("%s share of shop-a reached %.3f (want %.2f±%.2f)", region, got, want, tol)
				return
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s share of shop-a is %.3f after %v, want %.2f±%.2f\nrebalancer log:\n%s", region, got, limit, want, tol, tailFile(s.Rebalancer.LogPath()))
}

func tailFile(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// query runs one PromQL expression against the stack's Prometheus.
func query(ctx context.Context, s *Stack, expr string) (model.Value, error) {
	c, err := promapi.NewClient(promapi.Config{Address: s.Prometheus.URL()})
	if err != nil {
		return nil, err
	}
	v, _, _, err := promv1.NewAPI(c).Query(ctx, expr, time.Now())
	return v, err
}

func hasData(v model.Value) bool {
	switch x := v.(type) {
	case model.Vector:
		return len(x) > 0
	case model.Matrix:
		return len(x) > 0
	case *model.Scalar:
		return true
	}
	return false
}

// checkDashboards runs every dashboard panel's query against the stack's Prometheus and
// requires data: a panel that shows nothing on a live stack is a broken panel.
func checkDashboards(t *testing.T, s *Stack) {
	t.Helper()
	qs, err := deploycheck.Queries()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, q := range qs {
		v, err := query(ctx, s, q.Expr)
		if err != nil {
			t.Errorf("panel %q: query %s: %v", q.Panel, q.Expr, err)
			continue
		}
		if !hasData(v) {
			t.Errorf("panel %q: query %s returned no data on the live stack", q.Panel, q.Expr)
		}
	}
}
