package bench

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/e2e/bench/results"
)

func line(name string, n int64, metrics map[string]float64) benchLine {
	return benchLine{name: name, n: n, metrics: metrics}
}

// TestCollectEngine: the engine rows, the ratios taken run by run, the leases check
// (calls less the last lease within admitted / 20 in every run) and the hot-path rows,
// from go test -bench lines as the runner keeps them.
func TestCollectEngine(t *testing.T) {
	r := newReport()
	add := func(name string, ls ...benchLine) { r.bench[name] = append(r.bench[name], ls...) }
	dps := func(v float64) map[string]float64 {
		return map[string]float64{"decisions/s": v, "p50-µs": 100, "p99-µs": 900, "redis-cpu-busy": 0.5, "allocs/op": 18}
	}
	add(engineName("pipelined", "100k", 64), line("", 1, dps(90)), line("", 1, dps(120)))
	add(engineName("redis_rate", "100k", 64), line("", 1, dps(50)), line("", 1, dps(100)))
	add(engineName("ceiling-P16", "100k", 64), line("", 1, map[string]float64{"decisions/s": 100, "redis-cpu-busy": 0.9}), line("", 1, map[string]float64{"decisions/s": 100, "redis-cpu-busy": 0.9}))
	// Leases: 2,000 decisions, all admitted; 101 calls is the bound (100 + the last lease).
	lease := func(calls float64) benchLine {
		return line("", 2000, map[string]float64{"admitted/decision": 1, "redis-calls/admitted": calls / 2000})
	}
	add(engineName("leases", "hot", 1), lease(101), lease(101))
	add(engineName("leases", "hot", 16), lease(101), lease(102))
	add("BenchmarkTake", line("", 1, map[string]float64{"ns/op": 76000, "B/op": 584, "allocs/op": 17}))

	e := r.collectEngine()
	if e == nil {
		t.Fatal("no engine results")
	}
	row := e.Row("100k", 64, "pipelined")
	if row == nil || row.DecisionsPerS.Med != 105 || row.P99Us.Med != 900 || row.AllocsPerOp.Med != 18 {
		t.Errorf("pipelined row %+v", row)
	}
	if c := e.Row("100k", 64, "ceiling-P16"); c == nil || c.P99Us.Measured() || c.RedisCPU.Med != 0.9 {
		t.Errorf("ceiling row %+v: only decisions/s and Redis CPU", c)
	}
	rel := e.Rel("100k", 64)
	// Run by run: 90/50 = 1.8 and 120/100 = 1.2, median 1.5 (not 105/75 = 1.4).
	if rel == nil || rel.VsRedisRate.Med != 1.5 || rel.VsRedisRate.Min != 1.2 || rel.VsCeiling.Med != 1.05 || rel.VsBare.Measured() {
		t.Errorf("relative %+v", rel)
	}
	if len(e.Leases) != 2 || !*e.Leases[0].WithinBound || *e.Leases[1].WithinBound {
		t.Errorf("leases %+v: want within at 1 caller (101 calls), not at 16 (102 in one run)", e.Leases)
	}
	hp := r.collectHotPath()
	if len(hp) != 1 || hp[0].Benchmark != "BenchmarkTake" || hp[0].NsPerOp.Med != 76000 {
		t.Errorf("hot path %+v", hp)
	}
	b := &bench{rep: r}
	out := b.collect(results.Run{Runs: 2, Start: time.Unix(0, 0)})
	for _, x := range results.Targets(out, nil) {
		if x.ID == "engine-vs-redis-rate-64" && (x.Verdict != results.NotMet || x.Figure != "1.50x [1.20x–1.80x]") {
			t.Errorf("target %+v", x)
		}
		if x.ID == "leases" && x.Verdict != results.NotMet {
			t.Errorf("target %+v", x)
		}
	}
}
