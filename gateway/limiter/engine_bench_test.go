package limiter

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// The decision engine benchmarks (docs/BENCHMARKS.md, "Decision engine"). Every
// sub-benchmark of one run shares one redis-server, so the rows compare side by side:
//
//	go test -run '^$' -bench DecisionEngine -benchtime 2s ./gateway/limiter/ -engine.rounds=3
//
// Each row reports decisions/s, the p50 and p99 of one decision as its caller sees it
// (µs), and the Redis script calls per admitted request (INFO commandstats).

// latencies is a log-linear histogram of durations: 16 sub-buckets per power of two of
// nanoseconds, so a percentile is exact to about 6%.
type latencies struct{ n [64 * 16]int64 }

func (h *latencies) record(d time.Duration) {
	ns := uint64(max(d, 1))
	e := bits.Len64(ns) - 1
	sub := uint64(0)
	if e >= 4 {
		sub = (ns >> (e - 4)) & 15
	} else {
		sub = (ns << (4 - e)) & 15
	}
	h.n[e*16+int(sub)]++
}

func (h *latencies) add(o *latencies) {
	for i, v := range o.n {
		h.n[i] += v
	}
}

// quantile returns the upper edge of the bucket holding quantile q.
func (h *latencies) quantile(q float64) time.Duration {
	var total int64
	for _, v := range h.n {
		total += v
	}
	want := int64(math.Ceil(q * float64(total)))
	var seen int64
	for i, v := range h.n {
		seen += v
		if seen >= want && v > 0 {
			e, sub := i/16, i%16
			return time.Duration(float64(uint64(1)<<e) * (1 + float64(sub+1)/16))
		}
	}
	return 0
}

// engineMode is one way to decide, built on a shared client.
type engineMode struct {
	name  string
	build func(b *testing.B, rdb *redis.Client) func(ctx context.Context, key int) (bool, error)
}

// benchLimit is the rule of the throughput rows: large enough that every request is
// admitted, so every decision is one script call, at a refill at which every limiter
// writes its bucket. At 10^9 per second redis_rate's GCRA step (10^-9 s) is below the
// precision of its clock, so it never wrote and its rows only read (docs/engine-profile.md).
var benchLimit = regions.Limit{Capacity: 1_000_000_000, RefillPerSecond: 1_000_000}

func limiterMode(name string, opts Options, lim regions.Limit) engineMode {
	return engineMode{name: name, build: func(b *testing.B, rdb *redis.Client) func(context.Context, int) (bool, error) {
		opts.Timeout = time.Second // measure Redis, not the fallback
		l := newTestRedis(b, rdb, opts)
		if err := l.Load(context.Background()); err != nil {
			b.Fatal(err)
		}
		tenants := make([]string, 100_000)
		for i := range tenants {
			tenants[i] = fmt.Sprintf("tenant-%06d", i)
		}
		return func(ctx context.Context, key int) (bool, error) {
			d, err := l.Decide(ctx, Request{Tenant: tenants[key], Route: "create-order", Limit: lim})
			if err == nil && d.Source == SourceFallback {
				return false, fmt.Errorf("fallback decision: Redis did not answer within a second")
			}
			return d.Allowed, err
		}
	}}
}

// bareMode is one EVALSHA through go-redis with nothing around it (no timeout context,
// no breaker): the round trip the limiter's own cost is measured against.
var bareMode = engineMode{name: "bare-evalsha", build: func(b *testing.B, rdb *redis.Client) func(context.Context, int) (bool, error) {
	tb := lua.NewTokenBucket(rdb)
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = lua.Keys{}.Bucket(fmt.Sprintf("tenant-%06d", i), "create-order")
	}
	return func(ctx context.Context, key int) (bool, error) {
		res, err := tb.Take(ctx, keys[key], benchLimit.Capacity, benchLimit.RefillPerSecond, 1)
		return res.Granted > 0, err
	}
}}

var redisRateMode = engineMode{name: "redis_rate", build: func(b *testing.B, rdb *redis.Client) func(context.Context, int) (bool, error) {
	rl := redis_rate.NewLimiter(rdb)
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%06d:create-order", i)
	}
	limit := redis_rate.PerSecond(int(benchLimit.RefillPerSecond))
	return func(ctx context.Context, key int) (bool, error) {
		res, err := rl.Allow(ctx, keys[key], limit)
		if err != nil {
			return false, err
		}
		return res.Allowed > 0, nil
	}
}}

// engineRounds repeats every group of rows, so a run yields medians of side-by-side
// measurements: go test -bench DecisionEngine ./gateway/limiter/ -engine.rounds=3.
var engineRounds = flag.Int("engine.rounds", 1, "rounds of the decision engine benchmark")

