package bench

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// maxP99 is the latency bound of the throughput search: the highest rate a path
// sustains is the highest with p99 below it, no failed request and the offered rate
// actually sent.
const maxP99 = 10 * time.Millisecond

// minSent is the share of the offered requests a passing measurement must have sent
// (the load generator keeping up).
const minSent = 0.97

// path is one way of reaching the upstream.
type path struct {
	key, label string // the document describes each key (templates/overhead.tmpl)
	url        string
	header     http.Header
	gw         *gatewayProc // nil: the upstream itself
}

// point is one fixed-rate measurement of one path.
type point struct {
	rate     float64
	dur      time.Duration
	res      loadgen.Result
	ok       uint64  // 200 answers
	fallback float64 // fraction of the gateway's decisions taken by the fallback
	pass     bool
}

// overhead holds the gateway-overhead phase: the upstream, the Redis, the gateways, and
// the measurements of every run.
type overhead struct {
	b         *bench
	paths     []*path
	procs     []*testenv.Process
	gws       []*gatewayProc
	rates     []float64
	dur       time.Duration // a fixed-rate measurement
	stepDur   time.Duration // a step of the throughput search
	upSteps   int           // search steps above the highest passing fixed rate
	downSteps int           // search steps below the lowest rate when no fixed rate passes
	bisects   int           // then steps between the highest pass and the lowest failure

	fixed map[string]map[float64][]point // path -> rate -> one per run
	max   map[string][]maxResult         // path -> one per run
}

// maxResult is one run's throughput search for one path.
type maxResult struct {
	rps    float64 // the highest rate that passed (0: none did)
	capped bool    // no rate failed: the true maximum is higher
	steps  int
	first  float64 // the lowest rate that failed (0: none)
	why    string  // why it failed
}

// startOverhead starts the echo upstream, a Redis, and the three gateways (local
// limiter, Redis, Redis down), and warms each path.
func (b *bench) startOverhead(ctx context.Context) (_ *overhead, err error) {
	o := &overhead{
		b: b, rates: []float64{1000, 2500, 5000}, dur: 3 * time.Second, stepDur: 2 * time.Second,
		upSteps: 5, downSteps: 2, bisects: 1,
		fixed: map[string]map[float64][]point{}, max: map[string][]maxResult{},
	}
	if b.opts.quick {
		// One point at the rate of the targets, so that a quick run computes them too.
		o.rates, o.dur, o.stepDur, o.upSteps, o.downSteps, o.bisects = []float64{2500}, time.Second, time.Second, 0, 0, 0
	}
	defer func() {
		if err != nil {
			o.close()
		}
	}()
	echoProc, upstream, err := b.startEcho(ctx, "echo-overhead")
	if err != nil {
		return nil, err
	}
	o.procs = append(o.procs, echoProc)
	rd, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: b.work + "/redis-overhead"})
	if err != nil {
		return nil, err
	}
	o.procs = append(o.procs, rd)
	// (d)'s Redis: started and killed, so its port refuses connections: the breaker
	// opens after five failures and the fallback decides; every second one probe fails.
	dead, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: b.work + "/redis-dead"})
	if err != nil {
		return nil, err
	}
	if err := dead.Kill(); err != nil {
		return nil, err
	}
	proxyProc, proxied, err := b.startProxy(ctx, "proxy-overhead", upstream)
	if err != nil {
		return nil, err
	}
	o.procs = append(o.procs, proxyProc)
	hdr := http.Header{"X-Api-Key": {benchKey}}
	o.paths = []*path{
		{key: "a", label: "direct", url: upstream + "/orders"},
		{key: "r", label: "bare httputil.ReverseProxy", url: proxied + "/orders"},
	}
	for _, s := range []struct {
		key, label string
		spec       gatewaySpec
	}{
		{"b", "gateway, local limiter",
			gatewaySpec{name: "gw-local", upstream: upstream}},
		{"c", "gateway + Redis",
			gatewaySpec{name: "gw-redis", upstream: upstream, redisURL: testenv.RedisURL(rd)}},
		{"e", "gateway + Redis, 100 ms timeout",
			gatewaySpec{name: "gw-redis-100ms", upstream: upstream, redisURL: testenv.RedisURL(rd), timeout: 100 * time.Millisecond}},
		{"d", "gateway, Redis down",
			gatewaySpec{name: "gw-fallback", upstream: upstream, redisURL: testenv.RedisURL(dead)}},
	} {
		g, err := b.startGateway(ctx, s.spec)
		if err != nil {
			return nil, err
		}
		o.gws = append(o.gws, g)
		o.paths = append(o.paths, &path{key: s.key, label: s.label, url: g.url + "/orders", header: hdr, gw: g})
	}
	warm := time.Second
	if b.opts.quick {
		warm = 300 * time.Millisecond
	}
	for _, p := range o.paths {
		pt, err := o.measure(ctx, p, 500, warm)
		if err != nil {
			return nil, err
		}
		if pt.ok == 0 {
			return nil, fmt.Errorf("overhead: %s answers no 200 (codes %v)", p.label, pt.res.Codes)
		}
	}
	return o, nil
}

func (o *overhead) close() {
	for _, g := range o.gws {
		_ = g.proc.Stop()
	}
	for _, p := range o.procs {
		_ = p.Kill()
	}
}

