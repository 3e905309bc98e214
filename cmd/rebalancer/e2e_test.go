package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// The end-to-end test of issue 5: two regions, each with its own Redis and a real gateway
// process; one Prometheus scraping both every second; the rebalancer as a real process
// with an interval of a few seconds, and a second one that must change nothing.

const (
	e2eInterval = 4 * time.Second
	e2eCapacity = 20
	e2eRefill   = 20.0
	// Offered load, requests per second: 70/30 of 50, well above the global 20.
	e2eHigh, e2eLow = 35.0, 15.0
)

var e2ePair = regions.Scope{Tenant: "shop-a", Route: "create-order"}

// buildBinaries builds cmd/gateway and cmd/rebalancer into a temporary directory.
func buildBinaries(t *testing.T) (gateway, rebalancerBin string) {
	t.Helper()
	return buildBinary(t, "gateway"), buildBinary(t, "rebalancer")
}

// buildBinary builds cmd/NAME into a temporary directory and returns its path.
func buildBinary(t *testing.T, name string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(t.TempDir(), name)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if b, err := exec.CommandContext(ctx, goBin, "build", "-o", out,
		"github.com/quotaplane/quotaplane/cmd/"+name).CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/%s: %v\n%s", name, err, b)
	}
	return out
}

// process is a binary started by the test, stopped (SIGTERM, then SIGKILL) at cleanup.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

func startProcess(t *testing.T, name, bin string, env []string, args ...string) *process {
	t.Helper()
	p := &process{name: name, logPath: filepath.Join(t.TempDir(), name+".log"), exited: make(chan struct{})}
	logf, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		_ = logf.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.logPath)
			t.Logf("%s log (last 3000 bytes):\n%s", name, b[max(0, len(b)-3000):])
		}
	})
	return p
}

func (p *process) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// waitHTTP polls url until it answers 200, failing if p exits or within seconds.
func waitHTTP(t *testing.T, p *process, url string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		select {
		case <-p.exited:
			t.Fatalf("%s exited at start", p.name)
		default:
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not 200 within %s", p.name, url, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scrapeValue reads one sample of a text exposition: the line starting with series.
func scrapeValue(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("scrape %s: %s: %v", url, series, err)
			}
			return v
		}
	}
	return 0
}

// driver sends POST /orders to each region's gateway at a set rate and counts answers.
type driver struct {
	key   string
	urls  map[string]string
	rates sync.Map // region -> float64 rps
	ok    map[string]*atomic.Int64
	other map[string]*atomic.Int64
	wg    sync.WaitGroup
}

func startDriver(t *testing.T, key string, urls map[string]string) *driver {
	d := &driver{key: key, urls: urls, ok: map[string]*atomic.Int64{}, other: map[string]*atomic.Int64{}}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // bounded whatever happens
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	for region, url := range urls {
		d.ok[region], d.other[region] = new(atomic.Int64), new(atomic.Int64)
		d.rates.Store(region, 0.0)
		d.wg.Go(func() {
			sem := make(chan struct{}, 32)
			next := time.Now()
			for ctx.Err() == nil {
				rate, _ := d.rates.Load(region)
				if r := rate.(float64); r > 0 {
					next = next.Add(time.Duration(float64(time.Second) / r))
				} else {
					next = time.Now().Add(50 * time.Millisecond)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Until(next)):
				}
				if r := rate.(float64); r <= 0 || ctx.Err() != nil {
					continue
				}
				select {
				case sem <- struct{}{}:
				default:
					d.other[region].Add(1) // the gateway is too slow: counts as a failure
					continue
				}
				d.wg.Go(func() {
					defer func() { <-sem }()
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/orders", nil)
					req.Header.Set("X-Api-Key", d.key)
					resp, err := client.Do(req)
					if err != nil {
						if ctx.Err() == nil {
							d.other[region].Add(1)
						}
						return
					}
					resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusOK:
						d.ok[region].Add(1)
					case http.StatusTooManyRequests:
					default:
						d.other[region].Add(1)
					}
				})
			}
		})
	}
	t.Cleanup(func() { cancel(); d.wg.Wait() })
	return d
}

func (d *driver) set(rates map[string]float64) {
	for r, v := range rates {
		d.rates.Store(r, v)
	}
}