// BenchmarkDecisionEngine: decisions/s and per-decision latency at 1, 16, 64 and 256
// concurrent callers, on one hot key and on 100,000 keys, for a bare go-redis EVALSHA
// (no limiter around it), the limiter with one EVALSHA per call (plain), the limiter
// with its pipelining batcher (pipelined, the default), go-redis/redis_rate's GCRA,
// and the batcher with leases on (where a hot key at 20,000/s, one instance of 20, is
// mostly decided locally); next to the ceiling of the same Redis with our script,
// measured by redis-benchmark (C, 50 connections, EVALSHA after SCRIPT LOAD) at -P 1
// and -P 16. The rows of one (keys, callers, round) group run seconds apart on one
// redis-server, so their ratios hold even when the box's load drifts.
func BenchmarkDecisionEngine(b *testing.B) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		b.Fatalf("redis-benchmark not found (Debian package redis-tools): %v", err)
	}
	p := testenv.Redis(b)
	rdb := newClient(b, p)
	if err := lua.Load(context.Background(), rdb); err != nil {
		b.Fatal(err)
	}
	hotRule := regions.Limit{Capacity: 20_000, RefillPerSecond: 20_000} // the article's hot tenant
	modes := []engineMode{
		bareMode,
		limiterMode("plain", Options{Pipeline: PipelineOptions{Off: true}}, benchLimit),
		limiterMode("pipelined", Options{}, benchLimit),
		redisRateMode,
		limiterMode("leases", Options{Leases: LeaseOptions{Threshold: 100}, Instances: func() int { return 20 }}, hotRule),
	}
	for _, keys := range []int{1, 100_000} {
		keyName := "hot"
		if keys > 1 {
			keyName = "100k"
		}
		for _, callers := range []int{1, 16, 64, 256} {
			for round := range *engineRounds {
				group := fmt.Sprintf("keys=%s/callers=%d/round=%d", keyName, callers, round+1)
				for _, pipe := range []int{1, 16} {
					b.Run(fmt.Sprintf("%s/mode=ceiling-P%d", group, pipe), func(b *testing.B) {
						runCeiling(b, bin, p, rdb, keys, pipe)
					})
				}
				for _, m := range modes {
					b.Run(group+"/mode="+m.name, func(b *testing.B) {
						runEngine(b, rdb, m, keys, callers)
					})
				}
			}
		}
	}
}

// runEngine makes b.N decisions from callers goroutines on keys keys (uniformly random)
// and reports the metrics.
func runEngine(b *testing.B, rdb *redis.Client, m engineMode, keys, callers int) {
	decide := m.build(b, rdb)
	ctx := context.Background()
	// Warm up: connections dialled, scripts cached, hot keys leased.
	for i := range 2000 {
		if _, err := decide(ctx, i%keys); err != nil {
			b.Fatal(err)
		}
	}
	callsBefore, cpuBefore := scriptCalls(b, rdb), redisCPU(b, rdb)
	var (
		next, admitted atomic.Int64
		wg             sync.WaitGroup
		mu             sync.Mutex
		all            latencies
		failed         atomic.Pointer[error]
	)
	n := int64(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var h latencies
			var ok int64
			for next.Add(1) <= n {
				key := 0
				if keys > 1 {
					key = rand.IntN(keys)
				}
				t0 := time.Now()
				allowed, err := decide(ctx, key)
				h.record(time.Since(t0))
				if err != nil {
					failed.Store(&err)
					return
				}
				if allowed {
					ok++
				}
			}
			admitted.Add(ok)
			mu.Lock()
			all.add(&h)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	calls := scriptCalls(b, rdb) - callsBefore
	cpu := redisCPU(b, rdb) - cpuBefore
	b.ReportMetric(float64(n)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(cpu.Seconds()/elapsed.Seconds(), "redis-cpu-busy")
	b.ReportMetric(float64(all.quantile(0.50))/1e3, "p50-µs")
	b.ReportMetric(float64(all.quantile(0.99))/1e3, "p99-µs")
	if a := admitted.Load(); a > 0 {
		b.ReportMetric(float64(calls)/float64(a), "redis-calls/admitted")
	}
	b.ReportMetric(float64(admitted.Load())/float64(n), "admitted/decision")
}

// redisCPU is the CPU time the server has used (INFO cpu, user + system).
func redisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.Lines(info) {
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("INFO cpu %q: %v", line, err)
				}
				total += x
			}
		}
	}
	return time.Duration(total * 1e9)
}

// rpsLine matches redis-benchmark -q output: "NAME: 158730.16 requests per second,
// p50=0.151 msec".
var rpsLine = regexp.MustCompile(`([0-9.]+) requests per second`)

// runCeiling runs max(b.N, 10000) calls of decide.lua, one decision each, from 50
// connections with pipe calls in flight on each (redis-benchmark's -c 50 -P pipe; its
// arguments are binary, which redis-benchmark cannot send, so testenv.Blast sends them)
// against p, on one key or on 100,000 random ones, so ns/op is the inverse of its
// throughput.
func runCeiling(b *testing.B, bin string, p *testenv.Process, rdb *redis.Client, keys, pipe int) {
	n := max(b.N, 10_000)
	cmds := make([][]byte, 0, 10_000)
	for i := range cap(cmds) {
		var batch lua.Batch
		key := lua.Keys{}.Bucket(fmt.Sprintf("tenant-%06d", rand.IntN(keys)), "create-order")
		batch.Add(lua.Decision{Op: lua.OpTake, N: 1, Buckets: []lua.Bucket{{Key: key, Capacity: 1_000_000_000, Refill: 1_000_000_000, Cap: lua.NoCap}}})
		ks, arg := batch.Args()
		cmds = append(cmds, testenv.RESPCommand([]byte("EVALSHA"), []byte(lua.DecideSha()), []byte("1"), []byte(ks[0]), arg))
		_ = i
	}
	callsBefore, cpuBefore := scriptCalls(b, rdb), redisCPU(b, rdb)
	b.ResetTimer()
	elapsed, err := testenv.Blast(context.Background(), testenv.BlastOptions{Addr: p.Addr(), Conns: 50, Pipe: pipe, Total: n, Commands: cmds})
	b.StopTimer()
	if err != nil {
		b.Fatalf("blast: %v", err)
	}
	if calls := scriptCalls(b, rdb) - callsBefore; calls < int64(n) {
		b.Fatalf("made %d script calls, want %d", calls, n)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric((redisCPU(b, rdb)-cpuBefore).Seconds()/elapsed.Seconds(), "redis-cpu-busy")
}
