package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// binDir holds the gateway binary, built once per test binary.
var binDir string

func TestMain(m *testing.M) {
	code := testenv.RunTests(m)
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// seen is what the test upstream received.
type seen struct {
	Method, Path, Tenant, APIKey, ForwardedFor, ForwardedHost string
	TenantValues                                              int
}

// newUpstream is an HTTP upstream that answers 200 with what it received as JSON, after
// delay (for drain tests).
func newUpstream(t testing.TB, delay time.Duration) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if delay > 0 {
			time.Sleep(delay)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-RateLimit-Limit", "999999") // the gateway's own header must win
		_ = json.NewEncoder(w).Encode(seen{
			Method: r.Method, Path: r.URL.Path,
			Tenant: r.Header.Get("X-Tenant-Id"), TenantValues: len(r.Header.Values("X-Tenant-Id")),
			APIKey: r.Header.Get("X-Api-Key"), ForwardedFor: r.Header.Get("X-Forwarded-For"),
			ForwardedHost: r.Header.Get("X-Forwarded-Host"),
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// articleConfig is the article's scenario: shop-a may POST /orders twice (capacity 2).
func articleConfig(region, upstream, redisURL string) Config {
	return Config{
		Region:      region,
		Redis:       RedisConfig{URL: redisURL},
		DefaultRule: RuleConfig{Capacity: 20, RefillPerSecond: 10},
		Routes: []RouteConfig{
			{ID: "create-order", Match: "POST /orders", Upstream: upstream},
			{ID: "get-order", Match: "GET /orders/{id}", Upstream: upstream},
		},
		Tenants: []TenantConfig{
			{ID: "shop-a", Keys: []KeyConfig{{Secret: "key-shop-a"}}, Rules: []TenantRuleConfig{
				{Route: "create-order", Capacity: 2, RefillPerSecond: 0.5},
			}},
			{ID: "shop-b", Keys: []KeyConfig{{Secret: "key-shop-b"}}, Rules: []TenantRuleConfig{
				{Route: "*", Capacity: 1, RefillPerSecond: 0.01, Shadow: true},
			}},
		},
	}
}

// inProcess is a gateway served by httptest (no Run: standalone needs none).
type inProcess struct {
	g     *Gateway
	srv   *httptest.Server
	admin *httptest.Server
	reg   *prometheus.Registry
}

func newInProcess(t testing.TB, cfg Config) *inProcess {
	t.Helper()
	reg := prometheus.NewRegistry()
	g, err := New(cfg, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	p := &inProcess{g: g, srv: httptest.NewServer(g.Handler()), admin: httptest.NewServer(g.AdminHandler()), reg: reg}
	t.Cleanup(func() {
		p.srv.Close()
		p.admin.Close()
		if g.rdb != nil {
			_ = g.rdb.Close()
		}
	})
	return p
}

var testClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 0},
}

// call sends one request and reads the whole response.
func call(t testing.TB, method, url, key string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp, body
}

// metrics is one scrape, by family name.
type scrape map[string]*dto.MetricFamily

func scrapeURL(t testing.TB, adminURL string) scrape {
	t.Helper()
	resp, err := testClient.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", adminURL, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: parse: %v", adminURL, err)
	}
	return fams
}

// sum adds the values of name's series whose labels include every pair in match
// ("k", "v", ...). It returns -1 if the family does not exist.
func (s scrape) sum(name string, match ...string) float64 {
	f, ok := s[name]
	if !ok {
		return -1
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		if !testenv.LabelsMatch(m, match) {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	return total
}

// series counts name's series whose labels include match.
func (s scrape) series(name string, match ...string) int {
	n := 0
	for _, m := range s[name].GetMetric() {
		if testenv.LabelsMatch(m, match) {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds or timeout passes; it returns how long it took.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

var buildOnce struct {
	sync.Once
	path string
	err  error
}

// gatewayBinary builds cmd/gateway once per test binary.
func gatewayBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gateway-bin-")
		if err != nil {
			buildOnce.err = err
			return
		}
		binDir = dir
		buildOnce.path = filepath.Join(dir, "gateway")
		cmd := exec.Command("go", "build", "-o", buildOnce.path, "github.com/quotaplane/quotaplane/cmd/gateway")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build cmd/gateway: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

// proc is a gateway running as a real process.
type proc struct {
	cmd     *exec.Cmd
	url     string // the proxy
	admin   string // the admin endpoints
	logPath string
	exited  chan struct{}
	err     error
}

// startProc writes cfg (YAML, with listen and admin_listen appended) and starts the
// gateway binary with env; it waits until /healthz answers.
func startProc(t testing.TB, cfg string, env ...string) *proc {
	t.Helper()
	bin := gatewayBinary(t)
	dir := t.TempDir()
	lp, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ap, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg += fmt.Sprintf("\nlisten: 127.0.0.1:%d\nadmin_listen: 127.0.0.1:%d\n", lp, ap)
	cfgPath := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &proc{
		url:     fmt.Sprintf("http://127.0.0.1:%d", lp),
		admin:   fmt.Sprintf("http://127.0.0.1:%d", ap),
		logPath: filepath.Join(dir, "gateway.log"),
		exited:  make(chan struct{}),
	}
	logf, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, "--config", cfgPath)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		_ = logf.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("gateway log %s:\n%s", p.logPath, p.log())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-p.exited:
			t.Fatalf("gateway exited at start: %v\n%s", p.err, p.log())
		default:
		}
		if resp, err := testClient.Get(p.admin + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not healthy within 20s\n%s", p.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until /readyz says ready.
func (p *proc) waitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "gateway ready", func() bool {
		resp, err := testClient.Get(p.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// stop sends SIGTERM and waits for the exit (SIGKILL after 20 s).
func (p *proc) stop(t testing.TB) error {
	select {
	case <-p.exited:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("gateway did not stop within 20s of SIGTERM")
	}
	return p.err
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// logLines returns the JSON log records whose msg contains s.
func (p *proc) logLines(s string) []map[string]any {
	f, err := os.Open(p.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && strings.Contains(fmt.Sprint(rec["msg"]), s) {
			out = append(out, rec)
		}
	}
	return out
}

// database is a migrated control-plane database with regions.
type database struct {
	url   string
	store *store.Store
}

func newDatabase(t testing.TB, url string, regionNames ...string) *database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range regionNames {
		if err := st.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	return &database{url: url, store: st}
}

// forgetRaises deletes the raise markers the setup wrote (migrations/00008). A test
// that starts from an empty Redis has no bucket that a raise could have left full under
// the old limit, so its first requests may see the whole new one; a gateway cannot know
// that, so the test says it.
func (d *database) forgetRaises(t testing.TB) {
	t.Helper()
	if _, err := d.store.Pool().Exec(context.Background(), `DELETE FROM limit_raise`); err != nil {
		t.Fatal(err)
	}
}

func (d *database) setRule(t testing.TB, r regions.Rule) {
	t.Helper()
	if err := d.store.SetRule(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}

func (d *database) createKey(t testing.TB, tenant string) (string, regions.APIKey) {
	t.Helper()
	secret, k, err := d.store.CreateKey(context.Background(), tenant, "test")
	if err != nil {
		t.Fatal(err)
	}
	return secret, k
}

func (d *database) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := d.store.Pool().Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
