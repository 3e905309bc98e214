package limiter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// newClient returns a go-redis client for p, configured as the gateway must configure
// it (ContextTimeoutEnabled), closed at cleanup.
func newClient(t testing.TB, p *testenv.Process) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func newTestRedis(t testing.TB, rdb Client, opts Options) *Redis {
	t.Helper()
	l, err := NewRedis(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// pollUntil calls f until it returns true or the deadline passes.
func pollUntil(t testing.TB, timeout time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var article = Request{Tenant: "shop-a", Route: "create-order", Limit: regions.Limit{Capacity: 2, RefillPerSecond: 1}}

func TestRedisDecide(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	l := newTestRedis(t, rdb, Options{KeyPrefix: "t1", Timeout: time.Second})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []Decision{
		{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Second, Source: SourceRedis},
		{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 2 * time.Second, Source: SourceRedis},
	}
	for i, w := range want {
		d := mustDecide(t, l, article)
		// Real time passes between calls: allow up to 50 ms of refill in ResetAfter.
		if d.Allowed != w.Allowed || d.Limit != w.Limit || d.Remaining != w.Remaining || d.Source != w.Source ||
			d.ResetAfter > w.ResetAfter || d.ResetAfter < w.ResetAfter-50*time.Millisecond {
			t.Fatalf("request %d: got %+v, want about %+v", i+1, d, w)
		}
	}
	d := mustDecide(t, l, article)
	if d.Allowed || d.Source != SourceRedis || d.RetryAfter <= 900*time.Millisecond || d.RetryAfter > time.Second {
		t.Fatalf("request 3: got %+v, want rejected by redis with RetryAfter about 1s", d)
	}
	if n := rdb.Exists(context.Background(), "t1:{shop-a}:create-order").Val(); n != 1 {
		t.Errorf("bucket key t1:{shop-a}:create-order not in Redis")
	}
	if l.FallbackActive() {
		t.Errorf("FallbackActive with a healthy Redis")
	}
}

func TestNewRedisRefusesClientWithoutContextTimeouts(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	if _, err := NewRedis(rdb, Options{}); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Errorf("NewRedis with ContextTimeoutEnabled false: err %v, want one naming ContextTimeoutEnabled", err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	if _, err := NewRedis(cc, Options{}); err == nil {
		t.Errorf("NewRedis with a cluster client without ContextTimeoutEnabled: no error")
	}
	if _, err := NewRedis(nil, Options{}); err == nil {
		t.Errorf("NewRedis(nil): no error")
	}
	ok := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer ok.Close()
	if _, err := NewRedis(ok, Options{Timeout: -time.Millisecond}); err == nil {
		t.Errorf("negative Timeout: no error")
	}
}

func TestRedisInvalidRequest(t *testing.T) {
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, newClient(t, p), Options{Region: "test", Registerer: reg})
	r := article
	r.Cost = 3
	if d, err := l.Decide(context.Background(), r); !errors.Is(err, ErrInvalidRequest) || d.Allowed {
		t.Errorf("cost above capacity: %+v, %v; want ErrInvalidRequest", d, err)
	}
	r = article
	r.Limit.RefillPerSecond = 0
	if _, err := l.Decide(context.Background(), r); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("refill 0: %v, want ErrInvalidRequest", err)
	}
	if v := metricValue(t, reg, "ratelimit_redis_errors_total", map[string]string{"reason": "invalid"}); v != 0 {
		t.Errorf("invalid requests reached Redis: %v", v)
	}
}

func TestRedisCallerGoneDoesNotTripBreaker(t *testing.T) {
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{Breaker: BreakerOptions{Failures: 2}, Timeout: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 10 {
		if _, err := l.Decide(ctx, article); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled caller: err %v, want context.Canceled", err)
		}
	}
	if l.FallbackActive() {
		t.Errorf("cancelled callers opened the breaker")
	}
	if d := mustDecide(t, l, article); d.Source != SourceRedis {
		t.Errorf("after cancelled callers: %+v, want a redis decision", d)
	}
}

// TestRedisKilledFallsBackAndRecovers: Redis dies, decisions continue from the
// fallback with no error, the breaker opens; Redis comes back, decisions come from Redis
// again after the breaker's open period.
func TestRedisKilledFallsBackAndRecovers(t *testing.T) {
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	var logs lockedBuffer // the script reload logs from a goroutine of its own
	l := newTestRedis(t, newClient(t, p), Options{
		Region:     "test",
		Breaker:    BreakerOptions{OpenFor: 100 * time.Millisecond},
		Registerer: reg,
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
	})
	lots := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 1_000_000, RefillPerSecond: 1000}}
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 5*time.Second, "a redis decision before the kill", func() bool {
		return mustDecide(t, l, lots).Source == SourceRedis
	})
	gauge := func(name string) float64 { return metricValue(t, reg, name, map[string]string{"region": "test"}) }
	if gauge("ratelimit_breaker_state") != 0 || gauge("ratelimit_fallback_active") != 0 {
		t.Fatalf("breaker not closed before the kill")
	}
	failed := func() float64 {
		return metricValue(t, reg, "ratelimit_redis_errors_total", map[string]string{"reason": "error"}) +
			metricValue(t, reg, "ratelimit_redis_errors_total", map[string]string{"reason": "timeout"})
	}
	failedBefore := failed()

	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	// Refused until the breaker opens, then from fallback buckets that start empty and
	// earn 1000/s: every decision is the fallback's, none an error.
	for i := range 20 {
		if d := mustDecide(t, l, lots); d.Source != SourceFallback {
			t.Fatalf("decision %d with Redis dead: %+v, want the fallback's", i, d)
		}
	}
	if !l.FallbackActive() || gauge("ratelimit_breaker_state") != 2 || gauge("ratelimit_fallback_active") != 1 {
		t.Errorf("breaker state %v, fallback active %v: want open (2) and 1", gauge("ratelimit_breaker_state"), gauge("ratelimit_fallback_active"))
	}
	// The breaker opens after DefaultBreakerFailures failed calls; the rest never reach
	// Redis (a slow run may also see a failed half-open probe).
	failures := failed() - failedBefore
	open := metricValue(t, reg, "ratelimit_redis_errors_total", map[string]string{"reason": "breaker_open"})
	if failures < DefaultBreakerFailures || failures > DefaultBreakerFailures+2 || failures+open != 20 {
		t.Errorf("%v failed calls and %v refused by the breaker, want %d (+ a probe or two) and the rest of 20", failures, open, DefaultBreakerFailures)
	}

	if err := p.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "decisions from redis after restart", func() bool {
		return mustDecide(t, l, lots).Source == SourceRedis
	})
	if l.FallbackActive() || gauge("ratelimit_breaker_state") != 0 || gauge("ratelimit_fallback_active") != 0 {
		t.Errorf("after recovery: breaker state %v, fallback active %v; want 0 and 0", gauge("ratelimit_breaker_state"), gauge("ratelimit_fallback_active"))
	}
	// Only state changes are logged: closed->open, then open->half-open(->open)*, ->closed.
	lines := strings.Count(logs.String(), "\n")
	if lines < 3 || !strings.Contains(logs.String(), "to=open") || !strings.Contains(logs.String(), "closed") {
		t.Errorf("breaker logs:\n%s\nwant its state changes", logs.String())
	}
	if strings.Count(logs.String(), "level=DEBUG") > 0 {
		t.Errorf("debug lines logged at the default level:\n%s", logs.String())
	}
}

