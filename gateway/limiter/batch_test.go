package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// decideConcurrently runs callers goroutines of n decisions each and returns the
// decisions by source and how many were allowed.
func decideConcurrently(t *testing.T, l *Redis, callers, n int, r func(i int) Request) (map[Source]int, int) {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		sources = map[Source]int{}
		allowed int
		failed  atomic.Pointer[error]
	)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				d, err := l.Decide(context.Background(), r(c*n+i))
				if err != nil {
					failed.Store(&err)
					return
				}
				mu.Lock()
				sources[d.Source]++
				if d.Allowed {
					allowed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("Decide: %v", *err)
	}
	return sources, allowed
}

// TestPipelinedDecisionsExact: 256 concurrent callers on one 1,000-token bucket admit
// exactly 1,000, through pipelines of several calls each.
func TestPipelinedDecisionsExact(t *testing.T) {
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, newClient(t, p), Options{Region: "test", Registerer: reg, Timeout: 2 * time.Second})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 1000, RefillPerSecond: 0.001}}
	sources, allowed := decideConcurrently(t, l, 256, 8, func(int) Request { return r })
	if allowed != 1000 || sources[SourceRedis] != 2048 {
		t.Errorf("256 x 8 decisions: %d allowed (want 1000), sources %v (want all redis)", allowed, sources)
	}
	pipes := metricValue(t, reg, "ratelimit_redis_pipelines_total", nil)
	calls := metricValue(t, reg, "ratelimit_redis_pipelined_calls_total", nil)
	t.Logf("%v pipelines of %v calls (mean %.1f); %v calls went alone", pipes, calls, calls/pipes, 2048-calls)
	if pipes == 0 || calls/pipes < 2 || calls > 2048 {
		t.Errorf("%v pipelines, %v calls: want pipelines of 2 or more calls on average", pipes, calls)
	}
}

// TestPipelineReloadsScripts: calls queued in a pipeline after Redis lost its scripts
// (a restart, SCRIPT FLUSH) fail with NOSCRIPT, are retried as EVAL in one more round
// trip, and answer normally; the EVAL reloads the script for the next ones.
func TestPipelineReloadsScripts(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, rdb, Options{Region: "test", Registerer: reg, Timeout: 2 * time.Second})
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	one := func(op lua.Op, key string, n int64) *call {
		return &call{d: lua.Decision{Op: op, N: n, Buckets: []lua.Bucket{{Key: key, Capacity: 5, Refill: 0.001, Cap: lua.NoCap}}}, done: make(chan struct{}, 1)}
	}
	batch := []*call{one(lua.OpTake, "a", 2), one(lua.OpLease, "b", 9), one(lua.OpTake, "c", 1)}
	batch[2].state.Store(callAbandoned) // its caller gave up while it was queued
	var s sender
	s.exec(l.batch, batch)
	if c := batch[0]; c.err != nil || c.out.Granted != 1 || c.out.Buckets[0].Remaining != 3 || len(c.done) != 1 {
		t.Errorf("take after SCRIPT FLUSH: %+v, want admitted with 3 remaining, answered", c)
	}
	if c := batch[1]; c.err != nil || c.out.Granted != 5 || c.out.Buckets[0].Remaining != 0 || len(c.done) != 1 {
		t.Errorf("lease after SCRIPT FLUSH: %+v, want 5 granted, answered", c)
	}
	if c := batch[2]; len(c.done) != 0 || rdb.Exists(ctx, "c").Val() != 0 {
		t.Errorf("an abandoned call was sent or answered")
	}
	if v := metricValue(t, reg, "ratelimit_redis_noscript_reloads_total", nil); v != 1 {
		t.Errorf("ratelimit_redis_noscript_reloads_total = %v, want 1", v)
	}
	if ok, err := rdb.ScriptExists(ctx, lua.DecideSha()).Result(); err != nil || !ok[0] {
		t.Errorf("scripts not reloaded by the retry: %v, %v", ok, err)
	}
}

