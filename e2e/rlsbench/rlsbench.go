// Package rlsbench measures the gateway's Envoy rate-limit service (rls_listen) side by
// side with envoyproxy/ratelimit, built from source through the Go module proxy, on the
// same Redis: decisions per second and latency percentiles at 16 and 64 gRPC callers over
// 100k keys; and the latency the check endpoint adds to nginx (nginx + auth_request to
// /v1/check vs nginx alone) at a fixed 1,000 requests per second. It writes its figures
// to docs/bench/rls.json and renders the documents again from the results files
// (e2e/bench/results: section 7 of docs/BENCHMARKS.md, the README's headline,
// docs/proxies.md's rls section).
//
//	go run ./cmd/rlsbench [-duration 10s] [-keys 100000] [-callers 16,64] [-quiet 2m] [-out docs/bench/rls.json]
//
// Its target counts only on a quiet machine, so after the builds it waits (up to
// -quiet) for the 1-minute load average to fall below results.MaxLoad, and records the
// load average when measuring starts and at the end.
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

	"github.com/quotaplane/quotaplane/e2e/bench/results"
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
	quiet    time.Duration // the longest wait for a quiet machine
}

// warmup is the load before each measured row.
const warmup = 2 * time.Second

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rlsbench", flag.ContinueOnError)
	duration := fs.Duration("duration", 10*time.Second, "measured time per server and caller count")
	keys := fs.Int("keys", 100_000, "distinct descriptor values (buckets)")
	callers := fs.String("callers", "16,64", "concurrent gRPC callers, comma-separated")
	conns := fs.Int("conns", 4, "gRPC connections the callers share (the same for both servers)")
	out := fs.String("out", "docs/bench/rls.json", "the results file to write (the committed one also renders the documents again); empty prints only")
	checkRPS := fs.Int("check-rps", 1000, "request rate of the nginx check-endpoint measurement")
	quiet := fs.Duration("quiet", 2*time.Minute, "how long to wait after the builds for a 1-minute load average below 2 (0: do not wait)")
	withRatelimit := fs.Bool("ratelimit", true, "also build and measure envoyproxy/ratelimit (false: the gateway alone)")
	withCheck := fs.Bool("check", true, "also measure the nginx check endpoint")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o := options{duration: *duration, keys: *keys, conns: *conns, out: *out, checkRPS: *checkRPS, quiet: *quiet}
	for s := range strings.SplitSeq(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1024 {
			return fmt.Errorf("-callers: %q is not a count from 1 to 1024", s)
		}
		o.callers = append(o.callers, n)
	}
	if o.duration < time.Second || o.duration > 10*time.Minute || o.keys < 1 || o.keys > 10_000_000 || o.conns < 1 || o.conns > 64 || o.checkRPS < 1 || o.checkRPS > 100_000 || o.quiet < 0 || o.quiet > 30*time.Minute {
		return errors.New("-duration 1s..10m, -keys 1..1e7, -conns 1..64, -check-rps 1..1e5, -quiet 0..30m")
	}
	root, err := testenv.ModuleRoot(ctx)
	if err != nil {
		return err
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

	res := &results.RLS{Command: "go run ./cmd/rlsbench", Commit: commit(ctx, root), CPUs: runtime.NumCPU(),
		Keys: o.keys, Conns: o.conns, Duration: results.Duration(o.duration), Warmup: results.Duration(warmup), Ratelimit: ratelimitModule}
	logf("building the gateway and %s (load average %s)", ratelimitModule, testenv.LoadAverage())
	bin := filepath.Join(work, "bin")
	if err := goCmd(ctx, nil, "build", "-o", bin+"/", "./cmd/gateway"); err != nil {
		return err
	}
	rlBuild := errors.New("-ratelimit=false")
	if *withRatelimit {
		rlBuild = goCmd(ctx, []string{"GOBIN=" + bin}, "install", ratelimitModule)
	}
	if rlBuild != nil {
		logf("envoyproxy/ratelimit could not be built; measuring the gateway alone: %v", rlBuild)
		res.RatelimitError, _, _ = strings.Cut(rlBuild.Error(), "\n")
	}
	if err := waitQuiet(ctx, o.quiet, logf); err != nil {
		return err
	}
	res.Start, res.LoadStart = time.Now().UTC(), testenv.LoadAverage()
	logf("measuring (load average %s)", res.LoadStart)

	redis, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: filepath.Join(work, "redis")})
	if err != nil {
		return err
	}
	defer func() { _ = redis.Kill() }()

	gw, err := startGateway(ctx, work, filepath.Join(bin, "gateway"), redis.Addr())
	if err != nil {
		return err
	}
	defer func() { _ = gw.proc.Stop() }()
	for _, n := range o.callers {
		logf("quotaplane RLS, %d callers, %s", n, o.duration)
		cpu0 := cpuTimes(filepath.Join(bin, "gateway"), redis.Addr())
		r, err := load(ctx, gw.rls, o, n, func(k string) *rlcommon.RateLimitDescriptor {
			return desc("api_key", benchKey, "route", "bench", "user", k)
		})
		if err != nil {
			return err
		}
		r.Server, r.Sources = "quotaplane", gw.sources(ctx)
		res.Rows = append(res.Rows, r)
		logf("  %s", line(r))
		cpu1 := cpuTimes(filepath.Join(bin, "gateway"), redis.Addr())
		wall := (warmup + o.duration).Seconds()
		logf("  CPU over warm-up and run (%.0f s, %d cores): gateway %.1f s, load generator %.1f s, redis-server %.1f s", wall, runtime.NumCPU(), cpu1.server-cpu0.server, cpu1.self-cpu0.self, cpu1.redis-cpu0.redis)
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
			r.Server = "ratelimit"
			res.Rows = append(res.Rows, r)
			logf("  %s", line(r))
		}
		_ = rl.Stop()
	}

	if *withCheck {
		logf("nginx check endpoint at %d requests/s, %s each", o.checkRPS, o.duration)
		check, err := checkOverhead(ctx, work, gw, o)
		if err != nil {
			return err
		}
		res.Check = &results.CheckLoad{RPS: o.checkRPS, Duration: results.Duration(o.duration), Rows: check}
		for _, c := range check {
			logf("  %s: %d requests, p50 %.2f ms, p99 %.2f ms, max %.2f ms, statuses %v, %d errors", c.Path, c.Requests, c.P50Ms, c.P99Ms, c.MaxMs, c.Statuses, c.Errors)
		}
	}
	res.End, res.LoadEnd = time.Now().UTC(), testenv.LoadAverage()
	for _, n := range o.callers {
		if x := res.Ratio(n); x > 0 {
			logf("at %d callers the gateway answers %.2fx the decisions/s of envoyproxy/ratelimit", n, x)
		}
	}
	logf("load average %s when measuring started, %s at the end", res.LoadStart, res.LoadEnd)
	if o.out == "" {
		return nil
	}
	if err := results.WriteFile(o.out, res); err != nil {
		return err
	}
	logf("wrote %s", o.out)
	committed := results.Committed(root)
	if abs, err := filepath.Abs(o.out); err != nil || abs != committed.RLS {
		return nil // a results file of its own: the committed documents stay
	}
	if err := results.WriteDocuments(committed); err != nil {
		return err
	}
	logf("rendered %s", strings.Join(committed.Outputs(), ", "))
	return nil
}