// TestRedisLogsOnlyStateChanges: many failing decisions, one breaker change, one line.
func TestRedisLogsOnlyStateChanges(t *testing.T) {
	p := testenv.Redis(t)
	var logs lockedBuffer
	l := newTestRedis(t, newClient(t, p), Options{
		Region: "test", Breaker: BreakerOptions{OpenFor: time.Hour}, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		mustDecide(t, l, article)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 {
		t.Errorf("%d log lines for 100 failing decisions, want 1 (closed -> open):\n%s", n, logs.String())
	}
}

// TestRedisPausedAnswersWithinTimeout: a SIGSTOPped Redis accepts connections and
// answers nothing; every decision still returns within the timeout plus scheduling noise.
// Without the timeout a call would wait for go-redis's ReadTimeout (seconds).
func TestRedisPausedAnswersWithinTimeout(t *testing.T) {
	const (
		bound = 50 * time.Millisecond // 5 ms timeout + generous noise on a loaded 2-core box
		// A decision that calls Redis waits for a timer and a socket deadline; on a box
		// with a load average of 10, under -race, one in a few runs is woken late. A few
		// may pass bound, none may reach a second.
		lateAllowed = 2
		// Without the timeout a call would wait for go-redis's ReadTimeout (3 s); a
		// scheduler starved by other jobs has been seen to wake one decision 450 ms late.
		hardBound = time.Second
	)
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	l := newTestRedis(t, newClient(t, p), Options{Region: "test", Breaker: BreakerOptions{OpenFor: 100 * time.Millisecond}, Registerer: reg})
	lots := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: 1_000_000, RefillPerSecond: 1000}}
	if err := l.Load(context.Background()); err != nil { // a pooled connection exists
		t.Fatal(err)
	}

	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Resume() })
	end := time.Now().Add(500 * time.Millisecond) // long enough for half-open probes
	n, late, slowest := 0, 0, time.Duration(0)
	for time.Now().Before(end) {
		start := time.Now()
		d := mustDecide(t, l, lots)
		took := time.Since(start)
		slowest = max(slowest, took)
		if took > bound {
			late++
		}
		if d.Source != SourceFallback {
			t.Fatalf("decision %d with Redis paused: %+v, want the fallback's", n, d)
		}
		n++
	}
	t.Logf("%d decisions with Redis paused: slowest %v, %d over %v", n, slowest, late, bound)
	if late > lateAllowed || slowest > hardBound {
		t.Errorf("%d decisions over %v (want <= %d), slowest %v (want < %v)", late, bound, lateAllowed, slowest, hardBound)
	}
	if v := metricValue(t, reg, "ratelimit_redis_errors_total", map[string]string{"reason": "timeout"}); v < DefaultBreakerFailures {
		t.Errorf("timeouts counted: %v, want >= %d", v, DefaultBreakerFailures)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "decisions from redis after resume", func() bool {
		return mustDecide(t, l, lots).Source == SourceRedis
	})
}