// TestPipelinedTimeoutPerDecision: with Redis frozen, each of many concurrent
// decisions still returns within its own timeout, from the fallback; the breaker takes
// their timeouts, all at once, for one stall, and opens once Redis has gone on failing
// for the span; after Redis resumes, decisions come from Redis again.
func TestPipelinedTimeoutPerDecision(t *testing.T) {
	const (
		timeout = 20 * time.Millisecond
		bound   = 250 * time.Millisecond // timeout + scheduling noise on a loaded box under -race
	)
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	clock := newFakeClock() // the breaker's failure span runs on it
	l := newTestRedis(t, newClient(t, p), Options{
		Region: "test", Registerer: reg, Timeout: timeout, Breaker: BreakerOptions{OpenFor: 100 * time.Millisecond}, Pipeline: PipelineOptions{InFlight: 2},
		Now: clock.Now,
	})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	lots := func(i int) Request {
		return Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 1_000_000, RefillPerSecond: 1000}}
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Resume() })
	var slowest atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			d, err := l.Decide(context.Background(), lots(0))
			took := time.Since(start)
			for {
				old := slowest.Load()
				if int64(took) <= old || slowest.CompareAndSwap(old, int64(took)) {
					break
				}
			}
			// The breaker is closed (one stall): the fallback refuses, within the timeout.
			if err != nil || d.Source != SourceFallback || d.Allowed {
				t.Errorf("Redis frozen: %+v, %v; want refused by the fallback", d, err)
			}
		}()
	}
	wg.Wait()
	t.Logf("64 concurrent decisions with Redis frozen: slowest %v", time.Duration(slowest.Load()))
	if time.Duration(slowest.Load()) > bound {
		t.Errorf("slowest decision %v, want within %v", time.Duration(slowest.Load()), bound)
	}
	// 64 calls that timed out together, within no time on the breaker's clock, are one
	// stall: the breaker stays closed.
	if l.FallbackActive() {
		t.Errorf("breaker open after 64 timeouts that all happened at once; want it closed until they span %v", DefaultBreakerFailures*timeout)
	}
	if timeouts := metricValue(t, reg, "ratelimit_redis_errors_total", map[string]string{"reason": "timeout"}); timeouts != 64 {
		t.Errorf("%v timeouts, want 64", timeouts)
	}
	// Failing for the span opens it.
	clock.Advance(DefaultBreakerFailures * timeout)
	if d := mustDecide(t, l, lots(0)); d.Source != SourceFallback {
		t.Errorf("Redis frozen: %+v, want a fallback decision", d)
	}
	if !l.FallbackActive() {
		t.Errorf("breaker not open after Redis failed for %v", DefaultBreakerFailures*timeout)
	}
	if open := metricValue(t, reg, "ratelimit_redis_errors_total", map[string]string{"reason": "breaker_open"}); open != 0 {
		t.Errorf("%v calls refused by the breaker before it opened, want 0", open)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "decisions from redis after resume", func() bool {
		return mustDecide(t, l, lots(0)).Source == SourceRedis
	})
}

// TestPipelinedCallerGone: a caller whose context ends while its call is queued gets
// its context's error at once, and that is not a Redis failure.
func TestPipelinedCallerGone(t *testing.T) {
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{Timeout: 5 * time.Second, Pipeline: PipelineOptions{InFlight: 1}, Breaker: BreakerOptions{Failures: 1}})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Resume() })
	r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 100, RefillPerSecond: 1}}
	// The one slot is taken by a call Redis will not answer while paused.
	first := make(chan error, 1)
	go func() {
		_, err := l.Decide(context.Background(), r)
		first <- err
	}()
	pollUntil(t, 5*time.Second, "the first call out", func() bool {
		l.batch.mu.Lock()
		defer l.batch.mu.Unlock()
		return l.batch.inflight == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Decide(ctx, r)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Errorf("queued caller whose context ended: %v after %v, want its context's error within a second", err, time.Since(start))
	}
	if l.FallbackActive() {
		t.Errorf("a caller's context opened the breaker (BreakerFailures 1)")
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Errorf("first call: %v", err)
	}
}

// TestNoScriptReloadsAllScripts: after Redis lost its scripts, the first decision that
// meets NOSCRIPT (alone, or in a pipeline) answers through EVAL and has all three
// scripts loaded again out of band, so a call that cannot fit an EVAL into its timeout
// (a slow or starved Redis) does not fail the same way forever.
func TestNoScriptReloadsAllScripts(t *testing.T) {
	for _, pipelining := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipelining=%v", pipelining), func(t *testing.T) {
			p := testenv.Redis(t)
			rdb := newClient(t, p)
			reg := prometheus.NewRegistry()
			l := newTestRedis(t, rdb, Options{Region: "test", Registerer: reg, Timeout: time.Second, Pipeline: PipelineOptions{Off: !pipelining}})
			ctx := context.Background()
			if err := l.Load(ctx); err != nil {
				t.Fatal(err)
			}
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 100, RefillPerSecond: 1}}
			if pipelining {
				// Enough concurrent callers that some calls go in pipelines.
				if sources, _ := decideConcurrently(t, l, 32, 4, func(int) Request { return r }); sources[SourceRedis] != 128 {
					t.Fatalf("sources %v, want 128 redis decisions", sources)
				}
			} else if d := mustDecide(t, l, r); d.Source != SourceRedis || !d.Allowed {
				t.Fatalf("first decision after SCRIPT FLUSH: %+v, want allowed by redis", d)
			}
			pollUntil(t, 5*time.Second, "the script back in Redis", func() bool {
				ok, err := rdb.ScriptExists(ctx, lua.DecideSha()).Result()
				return err == nil && ok[0]
			})
			if v := metricValue(t, reg, "ratelimit_redis_noscript_reloads_total", nil); v < 1 {
				t.Errorf("ratelimit_redis_noscript_reloads_total = %v, want >= 1", v)
			}
		})
	}
}
