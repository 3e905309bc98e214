// Package rlsbench measures the gateway's Envoy rate-limit service (rls_listen) side by
// side with envoyproxy/ratelimit, built from source through the Go module proxy, on the
// same Redis: decisions per second and latency percentiles at 16 and 64 gRPC callers over
// 100k keys; and the latency the check endpoint adds to nginx (nginx + auth_request to
// /v1/check vs nginx alone) at a fixed 1,000 requests per second. It rewrites the
// figures between the rlsbench markers of docs/BENCHMARKS.md.
//
//	go run ./cmd/rlsbench [-duration 10s] [-keys 100000] [-callers 16,64] [-out docs/BENCHMARKS.md]
//
// Everything runs on loopback: one redis-server, the gateway binary, the ratelimit
// service, nginx and an in-process upstream. No code of envoyproxy/ratelimit is part of
// this repository: `go install` builds it into a temporary directory.
package rlsbench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// ratelimitModule is the envoyproxy/ratelimit version benchmarked (the newest the Go
// module proxy served when this was written).
const ratelimitModule = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

// Run measures, with the command line args, and writes progress to stdout.
func Run(ctx context.Context, args []string, stdout io.Writer) error { return run(ctx, args, stdout) }

type options struct {
	duration time.Duration
	keys     int
	callers  []int
	conns    int
	out      string
	checkRPS int
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rlsbench", flag.ContinueOnError)
	duration := fs.Duration("duration", 10*time.Second, "measured time per server and caller count")
	keys := fs.Int("keys", 100_000, "distinct descriptor values (buckets)")
	callers := fs.String("callers", "16,64", "concurrent gRPC callers, comma-separated")
	conns := fs.Int("conns", 4, "gRPC connections the callers share (the same for both servers)")
	out := fs.String("out", "docs/BENCHMARKS.md", "document whose rlsbench section is rewritten; empty prints only")
	checkRPS := fs.Int("check-rps", 1000, "request rate of the nginx check-endpoint measurement")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o := options{duration: *duration, keys: *keys, conns: *conns, out: *out, checkRPS: *checkRPS}
	for s := range strings.SplitSeq(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1024 {
			return fmt.Errorf("-callers: %q is not a count from 1 to 1024", s)
		}
		o.callers = append(o.callers, n)
	}
	if o.duration < time.Second || o.duration > 10*time.Minute || o.keys < 1 || o.keys > 10_000_000 || o.conns < 1 || o.conns > 64 || o.checkRPS < 1 || o.checkRPS > 100_000 {
		return errors.New("-duration 1s..10m, -keys 1..1e7, -conns 1..64, -check-rps 1..1e5")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	work, err := os.MkdirTemp("", "quotaplane-rlsbench-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	logf := func(format string, a ...any) {
		fmt.Fprintf(stdout, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}

	loadStart := loadAverageCPUs()
	logf("building the gateway and %s (load average %s)", ratelimitModule, loadStart)
	bin := filepath.Join(work, "bin")
	if err := goCmd(ctx, nil, "build", "-o", bin+"/", "./cmd/gateway"); err != nil {
		return err
	}
	rlBuild := goCmd(ctx, []string{"GOBIN=" + bin}, "install", ratelimitModule)
	if rlBuild != nil {
		logf("envoyproxy/ratelimit could not be built; measuring the gateway alone: %v", rlBuild)
	}

	redis, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: filepath.Join(work, "redis")})
	if err != nil {
		return err
	}
	defer func() { _ = redis.Kill() }()

	var rows []row
	gw, err := startGateway(ctx, work, filepath.Join(bin, "gateway"), redis.Addr())
	if err != nil {
		return err
	}
	defer func() { _ = gw.proc.Stop() }()
	for _, n := range o.callers {
		logf("quotaplane RLS, %d callers, %s", n, o.duration)
		r, err := load(ctx, gw.rls, o, n, func(k string) *rlcommon.RateLimitDescriptor {
			return desc("api_key", benchKey, "route", "bench", "user", k)
		})
		if err != nil {
			return err
		}
		r.server = "quotaplane gateway (rls_listen)"
		r.note = gw.sources(ctx)
		rows = append(rows, r)
		logf("  %s", r.line())
	}
	if rlBuild == nil {
		rl, err := startRatelimit(ctx, work, filepath.Join(bin, "service_cmd"), redis.Addr())
		if err != nil {
			return err
		}
		for _, n := range o.callers {
			logf("envoyproxy/ratelimit, %d callers, %s", n, o.duration)
			r, err := load(ctx, rl.Addr(), o, n, func(k string) *rlcommon.RateLimitDescriptor { return desc("user", k) })
			if err != nil {
				_ = rl.Stop()
				return err
			}
			r.server = "envoyproxy/ratelimit (redis, defaults)"
			rows = append(rows, r)
			logf("  %s", r.line())
		}
		_ = rl.Stop()
	}

	logf("nginx check endpoint at %d requests/s, %s each", o.checkRPS, o.duration)
	check, err := checkOverhead(ctx, work, gw, o)
	if err != nil {
		return err
	}
	for _, c := range check {
		logf("  %s", c.line())
	}

	doc := render(o, rows, check, rlBuild, loadStart)
	fmt.Fprint(stdout, doc)
	if o.out == "" {
		return nil
	}
	return testenv.RewriteBetween(o.out, markStart, markEnd, doc)
}