// waitQuiet waits, up to max, for the 1-minute load average to fall below
// results.MaxLoad: the builds and a benchmark run just before (make bench) load the
// machine, and the RLS target counts only on a quiet one. It polls the machine's
// state, a real process's, every 5 s; it returns at once when max is 0.
func waitQuiet(ctx context.Context, max time.Duration, logf func(string, ...any)) error {
	deadline := time.Now().Add(max)
	for {
		load, ok := results.LoadOne(testenv.LoadAverage())
		if ok && load < results.MaxLoad {
			return nil
		}
		if !time.Now().Before(deadline) {
			if max > 0 {
				logf("the load average is still %s after %s: measuring anyway (the RLS target will say the machine was busy)", testenv.LoadAverage(), max)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// commit is the measured tree: git describe --always --dirty, or "unknown".
func commit(ctx context.Context, root string) string {
	cmd := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
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

// cpuSeconds are the user+system CPU seconds of this process (the load generator), of
// the process running the binary at server and of the redis-server at redisAddr (0 when
// one is not found).
type cpuSeconds struct{ self, server, redis float64 }

// cpuTimes reads /proc: this process's, server's and the Redis server's utime+stime. A
// redis-server names itself after its address in its command line.
func cpuTimes(server, redisAddr string) cpuSeconds {
	var c cpuSeconds
	c.self = procCPU("self")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if exe, err := os.Readlink("/proc/" + e.Name() + "/exe"); err == nil && exe == server {
			c.server = procCPU(e.Name())
		}
		if cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(cmd), "redis-server") && strings.Contains(string(cmd), redisAddr) {
			c.redis = procCPU(e.Name())
		}
	}
	return c
}

// procCPU is utime+stime of /proc/pid/stat in seconds (clock ticks of 100 Hz, Linux's
// USER_HZ).
func procCPU(pid string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3 (state): utime is field 14
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
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
// value of the "user" descriptor entry, and a "check" route for the nginx measurement.
// A value's bucket is the size of the route's, and nested in it: at 10^6 tokens and 10^6
// per second both admit the whole load, as envoyproxy/ratelimit's 1000/s per user does
// (at 1000/s the route bucket refused about 94% of the calls, which then did less work
// than ratelimit's admissions). The Redis timeout is 50 ms,
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
      - {route: bench, capacity: 1000000, refill_per_second: 1000000}
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

// sources sums the gateway's RLS decisions by source from /metrics, the sources that
// decided any (nil when it cannot be read).
func (g *gateway) sources(ctx context.Context) map[string]float64 {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.admn+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
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
		if v, _ := strconv.ParseFloat(line[j+1:], 64); v > 0 {
			sums[src] += v
		}
	}
	return sums
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

func line(r results.RLSRow) string {
	return fmt.Sprintf("%.0f decisions/s, p50 %.2f ms, p99 %.2f ms, %d errors, %d over limit", r.DecisionsPerS, r.P50Ms, r.P99Ms, r.Errors, r.OverLimit)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// load runs callers closed-loop for o.duration after a 2 s warm-up, each sending one
// descriptor with a uniformly random key of o.keys.
func load(ctx context.Context, addr string, o options, callers int, mk func(key string) *rlcommon.RateLimitDescriptor) (results.RLSRow, error) {
	conns := make([]rlsv3.RateLimitServiceClient, o.conns)
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return results.RLSRow{}, err
		}
		defer c.Close()
		conns[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	var measuring atomic.Bool
	var calls, errs, over atomic.Int64
	lat := make([][]time.Duration, callers)
	warm := time.Now().Add(warmup)
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
		return results.RLSRow{}, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := results.RLSRow{Callers: callers, Calls: calls.Load(), Errors: errs.Load(), OverLimit: over.Load(), DecisionsPerS: float64(calls.Load()) / o.duration.Seconds()}
	if len(all) > 0 {
		r.P50Ms, r.P99Ms = ms(all[len(all)*50/100]), ms(all[len(all)*99/100])
	}
	return r, nil
}

// checkOverhead runs nginx with two servers in front of one upstream: the shipped
// deploy/nginx/quotaplane.conf (auth_request to the gateway's /v1/check) and the same
// proxying without auth_request, and sends each o.checkRPS requests per second for
// o.duration, open loop (latency counted from the intended send time).
func checkOverhead(ctx context.Context, work string, gw *gateway, o options) ([]results.CheckRow, error) {
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
	var rows []results.CheckRow
	for _, t := range []struct{ path, url string }{
		{"nginx", "http://" + plain + "/orders"},
		{"nginx+check", "http://" + ngx.Addr() + "/orders"},
	} {
		r, err := openLoop(ctx, t.url, o.checkRPS, o.duration)
		if err != nil {
			return nil, err
		}
		r.Path = t.path
		rows = append(rows, r)
	}
	return rows, nil
}

func openLoop(ctx context.Context, url string, rps int, d time.Duration) (results.CheckRow, error) {
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
				return results.CheckRow{}, ctx.Err()
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
	r := results.CheckRow{Requests: int64(n), Errors: errs.Load(), Statuses: map[string]int64{}}
	var ok []time.Duration
	for i := range n {
		if status[i] != 0 {
			r.Statuses[strconv.Itoa(status[i])]++
			ok = append(ok, lat[i])
		}
	}
	slices.Sort(ok)
	if len(ok) > 0 {
		r.P50Ms, r.P99Ms, r.MaxMs = ms(ok[len(ok)*50/100]), ms(ok[len(ok)*99/100]), ms(ok[len(ok)-1])
	}
	return r, nil
}
