package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// costClass is one named cost of the hot path: a sample belongs to the first class one
// of whose patterns matches a frame of its stack (classes are tried in order, so the
// specific ones come first).
type costClass struct {
	id, name string // templates/profile.tmpl says, by id, what was done about each
	match    *regexp.Regexp
}

// costClasses name what a gateway process spends its time and memory on while serving.
var costClasses = []costClass{
	{"gc", "garbage collection (background marking, assists, sweeping)",
		regexp.MustCompile(`runtime\.gcBgMarkWorker|runtime\.gcAssistAlloc|runtime\.bgsweep|runtime\.bgscavenge|runtime\.gcDrain|runtime\.markroot`)},
	{"metrics", "metrics (Prometheus counters, the decision histogram, per-tenant series)",
		regexp.MustCompile(`prometheus/client_golang|gateway\.\(\*tenantTracker\)`)},
	{"keyhash", "API-key hash (SHA-256)",
		regexp.MustCompile(`crypto/sha256|crypto/internal/fips140/sha256`)},
	{"headers", "rate-limit headers",
		regexp.MustCompile(`gateway\.newRateHeaders|gateway\.rateHeaders\.write|gateway\.stripUpstreamRateHeaders`)},
	{"snapshot", "rule and share lookup (snapshot)",
		regexp.MustCompile(`regions\.\(\*Snapshot\)`)},
	{"redis", "Redis decision (limiter, pipelining, go-redis, the socket)",
		regexp.MustCompile(`gateway/limiter\.|redis/go-redis|quotaplane/lua\.|sony/gobreaker`)},
	{"proxy", "reverse proxy to the upstream (httputil.ReverseProxy, transport, upstream I/O)",
		regexp.MustCompile(`net/http/httputil\.|net/http\.\(\*Transport\)|net/http\.\(\*persistConn\)|net/http\.\(\*transferWriter\)|net/http\.persistConnWriter`)},
	{"handler", "gateway handler (routing, authentication, forwarding)",
		regexp.MustCompile(`quotaplane/gateway\.|net/http\.\(\*ServeMux\)`)},
	{"server", "client connection: HTTP parsing and response writing (net/http server)",
		regexp.MustCompile(`net/http\.\(\*conn\)|net/http\.\(\*response\)|net/http\.\(\*chunkWriter\)|net/http\.readRequest|net/textproto`)},
	{"scheduler", "scheduler, timers and network poller",
		regexp.MustCompile(`runtime\.schedule|runtime\.findRunnable|runtime\.netpoll|runtime\.mcall|runtime\.park_m|runtime\.stopm|runtime\.futex`)},
}

// profileResult is the profile phase's outcome.
type profileResult struct {
	rate      float64
	dur       time.Duration
	requests  float64
	fallback  float64       // fraction of the requests decided by the fallback
	cpu       time.Duration // CPU samples in the window
	allocB    float64       // bytes allocated in the window
	allocN    float64       // objects allocated
	classes   []classShare  // sorted by CPU share
	topCPU    string        // go tool pprof -top, for docs/profiles
	topAlloc  string
	cpuFile   string
	allocFile string
}

type classShare struct {
	id, name            string
	cpu, bytes, objects float64 // fractions of the total
}

