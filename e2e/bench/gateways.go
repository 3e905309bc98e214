package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// The gateways' one tenant, key and route. The rule is so large that it never throttles
// (every request is a full decision that admits), and lua.MaxCapacity allows it.
const (
	benchTenant   = "bench"
	benchKey      = "bench-key"
	benchRoute    = "orders"
	benchCapacity = 1_000_000_000_000
	benchRefill   = 1_000_000_000
)

// gatewaySpec is one gateway process to start.
type gatewaySpec struct {
	name     string
	redisURL string        // "" = the local limiter (standalone, per instance)
	timeout  time.Duration // redis.timeout; 0 = the gateway's default, 5 ms
	database string        // "" = standalone: one tenant, one key, one rule from the file
	upstream string
	pprof    string // non-empty: run as this program's profiled child with pprof here
}

// gatewayProc is a running gateway.
type gatewayProc struct {
	name   string
	url    string // the proxy
	admin  string // /metrics /readyz
	config string
	proc   *testenv.Process
}

func (s gatewaySpec) yaml(port, admin int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "region: bench\ninstance_id: %s\nlisten: 127.0.0.1:%d\nadmin_listen: 127.0.0.1:%d\nlog_level: warn\n", s.name, port, admin)
	if s.redisURL != "" {
		// The gateway's defaults (5 ms timeout, breaker after 5 failures, open 1 s),
		// written out so the document can say what was measured.
		timeout := s.timeout
		if timeout == 0 {
			timeout = 5 * time.Millisecond
		}
		fmt.Fprintf(&b, "redis: {url: %q, timeout: %s, breaker: {failures: 5, open_for: 1s}}\n", s.redisURL, timeout)
	}
	fmt.Fprintf(&b, "routes:\n  - id: %s\n    match: \"/orders\"\n    upstream: %q\n", benchRoute, s.upstream)
	if s.database != "" {
		fmt.Fprintf(&b, "database_url: %q\nreload_interval: 1m\nheartbeat_interval: 5s\n", s.database)
		return b.String()
	}
	fmt.Fprintf(&b, "tenants:\n  - id: %s\n    keys: [{secret: %s}]\n    rules: [{route: %s, capacity: %d, refill_per_second: %d}]\n",
		benchTenant, benchKey, benchRoute, benchCapacity, benchRefill)
	return b.String()
}

// startGateway writes the spec's configuration and starts the gateway, ready when its
// /readyz answers 200 (a snapshot is loaded).
func (b *bench) startGateway(ctx context.Context, s gatewaySpec) (*gatewayProc, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	admin, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.work, s.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte(s.yaml(port, admin)), 0o600); err != nil {
		return nil, err
	}
	g := &gatewayProc{
		name: s.name, config: cfg,
		url:   "http://127.0.0.1:" + strconv.Itoa(port),
		admin: "http://127.0.0.1:" + strconv.Itoa(admin),
	}
	ready := testenv.HTTPReady(g.admin + "/readyz")
	if s.pprof != "" {
		g.proc, err = b.startChild(ctx, "gateway", s.name, port, g.admin+"/readyz", envConfig+"="+cfg, envListen+"="+s.pprof)
	} else {
		g.proc, err = testenv.StartCommand(ctx, testenv.Command{
			Name: "gateway", Path: b.gatewayBin, Args: []string{"--config", cfg},
			Dir: dir, Port: port, Ready: ready,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("gateway %s: %w", s.name, err)
	}
	return g, nil
}

// pid finds the gateway's process: a child of this process whose command line names its
// configuration file (internal/testenv does not export the pid).
func (g *gatewayProc) pid() (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(self) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if strings.Contains(string(cmdline), g.config) || strings.Contains(string(environ), g.config) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("gateway %s: no child process with %s", g.name, g.config)
}

// procStatus reads VmRSS and VmHWM (bytes) of a process.
func procStatus(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status %s: %w", pid, sc.Text(), err)
		}
		if k == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
	}
	return rss, hwm, sc.Err()
}

// scrape reads the gateway's /metrics: the sum of every sample of each named metric
// whose labels contain all of match (label="value" pairs), keyed by metric name + match.
type metricsText string

func (g *gatewayProc) metrics(ctx context.Context) (metricsText, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.admin+"/metrics", nil)
	if err != nil {
		return "", err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("gateway %s metrics: %w", g.name, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("gateway %s metrics: status %d: %v", g.name, res.StatusCode, err)
	}
	return metricsText(body), nil
}

// sum adds the samples of metric name whose label set contains every "k=\"v\"" in match.
func (m metricsText) sum(name string, match ...string) float64 {
	var total float64
	for line := range strings.Lines(string(m)) {
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue // a longer metric name
		}
		ok := true
		for _, kv := range match {
			if !strings.Contains(rest, kv) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err == nil {
			total += v
		}
	}
	return total
}