// run is one run: every fixed rate on every path (paths rotated per run, so none
// always goes first), then the throughput search of every path.
func (o *overhead) run(ctx context.Context, i int) error {
	order := make([]*path, len(o.paths))
	for j := range o.paths {
		order[j] = o.paths[(i+j)%len(o.paths)]
	}
	for _, rate := range o.rates {
		for _, p := range order {
			pt, err := o.measure(ctx, p, rate, o.dur)
			if err != nil {
				return err
			}
			if o.fixed[p.key] == nil {
				o.fixed[p.key] = map[float64][]point{}
			}
			o.fixed[p.key][rate] = append(o.fixed[p.key][rate], pt)
			o.b.logf("overhead run %d: %-24s %5.0f rps: p50 %s p99 %s p99.9 %s ok %d/%d fallback %.0f%%",
				i+1, p.label, rate, ms(pt.res.P50), ms(pt.res.P99), ms(pt.res.P999), pt.ok, pt.res.Requests, 100*pt.fallback)
		}
	}
	for _, p := range order {
		m, err := o.search(ctx, p, i)
		if err != nil {
			return err
		}
		o.max[p.key] = append(o.max[p.key], m)
		o.b.logf("overhead run %d: %-24s max %.0f rps with p99 < %v (capped %v, %d steps; first failure %.0f: %s)",
			i+1, p.label, m.rps, maxP99, m.capped, m.steps, m.first, m.why)
	}
	return nil
}

// search finds the highest rate p sustains: up from the highest fixed rate that passed
// in this run (x1.5 a step), then bisects (geometric mean) between pass and failure.
func (o *overhead) search(ctx context.Context, p *path, run int) (maxResult, error) {
	var m maxResult
	for _, rate := range o.rates {
		pts := o.fixed[p.key][rate]
		pt := pts[len(pts)-1]
		if pt.pass && m.first == 0 {
			m.rps = rate
		} else if !pt.pass && m.first == 0 {
			m.first, m.why = rate, pt.failure()
		}
	}
	try := func(rate float64) (bool, error) {
		pt, err := o.measure(ctx, p, rate, o.stepDur)
		if err != nil {
			return false, err
		}
		m.steps++
		if !pt.pass {
			m.first, m.why = rate, pt.failure()
		}
		return pt.pass, nil
	}
	for range o.upSteps {
		if m.first != 0 {
			break
		}
		rate := math.Round(max(m.rps, 1000)*1.5/100) * 100
		ok, err := try(rate)
		if err != nil {
			return m, err
		}
		if ok {
			m.rps = rate
		}
	}
	m.capped = m.first == 0
	for range o.downSteps { // no fixed rate passed: halve until one does
		if m.rps != 0 || m.first == 0 {
			break
		}
		rate := math.Round(m.first/2/50) * 50
		ok, err := try(rate)
		if err != nil {
			return m, err
		}
		if ok {
			m.rps = rate
		}
	}
	for range o.bisects {
		if m.first == 0 || m.rps == 0 {
			break
		}
		rate := math.Round(math.Sqrt(m.rps*m.first)/100) * 100
		if rate <= m.rps || rate >= m.first {
			break
		}
		ok, err := try(rate)
		if err != nil {
			return m, err
		}
		if ok {
			m.rps = rate
		}
	}
	return m, nil
}

// measure offers rate requests per second to p for d (open loop) and reads the
// gateway's decision counters around it.
func (o *overhead) measure(ctx context.Context, p *path, rate float64, d time.Duration) (point, error) {
	pt := point{rate: rate, dur: d}
	var before metricsText
	if p.gw != nil {
		var err error
		if before, err = p.gw.metrics(ctx); err != nil {
			return pt, err
		}
	}
	res, err := loadgen.Run(ctx, []loadgen.Stream{{Name: p.key, URL: p.url, Header: p.header, Rate: loadgen.Constant(rate)}}, d, nil)
	if err != nil {
		return pt, fmt.Errorf("load %s at %.0f rps: %w", p.label, rate, err)
	}
	if len(res) != 1 {
		return pt, fmt.Errorf("load %s at %.0f rps: %d results (no answer at all?)", p.label, rate, len(res))
	}
	pt.res = res[0]
	pt.ok = pt.res.Codes[http.StatusOK]
	if p.gw != nil {
		after, err := p.gw.metrics(ctx)
		if err != nil {
			return pt, err
		}
		const name = "ratelimit_requests_total"
		fb := after.sum(name, `source="fallback"`) - before.sum(name, `source="fallback"`)
		all := after.sum(name, `decision="allowed"`) - before.sum(name, `decision="allowed"`)
		if all > 0 {
			pt.fallback = fb / all
		}
	}
	want := rate * d.Seconds()
	pt.pass = pt.res.P99 < maxP99 && pt.ok == pt.res.Requests && float64(pt.res.Requests) >= minSent*want
	return pt, ctx.Err()
}

// failure says why a point did not pass.
func (pt point) failure() string {
	want := pt.rate * pt.dur.Seconds()
	switch {
	case pt.ok != pt.res.Requests:
		return fmt.Sprintf("%d of %d requests failed", pt.res.Requests-pt.ok, pt.res.Requests)
	case float64(pt.res.Requests) < minSent*want:
		return fmt.Sprintf("sent %.0f%% of the offered rate", 100*float64(pt.res.Requests)/want)
	case pt.res.P99 >= maxP99:
		return "p99 " + ms(pt.res.P99)
	}
	return ""
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/1e6) }

// overheadResult is what the report needs from the phase.
type overheadResult struct {
	paths   []*path
	rates   []float64
	dur     time.Duration
	stepDur time.Duration
	fixed   map[string]map[float64][]point
	max     map[string][]maxResult
}

func (o *overhead) result() *overheadResult {
	return &overheadResult{paths: o.paths, rates: o.rates, dur: o.dur, stepDur: o.stepDur, fixed: o.fixed, max: o.max}
}