func TestEndToEnd(t *testing.T) {
	gwBin, rbBin := buildBinaries(t)
	ctx := t.Context()

	// Control plane: two regions, a rule for shop-a, its key, shares starting at 50/50.
	dbURL := testenv.PostgresDB(t)
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	regs := []string{"eu-west", "us-east"}
	for _, r := range regs {
		if err := st.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.SetRule(ctx, regions.Rule{Tenant: e2ePair.Tenant, Route: e2ePair.Route, Capacity: e2eCapacity, RefillPerSecond: e2eRefill}); err != nil {
		t.Fatal(err)
	}
	key, _, err := st.CreateKey(ctx, e2ePair.Tenant, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	start := []store.ShareChange{{Scope: e2ePair, Region: "us-east", New: 0.5}, {Scope: e2ePair, Region: "eu-west", New: 0.5}}
	if err := st.WriteRebalancerShares(ctx, start, map[string]string{"note": "e2e start"}, "e2e"); err != nil {
		t.Fatal(err)
	}

	// Data plane: an upstream, and per region a Redis and a gateway process.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(upstream.Close)
	urls, admins := map[string]string{}, map[string]string{}
	for _, r := range regs {
		rp := testenv.Redis(t)
		listen, admin := freeAddr(t), freeAddr(t)
		cfg := fmt.Sprintf(`region: %s
listen: %s
admin_listen: %s
redis: {timeout: 250ms}
reload_interval: 1s
heartbeat_interval: 500ms
log_level: warn
routes:
  - {id: create-order, match: "POST /orders", upstream: %q}
`, r, listen, admin, upstream.URL)
		path := filepath.Join(t.TempDir(), "gateway-"+r+".yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		p := startProcess(t, "gateway-"+r, gwBin, []string{"RATELIMIT_DATABASE_URL=" + dbURL, "RATELIMIT_REDIS_URL=" + testenv.RedisURL(rp)}, "--config", path)
		waitHTTP(t, p, "http://"+admin+"/readyz", 20*time.Second)
		urls[r], admins[r] = "http://"+listen, admin
	}
	prom := testenv.Prom(t, testenv.PrometheusOptions{ScrapeInterval: time.Second,
		Jobs: []testenv.ScrapeJob{{Name: "gateway", Targets: []string{admins["us-east"], admins["eu-west"]}}}})

	// 70/30 traffic above the limit, until Prometheus holds more than one interval of it.
	drv := startDriver(t, key, urls)
	drv.set(map[string]float64{"us-east": e2eHigh, "eu-west": e2eLow})
	waitSamples(t, prom.URL(), int(e2eInterval/time.Second)+2)

	// The rebalancer, and once it leads, a second one.
	rbArgs := func(admin string) []string {
		return []string{"--database-url", dbURL, "--prometheus-url", prom.URL(), "--interval", e2eInterval.String(),
			"--check-interval", "2s", "--short-window", "3s", "--reload-wait", "1500ms", "--instance-ttl", "3s",
			"--admin-listen", admin}
	}
	adminA, adminB := freeAddr(t), freeAddr(t)
	rbA := startProcess(t, "rebalancer-a", rbBin, nil, rbArgs(adminA)...)
	waitHTTP(t, rbA, "http://"+adminA+"/healthz", 20*time.Second)
	metricsA, metricsB := "http://"+adminA+"/metrics", "http://"+adminB+"/metrics"
	runsOK := func(url string) float64 { return scrapeValue(t, url, `ratelimit_rebalancer_runs_total{result="ok"}`) }
	deadline := time.Now().Add(20 * time.Second)
	for runsOK(metricsA) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("rebalancer a: no successful run within 20 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	rbB := startProcess(t, "rebalancer-b", rbBin, nil, rbArgs(adminB)...)
	waitHTTP(t, rbB, "http://"+adminB+"/healthz", 20*time.Second)

	// Within 3 runs the shares are within 0.05 of the water-filling answer.
	want := waterfill(t, map[string]float64{"us-east": e2eHigh, "eu-west": e2eLow})
	pairShares := func() map[string]float64 {
		all, err := st.Shares(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, s := range all {
			if s.Scope == e2ePair && s.Source == regions.SourceRebalancer {
				out[s.Region] = s.Share
			}
		}
		return out
	}
	var got map[string]float64
	for {
		got = pairShares()
		if math.Abs(got["us-east"]-want["us-east"]) <= 0.05 && math.Abs(got["eu-west"]-want["eu-west"]) <= 0.05 {
			break
		}
		if n := runsOK(metricsA); n >= 3 {
			t.Fatalf("after %v runs: shares %v, want within 0.05 of %v", n, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("converged after %v runs: %v (water-filling %v)", runsOK(metricsA), got, want)

	// Each gateway enforces its new limit: admitted ~ refill x share over a window.
	time.Sleep(3 * time.Second) // NOTIFY reload (< 1 s) and the old buckets' tokens drained
	before := map[string]int64{}
	for _, r := range regs {
		before[r] = drv.ok[r].Load()
	}
	const window = 10 * time.Second
	time.Sleep(window)
	// A move of a few thousandths (a later run refining the split) changes the expected
	// admissions by less than the bounds below allow; a real move invalidates the window.
	if now := pairShares(); math.Abs(now["us-east"]-got["us-east"]) > 0.01 {
		t.Fatalf("shares moved during the measurement: %v -> %v", got, now)
	} else if now["us-east"] != got["us-east"] {
		t.Logf("shares refined during the measurement: %v -> %v", got, now)
	}
	for _, r := range regs {
		admitted := float64(drv.ok[r].Load() - before[r])
		limit := regions.Scale(e2eCapacity, e2eRefill, got[r])
		expect := limit.RefillPerSecond * window.Seconds()
		t.Logf("%s: admitted %v in %s at share %.3f (refill %.2f/s)", r, admitted, window, got[r], limit.RefillPerSecond)
		if admitted < 0.85*expect || admitted > 1.1*expect+float64(limit.Capacity) {
			t.Errorf("%s admitted %v in %s, want about %.0f (share %.3f of %v/s)", r, admitted, window, expect, got[r], e2eRefill)
		}
		if n := drv.other[r].Load(); n != 0 {
			t.Errorf("%s: %d requests neither 200 nor 429", r, n)
		}
	}

	// The second rebalancer changed nothing: it never ran, it only waited for the lock.
	if ok, writes, refused := runsOK(metricsB), scrapeValue(t, metricsB, "ratelimit_rebalancer_share_writes_total"),
		scrapeValue(t, metricsB, `ratelimit_rebalancer_runs_total{result="not_leader"}`); ok != 0 || writes != 0 || refused < 1 {
		t.Errorf("second rebalancer: %v ok runs, %v share writes, %v refusals; want 0, 0, >= 1", ok, writes, refused)
	}

	// Prometheus stops: runs are skipped and counted; shares stay, even as demand flips.
	if err := prom.Stop(); err != nil {
		t.Fatal(err)
	}
	drv.set(map[string]float64{"us-east": e2eLow, "eu-west": e2eHigh})
	skipped := func() float64 {
		return scrapeValue(t, metricsA, `ratelimit_rebalancer_runs_total{result="skipped_prometheus"}`)
	}
	deadline = time.Now().Add(4 * e2eInterval)
	for skipped() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no 2 skipped runs within %s of stopping Prometheus", 4*e2eInterval)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if now := pairShares(); now["us-east"] != got["us-east"] || now["eu-west"] != got["eu-west"] {
		t.Errorf("shares changed with Prometheus down: %v -> %v", got, now)
	}
	if writes := scrapeValue(t, metricsB, "ratelimit_rebalancer_share_writes_total"); writes != 0 {
		t.Errorf("second rebalancer wrote %v shares", writes)
	}
}

// waterfill is the production allocation's answer for offered rates fully known.
func waterfill(t *testing.T, offered map[string]float64) map[string]float64 {
	t.Helper()
	var in []rebalancer.RegionInput
	for _, r := range []string{"eu-west", "us-east"} {
		rt := rebalancer.Rates{Allowed: offered[r]}
		in = append(in, rebalancer.RegionInput{Region: r, Status: rebalancer.StatusOK, Long: rt, Short: rt, Share: 0.5})
	}
	a, err := rebalancer.Allocate(rebalancer.DefaultConfig(2), regions.Limit{Capacity: e2eCapacity, RefillPerSecond: e2eRefill},
		time.Now(), in, rebalancer.State{})
	if err != nil {
		t.Fatal(err)
	}
	return a.Shares
}
