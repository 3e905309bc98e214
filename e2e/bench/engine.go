package bench

import (
	"context"
	"fmt"
	"regexp"
	"time"
)

var roundSuffix = regexp.MustCompile(`/round=\d+`)

// engineRuns are the benchmarks of other packages that the suite runs once per run:
// the decision engine next to the Redis ceiling and redis_rate (gateway/limiter: one
// redis-server for all rows; each (keys, callers) group measures the redis-benchmark
// ceiling and every mode seconds apart, one round per run), and the hot-path costs of
// one decision and one proxied request.
func (b *bench) engineRuns() []testRun {
	if b.opts.quick {
		return []testRun{{pkg: "limiter", timeout: 2 * time.Minute, args: []string{
			"-test.run=^$", "-test.benchtime=300x", "-test.count=1", "-engine.rounds=1",
			"-test.bench=DecisionEngine/^keys=hot$/^callers=16$/round=1/^mode=(pipelined|redis_rate|ceiling-P16)$",
		}}}
	}
	return []testRun{
		{pkg: "limiter", timeout: 10 * time.Minute, args: []string{
			"-test.run=^$", "-test.bench=DecisionEngine|RedisDecide|LocalDecide",
			"-test.benchtime=0.3s", "-test.count=1", "-test.benchmem", "-engine.rounds=1",
		}},
		{pkg: "gateway", timeout: 3 * time.Minute, args: []string{
			"-test.run=^$", "-test.bench=^BenchmarkServeHTTP$", "-test.benchtime=0.5s", "-test.count=1", "-test.benchmem",
		}},
		{pkg: "lua", timeout: 3 * time.Minute, args: []string{
			"-test.run=^$", "-test.bench=^BenchmarkTake$", "-test.benchtime=0.5s", "-test.count=1", "-test.benchmem",
		}},
	}
}

// engineRun runs the benchmarks once and keeps every result line.
func (b *bench) engineRun(ctx context.Context, run int) error {
	if b.rep.bench == nil {
		b.rep.bench = map[string][]benchLine{}
	}
	for _, r := range b.engineRuns() {
		out, err := b.runTest(ctx, r)
		if err != nil {
			return err
		}
		lines := parseBench(out)
		if len(lines) == 0 {
			return fmt.Errorf("%s: no benchmark results in\n%s", r.command(), tail(out, 4000))
		}
		for _, l := range lines {
			name := roundSuffix.ReplaceAllString(l.name, "") // one round per run
			b.rep.bench[name] = append(b.rep.bench[name], l)
		}
		if run == 0 {
			b.rep.commands = append(b.rep.commands, r.command())
		}
	}
	return nil
}