// profile runs a gateway (this program as the profiled child: cmd/gateway's code plus
// net/http/pprof) deciding on Redis under open-loop load, and takes a CPU profile and
// an allocation profile of the same window.
func (b *bench) profile(ctx context.Context) error {
	rate, dur := 2500.0, 10*time.Second
	if b.opts.quick {
		rate, dur = 500, 2*time.Second
	}
	echoProc, upstream, err := b.startEcho(ctx, "echo-profile")
	if err != nil {
		return err
	}
	defer echoProc.Kill()
	rd, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: filepath.Join(b.work, "redis-profile")})
	if err != nil {
		return err
	}
	defer rd.Kill()
	pport, err := testenv.FreePort()
	if err != nil {
		return err
	}
	pprofURL := "http://127.0.0.1:" + strconv.Itoa(pport) + "/debug/pprof/"
	g, err := b.startGateway(ctx, gatewaySpec{name: "gw-profile", upstream: upstream, redisURL: testenv.RedisURL(rd), timeout: 100 * time.Millisecond, pprof: "127.0.0.1:" + strconv.Itoa(pport)})
	if err != nil {
		return err
	}
	defer g.proc.Stop()
	stream := []loadgen.Stream{{Name: "profile", URL: g.url + "/orders", Header: http.Header{"X-Api-Key": {benchKey}}, Rate: loadgen.Constant(rate)}}
	if _, err := loadgen.Run(ctx, stream, 500*time.Millisecond, nil); err != nil { // warm
		return err
	}
	var (
		wg      sync.WaitGroup
		loadErr error
		loadRes []loadgen.Result
	)
	wg.Go(func() {
		loadRes, loadErr = loadgen.Run(ctx, stream, dur+2*time.Second, nil)
	})
	defer wg.Wait()
	time.Sleep(time.Second) // into the steady load; not synchronisation
	before, err := g.metrics(ctx)
	if err != nil {
		return err
	}
	pr := &profileResult{rate: rate, dur: dur,
		cpuFile: filepath.Join(b.work, "cpu.pb.gz"), allocFile: filepath.Join(b.work, "allocs.pb.gz")}
	secs := strconv.Itoa(int(dur / time.Second))
	var fetchErr [2]error
	var fetch sync.WaitGroup
	fetch.Go(func() { fetchErr[0] = download(ctx, pprofURL+"profile?seconds="+secs, pr.cpuFile) })
	fetch.Go(func() { fetchErr[1] = download(ctx, pprofURL+"allocs?seconds="+secs, pr.allocFile) })
	fetch.Wait()
	after, err := g.metrics(ctx)
	if err != nil {
		return err
	}
	wg.Wait()
	for _, e := range append(fetchErr[:], loadErr) {
		if e != nil {
			return fmt.Errorf("profile: %w", e)
		}
	}
	if len(loadRes) != 1 || loadRes[0].Codes[http.StatusOK] != loadRes[0].Requests {
		return fmt.Errorf("profile: the load failed: %+v", loadRes)
	}
	b.logf("profile: load %d requests, p99 %s", loadRes[0].Requests, ms(loadRes[0].P99))
	const name = "ratelimit_requests_total"
	pr.requests = after.sum(name, `decision="allowed"`) - before.sum(name, `decision="allowed"`)
	pr.fallback = (after.sum(name, `source="fallback"`) - before.sum(name, `source="fallback"`)) / pr.requests
	if err := b.analyse(ctx, pr); err != nil {
		return err
	}
	b.rep.profile = pr
	if err := os.MkdirAll(b.opts.profiles, 0o755); err != nil {
		return err
	}
	for name, text := range map[string]string{"cpu-top.txt": pr.topCPU, "alloc-top.txt": pr.topAlloc} {
		if err := os.WriteFile(filepath.Join(b.opts.profiles, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	b.logf("profile: %.0f requests, %s CPU (%.0f µs/request), %.1f KB and %.0f allocations per request",
		pr.requests, pr.cpu, float64(pr.cpu.Microseconds())/pr.requests, pr.allocB/pr.requests/1024, pr.allocN/pr.requests)
	return nil
}

func download(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 1000))
		return fmt.Errorf("GET %s: %d %s", url, res.StatusCode, body)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, res.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// analyse classifies every sample of both profiles (go tool pprof -traces) and keeps
// the -top summaries.
func (b *bench) analyse(ctx context.Context, pr *profileResult) error {
	pprof := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "go", append([]string{"tool", "pprof"}, args...)...)
		cmd.Dir = b.root
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("go tool pprof %s: %w", strings.Join(args, " "), err)
		}
		return string(out), nil
	}
	cpuTraces, err := pprof("-traces", pr.cpuFile)
	if err != nil {
		return err
	}
	bytesTraces, err := pprof("-traces", "-sample_index=alloc_space", pr.allocFile)
	if err != nil {
		return err
	}
	objTraces, err := pprof("-traces", "-sample_index=alloc_objects", pr.allocFile)
	if err != nil {
		return err
	}
	cpuBy, cpuTotal := classify(parseTraces(cpuTraces))
	bytesBy, bytesTotal := classify(parseTraces(bytesTraces))
	objBy, objTotal := classify(parseTraces(objTraces))
	pr.cpu = time.Duration(cpuTotal)
	pr.allocB, pr.allocN = bytesTotal, objTotal
	for i, c := range costClasses {
		pr.classes = append(pr.classes, classShare{id: c.id, name: c.name,
			cpu: frac(cpuBy[i], cpuTotal), bytes: frac(bytesBy[i], bytesTotal), objects: frac(objBy[i], objTotal)})
	}
	pr.classes = append(pr.classes, classShare{id: "other", name: "other (runtime, syscalls not above)",
		cpu: frac(cpuBy[-1], cpuTotal), bytes: frac(bytesBy[-1], bytesTotal), objects: frac(objBy[-1], objTotal)})
	sort.SliceStable(pr.classes, func(i, j int) bool { return pr.classes[i].cpu > pr.classes[j].cpu })
	if pr.topCPU, err = pprof("-top", "-nodecount=30", pr.cpuFile); err != nil {
		return err
	}
	if pr.topAlloc, err = pprof("-top", "-nodecount=30", "-sample_index=alloc_space", pr.allocFile); err != nil {
		return err
	}
	return nil
}