const benchKey = "bench-key"

func goCmd(ctx context.Context, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func freeAddr() (string, error) {
	p, err := testenv.FreePort()
	return "127.0.0.1:" + strconv.Itoa(p), err
}

// gateway is the gateway process and its addresses.
type gateway struct {
	proc              *testenv.Process
	listen, rls, admn string
}

// startGateway runs a standalone gateway: one tenant whose "bench" route is limited per
// value of the "user" descriptor entry (1000 tokens, 1000/s each, so the load is
// admitted), and a "check" route for the nginx measurement. The Redis timeout is 50 ms,
// not the 5 ms default, so that a busy 2-core machine measures Redis decisions rather
// than the fallback; the report shows the decisions' sources.
func startGateway(ctx context.Context, work, bin, redisAddr string) (*gateway, error) {
	g := &gateway{}
	var err error
	for _, a := range []*string{&g.listen, &g.rls, &g.admn} {
		if *a, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(work, "gateway")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`region: bench
listen: %q
admin_listen: %q
rls_listen: %q
log_level: warn
expected_instances: 1
redis: {url: "redis://%s/0", timeout: 50ms}
unauthenticated_limit: {disabled: true}
routes:
  - {id: bench, match: "GET /bench", upstream: "http://127.0.0.1:1", limit_by: "descriptor:user"}
  - {id: check, match: "/", upstream: "http://127.0.0.1:1"}
tenants:
  - id: bench
    keys: [{secret: %q}]
    rules:
      - {route: bench, capacity: 1000, refill_per_second: 1000}
      - {route: check, capacity: 1000000, refill_per_second: 1000000}
`, g.listen, g.admn, g.rls, redisAddr, benchKey)
	path := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(g.admn)
	p, _ := strconv.Atoi(port)
	g.proc, err = testenv.StartCommand(ctx, testenv.Command{
		Name: "gateway", Path: bin, Args: []string{"--config", path}, Dir: dir,
		Host: host, Port: p, Ready: testenv.HTTPReady("http://" + g.admn + "/readyz"),
	})
	return g, err
}

// sources sums the gateway's RLS decisions by source from /metrics.
func (g *gateway) sources(ctx context.Context) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.admn+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	sums := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "ratelimit_requests_total{") || !strings.Contains(line, `interface="rls"`) {
			continue
		}
		i := strings.Index(line, `source="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		src := line[i+8:]
		src = src[:strings.IndexByte(src, '"')]
		v, _ := strconv.ParseFloat(line[j+1:], 64)
		sums[src] += v
	}
	var parts []string
	for _, s := range []string{"redis", "fallback", "lease", "none"} {
		if sums[s] > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", s, sums[s]))
		}
	}
	return "decisions so far by source: " + strings.Join(parts, ", ")
}

// startRatelimit runs envoyproxy/ratelimit on the same Redis: one descriptor key "user",
// each value its own 1000/s limit (the same admission as the gateway's rule), statsd off,
// every other setting its default (no pipelining, pool of 10).
func startRatelimit(ctx context.Context, work, bin, redisAddr string) (*testenv.Process, error) {
	dir := filepath.Join(work, "ratelimit")
	if err := os.MkdirAll(filepath.Join(dir, "runtime", "ratelimit", "config"), 0o755); err != nil {
		return nil, err
	}
	conf := "domain: quotaplane\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000\n"
	if err := os.WriteFile(filepath.Join(dir, "runtime", "ratelimit", "config", "config.yaml"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	var grpcAddr, httpAddr, debugAddr string
	for _, a := range []*string{&grpcAddr, &httpAddr, &debugAddr} {
		var err error
		if *a, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	port := func(a string) string { _, p, _ := net.SplitHostPort(a); return p }
	gp, _ := strconv.Atoi(port(grpcAddr))
	return testenv.StartCommand(ctx, testenv.Command{
		Name: "ratelimit", Path: bin, Dir: dir, Host: "127.0.0.1", Port: gp,
		Env: []string{
			"USE_STATSD=false", "LOG_LEVEL=warn", "BACKEND_TYPE=redis",
			"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
			"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit",
			"RUNTIME_WATCH_ROOT=false",
			"HOST=127.0.0.1", "PORT=" + port(httpAddr),
			"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(grpcAddr),
			"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(debugAddr),
		},
		Ready: testenv.HTTPReady("http://" + httpAddr + "/healthcheck"),
	})
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// row is one measured load.
type row struct {
	server        string
	callers       int
	calls, errors int64
	overLimit     int64
	elapsed       time.Duration
	p50, p99      time.Duration
	note          string
}

func (r row) rate() float64 { return float64(r.calls) / r.elapsed.Seconds() }

func (r row) line() string {
	return fmt.Sprintf("%.0f decisions/s, p50 %s, p99 %s, %d errors, %d over limit", r.rate(), ms(r.p50), ms(r.p99), r.errors, r.overLimit)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// load runs callers closed-loop for o.duration after a 2 s warm-up, each sending one
// descriptor with a uniformly random key of o.keys.
func load(ctx context.Context, addr string, o options, callers int, mk func(key string) *rlcommon.RateLimitDescriptor) (row, error) {
	conns := make([]rlsv3.RateLimitServiceClient, o.conns)
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return row{}, err
		}
		defer c.Close()
		conns[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	var measuring atomic.Bool
	var calls, errs, over atomic.Int64
	lat := make([][]time.Duration, callers)
	warm := time.Now().Add(2 * time.Second)
	end := warm.Add(o.duration)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			c := conns[i%len(conns)]
			mine := make([]time.Duration, 0, 1<<16)
			for ctx.Err() == nil {
				now := time.Now()
				if now.After(end) {
					break
				}
				k := "u" + strconv.Itoa(rng.IntN(o.keys))
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				resp, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "quotaplane", Descriptors: []*rlcommon.RateLimitDescriptor{mk(k)}})
				cancel()
				d := time.Since(now)
				if !now.After(warm) {
					continue
				}
				measuring.Store(true)
				calls.Add(1)
				if err != nil {
					errs.Add(1)
					continue
				}
				if resp.OverallCode != rlsv3.RateLimitResponse_OK {
					over.Add(1)
				}
				mine = append(mine, d)
			}
			lat[i] = mine
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return row{}, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := row{callers: callers, calls: calls.Load(), errors: errs.Load(), overLimit: over.Load(), elapsed: o.duration}
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)*50/100], all[len(all)*99/100]
	}
	return r, nil
}

// checkRow is one open-loop nginx measurement.
type checkRow struct {
	name          string
	sent, errs    int64
	p50, p99, max time.Duration
	statuses      map[int]int64
}

func (c checkRow) line() string {
	return fmt.Sprintf("%s: %d requests, p50 %s, p99 %s, max %s, statuses %v, %d errors", c.name, c.sent, ms(c.p50), ms(c.p99), ms(c.max), c.statuses, c.errs)
}

// checkOverhead runs nginx with two servers in front of one upstream: the shipped
// deploy/nginx/quotaplane.conf (auth_request to the gateway's /v1/check) and the same
// proxying without auth_request, and sends each o.checkRPS requests per second for
// o.duration, open loop (latency counted from the intended send time).
func checkOverhead(ctx context.Context, work string, gw *gateway, o options) ([]checkRow, error) {
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = app.Serve(ln) }()
	defer app.Close()
	conf, err := os.ReadFile("deploy/nginx/quotaplane.conf")
	if err != nil {
		return nil, err
	}
	plain, err := freeAddr()
	if err != nil {
		return nil, err
	}
	site := strings.NewReplacer(
		"127.0.0.1:8080", gw.listen,
		"127.0.0.1:9000", ln.Addr().String(),
		"127.0.0.1:8000", "127.0.0.1:{{PORT}}",
	).Replace(string(conf)) + `
server {
    listen ` + plain + `;
    location / {
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_pass http://quotaplane_app;
    }
}
`
	ngx, err := testenv.StartNginx(ctx, testenv.NginxOptions{Dir: filepath.Join(work, "nginx"), HTTP: site})
	if err != nil {
		return nil, err
	}
	defer func() { _ = ngx.Stop() }()
	var rows []checkRow
	for _, t := range []struct{ name, url string }{
		{"nginx alone", "http://" + plain + "/orders"},
		{"nginx + auth_request /v1/check", "http://" + ngx.Addr() + "/orders"},
	} {
		r, err := openLoop(ctx, t.url, o.checkRPS, o.duration)
		if err != nil {
			return nil, err
		}
		r.name = t.name
		rows = append(rows, r)
	}
	return rows, nil
}

func openLoop(ctx context.Context, url string, rps int, d time.Duration) (checkRow, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	n := int(float64(rps) * d.Seconds())
	lat := make([]time.Duration, n)
	status := make([]int, n)
	var errs atomic.Int64
	interval := time.Second / time.Duration(rps)
	start := time.Now().Add(100 * time.Millisecond)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 512)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			select {
			case <-ctx.Done():
				return checkRow{}, ctx.Err()
			case <-time.After(w):
			}
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			req.Header.Set("X-Api-Key", benchKey)
			resp, err := client.Do(req)
			if err != nil {
				errs.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat[i], status[i] = time.Since(at), resp.StatusCode
		})
	}
	wg.Wait()
	r := checkRow{sent: int64(n), errs: errs.Load(), statuses: map[int]int64{}}
	var ok []time.Duration
	for i := range n {
		if status[i] != 0 {
			r.statuses[status[i]]++
			ok = append(ok, lat[i])
		}
	}
	slices.Sort(ok)
	if len(ok) > 0 {
		r.p50, r.p99, r.max = ok[len(ok)*50/100], ok[len(ok)*99/100], ok[len(ok)-1]
	}
	return r, nil
}

func render(o options, rows []row, check []checkRow, rlBuild error, loadStart string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s by `go run ./cmd/rlsbench` (`make bench-rls`): %d keys (uniform), %d gRPC connections shared by the callers, %s per row after a 2 s warm-up, one redis-server for both services, the load generator, both services, Redis and nginx all on this machine over loopback; load average %s at the start, %s at the end (the machine is shared: compare rows within one run, not across runs).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), o.keys, o.conns, o.duration, loadStart, loadAverageCPUs())
	b.WriteString("| server | callers | decisions/s | p50 | p99 | errors | over limit |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %d | %d |\n", r.server, r.callers, r.rate(), ms(r.p50), ms(r.p99), r.errors, r.overLimit)
	}
	for _, r := range rows {
		if r.note != "" {
			fmt.Fprintf(&b, "\nquotaplane, after %d callers: %s.", r.callers, r.note)
		}
	}
	b.WriteString("\n")
	if rlBuild != nil {
		fmt.Fprintf(&b, "\nenvoyproxy/ratelimit could not be built from the Go module proxy (`go install %s`), so it is not in the table.\n", ratelimitModule)
	} else {
		for _, n := range o.callers {
			var q, e float64
			for _, r := range rows {
				if r.callers == n && strings.HasPrefix(r.server, "quotaplane") {
					q = r.rate()
				} else if r.callers == n {
					e = r.rate()
				}
			}
			if e > 0 {
				fmt.Fprintf(&b, "\nAt %d callers the gateway answers %.2fx the decisions/s of envoyproxy/ratelimit.", n, q/e)
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\nCheck endpoint, %d requests/s open loop for %s (latency from the intended send time):\n\n", o.checkRPS, o.duration)
	b.WriteString("| path | requests | p50 | p99 | max | statuses | errors |\n|---|---|---|---|---|---|---|\n")
	for _, c := range check {
		var st []string
		for code, n := range c.statuses {
			st = append(st, fmt.Sprintf("%d: %d", code, n))
		}
		slices.Sort(st)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %d |\n", c.name, c.sent, ms(c.p50), ms(c.p99), ms(c.max), strings.Join(st, ", "), c.errs)
	}
	if len(check) == 2 {
		fmt.Fprintf(&b, "\nAdded by nginx + `/v1/check` over nginx alone: p50 %s, p99 %s.\n", ms(check[1].p50-check[0].p50), ms(check[1].p99-check[0].p99))
	}
	return b.String()
}

const (
	markStart = "<!-- rlsbench:start -->"
	markEnd   = "<!-- rlsbench:end -->"
)

// loadAverageCPUs is the load average with the CPU count, for the report.
func loadAverageCPUs() string {
	return testenv.LoadAverage() + " on " + strconv.Itoa(runtime.NumCPU()) + " CPUs"
}
