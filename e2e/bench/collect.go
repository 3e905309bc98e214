package bench

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/quotaplane/quotaplane/e2e/bench/results"
)

// report holds every phase's raw measurements until the run ends; collect turns them
// into the results file's figures (medians, ranges and ratios taken run by run). No
// prose here: the documents are rendered from the results by e2e/bench/results.
type report struct {
	bench      map[string][]benchLine // benchmark name -> one line per run
	commands   []string               // the go test commands of the engine phase
	overhead   *overheadResult
	redisMem   []redisMemory
	gatewayMem *gatewayMemory
	local      *localMemory
	accuracy   map[string][]accuracyRun // limiter -> one per run
	profile    *profileResult
}

func newReport() *report {
	return &report{bench: map[string][]benchLine{}, accuracy: map[string][]accuracyRun{}}
}

// collect is the results file of the run.
func (b *bench) collect(run results.Run) *results.Bench {
	r := b.rep
	out := &results.Bench{Run: run, Commands: r.commands}
	if r.overhead != nil {
		out.Overhead = r.overhead.collect()
	}
	out.Engine = r.collectEngine()
	if b.scripts != nil {
		out.Scripts = b.scripts.result()
	}
	out.Memory = r.collectMemory()
	out.Accuracy = r.collectAccuracy()
	if r.profile != nil {
		out.Profile = r.profile.collect()
	}
	out.HotPath = r.collectHotPath()
	if r.local != nil {
		out.Commands = append(out.Commands, r.local.command)
	}
	return out
}

// metric is one benchmark metric over the runs.
func (r *report) metric(name, unit string) results.Stat {
	var xs []float64
	for _, l := range r.bench[name] {
		if v, ok := l.metrics[unit]; ok {
			xs = append(xs, v)
		}
	}
	return results.StatOf(xs)
}

// ratio is a/b of one metric of two benchmarks, run by run (both ran in each run).
func (r *report) ratio(a, b, unit string) results.Stat {
	la, lb := r.bench[a], r.bench[b]
	var xs []float64
	for i := range min(len(la), len(lb)) {
		if y := lb[i].metrics[unit]; y > 0 {
			xs = append(xs, la[i].metrics[unit]/y)
		}
	}
	return results.StatOf(xs)
}

func engineName(mode, keys string, callers int) string {
	return fmt.Sprintf("BenchmarkDecisionEngine/keys=%s/callers=%d/mode=%s", keys, callers, mode)
}

var (
	// engineModes are the rows of each caller count, in the document's order.
	engineModes   = []string{"ceiling-P1", "ceiling-P16", "bare-evalsha", "plain", "pipelined", "redis_rate", "leases"}
	engineKeys    = []string{"hot", "100k"}
	engineCallers = []int{1, 16, 64, 256}
)

func (r *report) collectEngine() *results.Engine {
	e := &results.Engine{}
	for _, keys := range engineKeys {
		g := results.EngineGroup{Keys: keys}
		for _, c := range engineCallers {
			for _, mode := range engineModes {
				n := engineName(mode, keys, c)
				if len(r.bench[n]) == 0 {
					continue
				}
				row := results.EngineRow{Callers: c, Mode: mode, DecisionsPerS: r.metric(n, "decisions/s"), RedisCPU: r.metric(n, "redis-cpu-busy")}
				if mode != "ceiling-P1" && mode != "ceiling-P16" { // redis-benchmark's rows have only these two
					row.P50Us, row.P99Us = r.metric(n, "p50-µs"), r.metric(n, "p99-µs")
					row.CallsPerAdmitted, row.AdmittedPerDecision = r.metric(n, "redis-calls/admitted"), r.metric(n, "admitted/decision")
					row.AllocsPerOp = r.metric(n, "allocs/op")
				}
				g.Rows = append(g.Rows, row)
			}
		}
		if len(g.Rows) > 0 {
			e.Groups = append(e.Groups, g)
		}
		for _, c := range engineCallers {
			ours := engineName("pipelined", keys, c)
			if len(r.bench[ours]) == 0 {
				continue
			}
			e.Relative = append(e.Relative, results.EngineRelative{Keys: keys, Callers: c,
				VsCeiling:   r.ratio(ours, engineName("ceiling-P16", keys, c), "decisions/s"),
				VsRedisRate: r.ratio(ours, engineName("redis_rate", keys, c), "decisions/s"),
				VsBare:      r.ratio(ours, engineName("bare-evalsha", keys, c), "decisions/s"),
				VsPlain:     r.ratio(ours, engineName("plain", keys, c), "decisions/s")})
		}
	}
	// Issue 14: leases make a hot key cheap for Redis, at most one call per 20
	// admitted. A finite run ends with its last lease partly spent (what is left is
	// given back), so a run is within the bound when its calls less that one are at
	// most admitted/20; every run at every caller count must be.
	for _, c := range engineCallers {
		name := engineName("leases", "hot", c)
		if len(r.bench[name]) == 0 {
			continue
		}
		ok := true
		for _, l := range r.bench[name] {
			admitted := l.metrics["admitted/decision"] * float64(l.n)
			calls := l.metrics["redis-calls/admitted"] * admitted
			ok = ok && admitted > 0 && calls-1 <= admitted/20+1e-6
		}
		e.Leases = append(e.Leases, results.LeaseRow{Callers: c, CallsPerAdmitted: r.metric(name, "redis-calls/admitted"), WithinBound: &ok})
	}
	if len(e.Groups) == 0 {
		return nil
	}
	return e
}