func frac(v, total float64) float64 {
	if total == 0 {
		return 0
	}
	return v / total
}

// trace is one sample stack of `go tool pprof -traces` with its value (ns for CPU,
// bytes or objects for allocations).
type trace struct {
	value  float64
	frames []string
}

// parseTraces reads `go tool pprof -traces` output: blocks separated by dashed lines,
// each a value and a function name on its first line and one function per line after.
func parseTraces(out string) []trace {
	var (
		traces []trace
		cur    *trace
	)
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "-----------+") {
			cur = nil
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if cur == nil {
			if len(f) < 2 {
				continue
			}
			v, ok := parseValue(f[0])
			if !ok {
				continue
			}
			traces = append(traces, trace{value: v})
			cur = &traces[len(traces)-1]
			cur.frames = append(cur.frames, f[1])
			continue
		}
		cur.frames = append(cur.frames, f[0])
	}
	return traces
}

// parseValue reads a pprof value: a duration (10ms, 1.5s, 200us), a size (512kB, 1.2MB,
// 64B) or a count.
func parseValue(s string) (float64, bool) {
	if d, err := time.ParseDuration(s); err == nil {
		return float64(d), true
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"KB", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			x, err := strconv.ParseFloat(v, 64)
			return x * u.mult, err == nil
		}
	}
	x, err := strconv.ParseFloat(s, 64)
	return x, err == nil
}

// profilerFrames are the profiler's own work (collecting and gzipping the profiles we
// asked for): left out of every total.
var profilerFrames = regexp.MustCompile(`^runtime/pprof\.|^net/http/pprof\.|^compress/flate\.`)

// classify sums trace values per cost class (index into costClasses; -1: none),
// leaving out the profiler's own samples.
func classify(traces []trace) (map[int]float64, float64) {
	by := map[int]float64{}
	var total float64
	for _, t := range traces {
		if slices.ContainsFunc(t.frames, profilerFrames.MatchString) {
			continue
		}
		total += t.value
		class := -1
	find:
		for i, c := range costClasses {
			for _, f := range t.frames {
				if c.match.MatchString(f) {
					class = i
					break find
				}
			}
		}
		by[class] += t.value
	}
	return by, total
}
