package stack

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestStackTail is issue 22's "Done when" on the real two-region stack (PostgreSQL, two
// Redis, Prometheus scraping the four gateways, the rebalancer every 4 s):
//
//  1. shop-a (capacity 20, refill 20/s, no share rows of its own) sends all its 30 rps
//     to us-east while trickle tenants (no rule, no rows, 0.3 rps each) come and go in
//     eu-west. In every 15 s window shop-a is admitted at least at the equal split
//     (10/s), and from the second on at its limit there (19/s at the 0.95 cap: its pair
//     gets rows of its own, as nothing is folded into _other in eu-west). Before the
//     fix "*" went to us-east 0.05 on the first trickle and shop-a got 1/s.
//  2. shop-a stops; only the trickle (below the minimum demand) remains: "*" never moves,
//     and in neither phase does "*" move towards the trickle's region (eu-west above 0.5).
//  3. `ratectl regions add ap-south` of a dark region: no advertised limit
//     (X-RateLimit-Limit) changes by more than the floor (0.05 of its capacity, rounded
//     up). Before the fix the new region took 1/3 and shop-a's limit fell 19 -> 13.
//
// The figures go to the log (docs/rebalancer.md quotes them).
func TestStackTail(t *testing.T) {
	ctx := context.Background()
	const window = 15 * time.Second
	s, err := Start(ctx, Options{RebalanceInterval: 4 * time.Second,
		Tenants: []Tenant{{ID: "shop-a", Capacity: 20, RefillPerSecond: 20}}})
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(s.Close)
	us, eu := s.Regions[0], s.Regions[1]
	actx := store.WithAudit(ctx, "test", "trickle tenants")
	trickle := []string{"trickle-1", "trickle-2", "trickle-3"}
	for _, id := range trickle {
		secret, _, err := s.Store.CreateKey(actx, id, "test")
		if err != nil {
			t.Fatal(err)
		}
		s.Keys[id] = secret
	}

	// Phase 1: 60 s of shop-a in us-east, trickles coming and going in eu-west.
	const phase1 = 4 * window
	live := &loadgen.Counts{}
	var streams []loadgen.Stream
	for _, g := range s.GatewaysOf(us) {
		streams = append(streams, loadgen.Stream{Name: "shop-a/" + g.ID, Method: http.MethodPost, URL: g.URL + "/orders",
			Header: http.Header{"X-Api-Key": {s.Keys["shop-a"]}}, Rate: loadgen.Steps([]time.Duration{phase1}, []float64{15, 0})})
	}
	comeAndGo := [][]time.Duration{{0, 25 * time.Second}, {15 * time.Second, 45 * time.Second}, {35 * time.Second, 200 * time.Second}}
	for k, id := range trickle {
		g := s.GatewaysOf(eu)[k%2]
		on := comeAndGo[k]
		streams = append(streams, loadgen.Stream{Name: id, Method: http.MethodPost, URL: g.URL + "/orders",
			Header: http.Header{"X-Api-Key": {s.Keys[id]}}, Rate: loadgen.Steps(on, []float64{0, 0.3, 0})})
	}
	admitted := func() float64 {
		n := 0.0
		for name, codes := range live.Snapshot() {
			if len(name) > 7 && name[:7] == "shop-a/" {
				n += float64(codes[http.StatusOK])
			}
		}
		return n
	}
	const total = phase1 + 3*4*time.Second + 5*time.Second
	done := make(chan []loadgen.Result, 1)
	go func() {
		res, err := loadgen.Run(ctx, streams, total, live)
		if err != nil {
			t.Errorf("load: %v", err)
		}
		done <- res
	}()
	start := time.Now()
	prev := 0.0
	var perWindow []float64
	for w := 1; w <= int(phase1/window); w++ {
		time.Sleep(time.Until(start.Add(time.Duration(w) * window)))
		now := admitted()
		perWindow = append(perWindow, (now-prev)/window.Seconds())
		prev = now
	}
	t.Logf("shop-a admitted in us-east per 15 s window: %.1f/s (limit 20/s, equal split 10/s, at the 0.95 cap 19/s)", perWindow)
	for w, rps := range perWindow {
		if rps < 0.95*10 {
			t.Errorf("window %d: shop-a admitted %.1f/s in us-east, below the equal split (10/s)", w+1, rps)
		}
		if w >= 1 && rps < 0.9*19 {
			t.Errorf("window %d: shop-a admitted %.1f/s, want its limit where its traffic is (19/s) once the rebalancer has split it", w+1, rps)
		}
	}
	snap, err := s.Store.LoadSnapshot(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	star := map[string]float64{}
	for _, r := range s.Regions {
		star[r], _ = snap.Share(r, "trickle-9", Route)
	}
	t.Logf("* after phase 1: %v", star)

	// Phase 2: shop-a has stopped; the trickle alone must not move "*" (3 intervals).
	before := historyCount(t, s, regions.GlobalScope)
	time.Sleep(3*4*time.Second + 2*time.Second)
	if after := historyCount(t, s, regions.GlobalScope); after != before {
		t.Errorf("* written %d times on the trickle alone (below the minimum demand), want 0\nrebalancer log:\n%s", after-before, tailFile(s.Rebalancer.LogPath()))
	}
	// Neither phase may have moved "*" towards the trickle's region: every "*" share
	// eu-west ever had is at most the equal split.
	h, err := s.Store.History(ctx, store.HistoryFilter{Scope: &regions.GlobalScope})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range h {
		if e.Region == eu && e.New != nil && *e.New > 0.5+1e-9 {
			t.Errorf("* moved to the trickle: %s %s -> %v (%q)", e.At.Format("15:04:05"), e.Region, *e.New, e.Reason)
		}
	}
	res := <-done
	for _, r := range res {
		for code, n := range r.Codes {
			if code != http.StatusOK && code != http.StatusTooManyRequests {
				t.Errorf("stream %s: %d responses with status %d", r.Name, n, code)
			}
		}
	}

	// Phase 3: a dark region added with ratectl.
	limitsBefore := advertised(t, s)
	ratectl := filepath.Join(t.TempDir(), "ratectl")
	root, err := testenv.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", ratectl, "./cmd/ratectl")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build ratectl: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, ratectl, "regions", "add", "ap-south", "--reason", "new region, no gateways yet")
	cmd.Env = append(cmd.Environ(), "RATELIMIT_DATABASE_URL="+s.DatabaseURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ratectl regions add: %v\n%s", err, out)
	}
	t.Logf("ratectl regions add ap-south: %s", out)
	time.Sleep(3 * time.Second) // NOTIFY reaches every gateway well within this
	limitsAfter := advertised(t, s)
	defer func() {
		if !t.Failed() {
			return
		}
		h, _ := s.Store.History(ctx, store.HistoryFilter{Limit: 20})
		for _, e := range h {
			t.Logf("history: %s %s %s %s %v -> %v %q", e.At.Format("15:04:05.000"), e.Scope, e.Region, e.Source, deref(e.Old), deref(e.New), e.Reason)
		}
		t.Logf("rebalancer log:\n%s", tailFile(s.Rebalancer.LogPath()))
	}()
	floor := store.NewRegionShare(3)
	for k, b := range limitsBefore {
		a := limitsAfter[k]
		bound := math.Ceil(floor * float64(k.capacity))
		t.Logf("%s in %s: X-RateLimit-Limit %d -> %d (bound %v)", k.tenant, k.gateway, b, a, bound)
		if math.Abs(float64(a-b)) > bound {
			t.Errorf("%s in %s: advertised limit %d -> %d after adding a dark region, more than the floor (%v)", k.tenant, k.gateway, b, a, bound)
		}
	}
}

type limitKey struct {
	tenant, gateway string
	capacity        int64
}

// advertised is the X-RateLimit-Limit the gateways advertise: for trickle-1 (it follows
// "*") read from the "*" share every gateway exports (ratelimit_region_share_ratio,
// scaled as the limiter does), so that reading it is no demand; for shop-a (its own rows
// once the rebalancer has split it) from one real answer per region. A request per
// gateway and tenant is itself demand, above the minimum at the stack's 4 s window, and
// moved "*" in an earlier version of this test.
func advertised(t *testing.T, s *Stack) map[limitKey]int {
	t.Helper()
	out := map[limitKey]int{}
	for _, g := range s.Gateways {
		out[limitKey{"trickle-1", g.ID, 20}] = int(regions.Scale(20, 20, gatewayShare(t, g)).Capacity)
	}
	for _, r := range s.Regions {
		g := s.GatewaysOf(r)[0]
		req, err := http.NewRequest(http.MethodPost, g.URL+"/orders", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", s.Keys["shop-a"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		v, err := strconv.Atoi(resp.Header.Get("X-RateLimit-Limit"))
		if err != nil {
			t.Fatalf("shop-a at %s: X-RateLimit-Limit %q: %v", g.ID, resp.Header.Get("X-RateLimit-Limit"), err)
		}
		out[limitKey{"shop-a", g.ID, 20}] = v
	}
	return out
}

// gatewayShare reads g's ratelimit_region_share_ratio{scope="*"}.
func gatewayShare(t *testing.T, g *Gateway) float64 {
	t.Helper()
	resp, err := http.Get(g.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "ratelimit_region_share_ratio{") && strings.Contains(line, `scope="*"`) {
			v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", g.ID, line, err)
			}
			return v
		}
	}
	t.Fatalf("%s exports no ratelimit_region_share_ratio{scope=\"*\"}", g.ID)
	return 0
}

// historyCount is the number of share-history rows of scope.
func historyCount(t *testing.T, s *Stack, sc regions.Scope) int {
	t.Helper()
	h, err := s.Store.History(context.Background(), store.HistoryFilter{Scope: &sc})
	if err != nil {
		t.Fatal(fmt.Errorf("history: %w", err))
	}
	return len(h)
}

func deref(p *float64) any {
	if p == nil {
		return "-"
	}
	return *p
}