// hotPathBenchmarks are the hot-path rows, in the document's order.
var hotPathBenchmarks = []string{
	"BenchmarkTake", "BenchmarkRedisDecide", "BenchmarkLocalDecide",
	"BenchmarkServeHTTP/redis/allowed+proxy", "BenchmarkServeHTTP/redis/throttled",
	"BenchmarkServeHTTP/local/allowed+proxy", "BenchmarkServeHTTP/local/throttled",
}

func (r *report) collectHotPath() []results.HotPath {
	var out []results.HotPath
	for _, name := range hotPathBenchmarks {
		if len(r.bench[name]) == 0 {
			continue
		}
		out = append(out, results.HotPath{Benchmark: name, AllocsPerOp: r.metric(name, "allocs/op"), BytesPerOp: r.metric(name, "B/op"), NsPerOp: r.metric(name, "ns/op")})
	}
	return out
}

func (ov *overheadResult) collect() *results.Overhead {
	o := &results.Overhead{Duration: results.Duration(ov.dur), StepDuration: results.Duration(ov.stepDur), MaxP99: results.Duration(maxP99), MinSent: minSent}
	for _, p := range ov.paths {
		o.Paths = append(o.Paths, results.Path{Key: p.key, Label: p.label})
	}
	ms := func(pts []point, f func(point) float64) results.Stat {
		xs := make([]float64, len(pts))
		for i, pt := range pts {
			xs[i] = f(pt)
		}
		return results.StatOf(xs)
	}
	q := func(d func(point) time.Duration) func(point) float64 {
		return func(pt point) float64 { return float64(d(pt)) / 1e6 }
	}
	p50, p99, p999 := q(func(pt point) time.Duration { return pt.res.P50 }), q(func(pt point) time.Duration { return pt.res.P99 }), q(func(pt point) time.Duration { return pt.res.P999 })
	for _, rate := range ov.rates {
		rt := results.Rate{RPS: rate}
		direct := ov.fixed["a"][rate]
		for _, p := range ov.paths {
			pts := ov.fixed[p.key][rate]
			row := results.LatencyRow{Path: p.key, P50Ms: ms(pts, p50), P99Ms: ms(pts, p99), P999Ms: ms(pts, p999),
				Failed: ms(pts, func(pt point) float64 { return float64(pt.res.Requests - pt.ok) })}
			if p.key != "a" {
				row.AddedP50Ms, row.AddedP99Ms, row.AddedP999Ms = added(pts, direct, p50), added(pts, direct, p99), added(pts, direct, p999)
			}
			if p.gw != nil && p.gw.name != "gw-local" { // a gateway deciding on Redis
				row.FallbackPct = ms(pts, func(pt point) float64 { return 100 * pt.fallback })
			}
			rt.Rows = append(rt.Rows, row)
		}
		o.Rates = append(o.Rates, rt)
	}
	for _, p := range ov.paths {
		runs := ov.max[p.key]
		m := results.MaxRow{Path: p.key}
		var rps []float64
		for i, x := range runs {
			rps = append(rps, x.rps)
			if x.rps == 0 { // no rate passed: "< the lowest tried"
				lowest := ov.rates[0]
				if x.first > 0 {
					lowest = min(lowest, x.first)
				}
				if m.BelowRPS == 0 || lowest < m.BelowRPS {
					m.BelowRPS = lowest
				}
			}
			if x.capped {
				m.Capped = true
			} else if x.why != "" {
				m.Failures = append(m.Failures, results.Failure{RPS: x.first, Why: x.why})
			}
			if local := ov.max["b"]; p.key != "b" && i < len(local) && local[i].rps > 0 {
				m.VsLocal.Runs = append(m.VsLocal.Runs, x.rps/local[i].rps)
			}
		}
		m.RPS = results.StatOf(rps)
		m.VsLocal = results.StatOf(m.VsLocal.Runs)
		o.Max = append(o.Max, m)
	}
	return o
}