// TestRedisFallbackScalesByInstances: with Redis down, each instance holds 1/N of the
// rule, N from heartbeats, else ExpectedInstances; a rule too small to split keeps one
// token and is counted.
func TestRedisFallbackScalesByInstances(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		live        int
		expected    int
		capacity    int64
		cost        int64
		admitted    int64
		minCapacity float64
	}{
		{"4 live instances", 4, 20, 100, 1, 25, 0},
		{"heartbeats unknown: expected instances", 0, 5, 100, 1, 20, 0},
		{"one instance keeps the whole rule", 1, 20, 100, 1, 100, 0},
		{"uneven split rounds", 3, 20, 100, 1, 33, 0},
		{"too small to split keeps 1 token", 4, 20, 3, 1, 1, 4}, // 4 decisions below
		{"half a token rounds up to 1", 4, 20, 2, 1, 1, 4},
		{"cost above the instance's capacity is rejected, not clipped", 4, 20, 8, 4, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			reg := prometheus.NewRegistry()
			l := newTestRedis(t, rdb, Options{
				Region: "test", Now: clock.Now, Registerer: reg,
				Instances:         func() int { return tt.live },
				ExpectedInstances: tt.expected,
				Breaker:           BreakerOptions{Failures: 1, FailureSpan: time.Millisecond, OpenFor: time.Hour},
			})
			openBreaker(t, l, clock)
			r := Request{Tenant: "t", Route: "r", Limit: regions.Limit{Capacity: tt.capacity, RefillPerSecond: 0.001}, Cost: tt.cost}
			mustDecide(t, l, r)              // the fallback bucket starts empty...
			clock.Advance(1e9 * time.Second) // ...and fills
			var admitted int64
			calls := tt.admitted + 2
			for range calls {
				d := mustDecide(t, l, r)
				if d.Source != SourceFallback {
					t.Fatalf("Redis dead: %+v, want fallback", d)
				}
				if d.Allowed {
					admitted++
				}
			}
			if admitted != tt.admitted {
				t.Errorf("fallback admitted %d, want %d", admitted, tt.admitted)
			}
			if v := metricValue(t, reg, "ratelimit_fallback_min_capacity_total", map[string]string{"region": "test"}); v != tt.minCapacity {
				t.Errorf("ratelimit_fallback_min_capacity_total = %v, want %v", v, tt.minCapacity)
			}
		})
	}
}

func TestRedisMetricsPreinitialised(t *testing.T) {
	p := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	newTestRedis(t, newClient(t, p), Options{Region: "eu", Registerer: reg})
	for _, reason := range []string{"timeout", "error", "breaker_open", "invalid"} {
		if v := metricValue(t, reg, "ratelimit_redis_errors_total", map[string]string{"region": "eu", "reason": reason}); v != 0 {
			t.Errorf("ratelimit_redis_errors_total{reason=%q} = %v, want 0", reason, v)
		}
	}
	for _, name := range []string{"ratelimit_breaker_state", "ratelimit_fallback_active", "ratelimit_fallback_min_capacity_total", "ratelimit_local_buckets"} {
		metricValue(t, reg, name, map[string]string{"region": "eu"})
	}
	if _, err := NewRedis(newClient(t, p), Options{Region: "eu", Registerer: reg}); err == nil {
		t.Error("second limiter on one registry: no error")
	}
}

func BenchmarkRedisDecide(b *testing.B) {
	p := testenv.Redis(b)
	l := newTestRedis(b, newClient(b, p), Options{Timeout: time.Second})
	reqs := make([]Request, 1024)
	for i := range reqs {
		reqs[i] = Request{Tenant: fmt.Sprintf("tenant-%04d", i), Route: "create-order", Limit: regions.Limit{Capacity: 1_000_000, RefillPerSecond: 1000}}
	}
	ctx := context.Background()
	mustDecide(b, l, reqs[0])
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		d, err := l.Decide(ctx, reqs[i&1023])
		if err != nil || d.Source != SourceRedis {
			b.Fatalf("%+v, %v", d, err)
		}
		i++
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes and reads: a log sink
// that a test reads while the limiter's goroutines may still write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