// added is the quantile of pts minus the direct path's, run by run.
func added(pts, direct []point, q func(point) float64) results.Stat {
	var xs []float64
	for i := range min(len(pts), len(direct)) {
		xs = append(xs, q(pts[i])-q(direct[i]))
	}
	return results.StatOf(xs)
}

func (r *report) collectMemory() *results.Memory {
	m := &results.Memory{}
	if len(r.redisMem) > 0 {
		red := &results.RedisMemory{KeysPerBucket: keysPerBucket}
		var typ, long []float64
		for _, x := range r.redisMem {
			typ, long = append(typ, float64(x.typical)), append(long, float64(x.longest))
		}
		red.UsageTypical, red.UsageLongest = results.StatOf(typ), results.StatOf(long)
		sizes := slices.Sorted(maps.Keys(r.redisMem[0].perBucket))
		for _, n := range sizes {
			var xs []float64
			for _, x := range r.redisMem {
				xs = append(xs, x.perBucket[n])
			}
			red.PerBucket = append(red.PerBucket, results.BucketMemory{Buckets: n, Bytes: results.StatOf(xs)})
		}
		m.Redis = red
	}
	if l := r.local; l != nil {
		m.Local = &results.LocalMemory{Buckets: l.buckets, MB: l.mb, BytesPerBucket: l.perBucket, Keys: l.keys, Live: l.live, Peak: l.peak}
	}
	if g := r.gatewayMem; g != nil {
		loads := make([]float64, len(g.loads))
		for i, d := range g.loads {
			loads[i] = d.Seconds()
		}
		m.Gateway = &results.GatewayMemory{Tenants: g.tenants, Keys: g.keys, Rules: g.rules, Seed: results.Duration(g.seed.Round(time.Millisecond)),
			BaseRSS: float64(g.baseRSS), RSS: float64(g.rss), PeakRSS: float64(g.hwm), ReloadRSS: float64(g.rssReload), ReloadPeakRSS: float64(g.hwmReload),
			BaseHeap: g.baseHp, Heap: g.heap, Ready: results.Duration(g.ready.Round(time.Millisecond)), Reload: results.Duration(g.reload.Round(time.Millisecond)),
			LoadSeconds: results.StatOf(loads)}
	}
	if m.Redis == nil && m.Local == nil && m.Gateway == nil {
		return nil
	}
	return m
}

func (r *report) collectAccuracy() *results.Accuracy {
	ours := r.accuracy["quotaplane"]
	if len(ours) == 0 {
		return nil
	}
	a := &results.Accuracy{Instances: ours[0].instances, Tenants: ours[0].tenants, Offered: ours[0].offered, Duration: results.Duration(ours[0].dur)}
	for _, name := range accuracyLimiters {
		runs := r.accuracy[name]
		if len(runs) == 0 {
			continue
		}
		f := func(g func(accuracyRun) float64) results.Stat {
			xs := make([]float64, len(runs))
			for i, x := range runs {
				xs[i] = g(x)
			}
			return results.StatOf(xs)
		}
		a.Rows = append(a.Rows, results.AccuracyRow{Limiter: name,
			MaxErr:       f(func(x accuracyRun) float64 { return x.maxErr }),
			MeanErr:      f(func(x accuracyRun) float64 { return x.meanErr }),
			MaxOver:      f(func(x accuracyRun) float64 { return x.maxOver }),
			MaxErrExact:  f(func(x accuracyRun) float64 { return x.maxErrExact }),
			MeanErrExact: f(func(x accuracyRun) float64 { return x.meanErrExact }),
			Decisions:    f(func(x accuracyRun) float64 { return float64(x.decisions) }),
			FallbackPct: f(func(x accuracyRun) float64 {
				return 100 * float64(x.bySource["fallback"]) / float64(max(x.decisions, 1))
			}),
		})
	}
	return a
}

func (pr *profileResult) collect() *results.Profile {
	p := &results.Profile{RPS: pr.rate, Duration: results.Duration(pr.dur), Requests: pr.requests, FallbackPct: 100 * pr.fallback,
		CPUPerRequestUs: float64(pr.cpu.Microseconds()) / pr.requests, BytesPerRequest: pr.allocB / pr.requests, AllocsPerRequest: pr.allocN / pr.requests}
	for _, c := range pr.classes {
		p.Classes = append(p.Classes, results.CostClass{ID: c.id, Name: c.name, CPUPct: 100 * c.cpu, BytesPct: 100 * c.bytes, ObjectsPct: 100 * c.objects})
	}
	return p
}
