package bench

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// accuracyRun is one run of the accuracy phase.
type accuracyRun struct {
	limiter            string // "quotaplane" or "redis_rate"
	instances, tenants int
	offered            float64 // offered rate / refill
	dur                time.Duration
	decisions          int64
	bySource           map[string]int64 // decisions by source (ours: redis, fallback)
	admittedBySource   map[string]int64
	// Per tenant, admitted vs capacity + refill x elapsed (the ceiling) and vs one
	// exact token bucket fed the same arrivals: errors in % of the reference.
	maxErr, meanErr           float64 // vs the ceiling, |error|
	maxOver                   float64 // the largest over-admission vs the ceiling (negative: none)
	maxErrExact, meanErrExact float64
}

// accuracyTenant is one tenant's rule and what happened to it.
type accuracyTenant struct {
	id       string
	lim      regions.Limit
	admitted atomic.Int64
	first    atomic.Int64 // Unix ns of the first decision asked
	last     atomic.Int64 // Unix ns of the last decision asked
	mu       sync.Mutex
	arrivals []int64 // decisions asked per millisecond since the run's origin
}

// accuracyLimiters are measured one after the other, each on a fresh Redis, with the
// same tenants and load: ours with the gateway's 5 ms timeout, ours with a 100 ms one
// (every decision from Redis on a loaded machine: the algorithm's own accuracy), and
// go-redis/redis_rate (GCRA).
var accuracyLimiters = []string{"quotaplane", "quotaplane-100ms", "redis_rate"}

// accuracyRun runs the accuracy measurement of every limiter once.
func (b *bench) accuracyRun(ctx context.Context, run int) error {
	for _, name := range accuracyLimiters {
		a, err := b.accuracyOnce(ctx, run, name)
		if err != nil {
			return err
		}
		b.rep.accuracy[name] = append(b.rep.accuracy[name], a)
		b.logf("accuracy run %d, %s: %d decisions %v, admitted %v; vs capacity+refill x elapsed: max %.2f%% mean %.2f%% (largest over %.2f%%); vs exact bucket: max %.2f%% mean %.2f%%",
			run+1, name, a.decisions, a.bySource, a.admittedBySource, a.maxErr, a.meanErr, a.maxOver, a.maxErrExact, a.meanErrExact)
	}
	return nil
}

// decider is one instance's decision function.
type decider func(ctx context.Context, t *accuracyTenant) (allowed bool, source string, err error)

// accuracyOnce: instances limiters (each with its own Redis client and, for ours, its own
// batcher and fallback, as separate gateways have) on one Redis; tenants tenants with
// rules of different sizes, each offered three times its refill rate, spread evenly over
// the instances, for the duration. Ours runs with the gateway's defaults: 5 ms timeout,
// pipelining on, leases off, fallback 1/N with N = instances.
func (b *bench) accuracyOnce(ctx context.Context, run int, name string) (accuracyRun, error) {
	a := accuracyRun{limiter: name, instances: 20, tenants: 100, offered: 3, dur: 10 * time.Second, bySource: map[string]int64{}, admittedBySource: map[string]int64{}}
	if b.opts.quick {
		a.tenants, a.dur = 10, time.Second
	}
	rd, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: filepath.Join(b.work, fmt.Sprintf("redis-accuracy-%d-%s", run, name))})
	if err != nil {
		return a, err
	}
	defer rd.Kill()
	deciders := make([]decider, a.instances)
	for i := range deciders {
		// The gateway's client options: see gateway.newRedisClient.
		rdb := redis.NewClient(&redis.Options{Addr: rd.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, MinIdleConns: limiter.DefaultPipelineInFlight})
		defer rdb.Close()
		if name == "redis_rate" {
			rl := redis_rate.NewLimiter(rdb)
			deciders[i] = func(ctx context.Context, t *accuracyTenant) (bool, string, error) {
				res, err := rl.Allow(ctx, t.id+":"+benchRoute, redis_rate.Limit{Rate: int(t.lim.RefillPerSecond), Burst: int(t.lim.Capacity), Period: time.Second})
				if err != nil {
					return false, "", err
				}
				return res.Allowed > 0, "redis", nil
			}
			continue
		}
		var timeout time.Duration // the default, 5 ms
		if name == "quotaplane-100ms" {
			timeout = 100 * time.Millisecond
		}
		l, err := limiter.NewRedis(rdb, limiter.Options{Region: "bench", Timeout: timeout, Instances: func() int { return a.instances }})
		if err != nil {
			return a, err
		}
		defer l.Close()
		if err := l.Load(ctx); err != nil {
			return a, err
		}
		deciders[i] = func(ctx context.Context, t *accuracyTenant) (bool, string, error) {
			d, err := l.Decide(ctx, limiter.Request{Tenant: t.id, Route: benchRoute, Limit: t.lim, Cost: 1})
			return d.Allowed, d.Source.String(), err
		}
	}
	// Rules of 5, 10, 20 and 40 tokens/s with a burst of two seconds' refill.
	tenants := make([]*accuracyTenant, a.tenants)
	bins := int((a.dur+5*time.Second)/time.Millisecond) + 1
	for i := range tenants {
		refill := float64(int(5) << (i % 4))
		tenants[i] = &accuracyTenant{
			id:       fmt.Sprintf("acc-%d-%03d", run, i),
			lim:      regions.Limit{Capacity: int64(2 * refill), RefillPerSecond: refill},
			arrivals: make([]int64, bins),
		}
	}
	origin := time.Now()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failure  error
		inflight = make(chan struct{}, 64*a.instances) // bounds goroutines if Redis stalls
	)
	decide := func(d decider, t *accuracyTenant) {
		defer wg.Done()
		defer func() { <-inflight }()
		now := time.Now()
		ns := now.UnixNano()
		t.first.CompareAndSwap(0, ns)
		for {
			last := t.last.Load()
			if ns <= last || t.last.CompareAndSwap(last, ns) {
				break
			}
		}
		t.mu.Lock()
		t.arrivals[min(int(now.Sub(origin)/time.Millisecond), bins-1)]++
		t.mu.Unlock()
		allowed, source, err := d(ctx, t)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failure = err
			return
		}
		a.decisions++
		a.bySource[source]++
		if allowed {
			t.admitted.Add(1)
			a.admittedBySource[source]++
		}
	}
	// Each instance paces every tenant at offered x refill / instances, in 1 ms steps
	// (open loop: a decision is started when due, whatever the others are doing).
	var pacers sync.WaitGroup
	for idx, d := range deciders {
		phase := float64(idx) / float64(a.instances) // instances start their tenants staggered
		pacers.Go(func() {
			sent := make([]int64, len(tenants))
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				el := time.Since(origin)
				if el >= a.dur || ctx.Err() != nil {
					return
				}
				for j, t := range tenants {
					due := int64(el.Seconds()*a.offered*t.lim.RefillPerSecond/float64(a.instances) + phase)
					for ; sent[j] < due; sent[j]++ {
						inflight <- struct{}{}
						wg.Add(1)
						go decide(d, t)
					}
				}
				<-tick.C
			}
		})
	}
	pacers.Wait()
	wg.Wait()
	if failure != nil {
		return a, fmt.Errorf("accuracy %s: %w", name, failure)
	}
	var sumErr, sumExact float64
	a.maxOver = math.Inf(-1)
	for _, t := range tenants {
		elapsed := time.Duration(t.last.Load() - t.first.Load())
		ceiling := float64(t.lim.Capacity) + t.lim.RefillPerSecond*elapsed.Seconds()
		got := float64(t.admitted.Load())
		e := 100 * (got - ceiling) / ceiling
		a.maxErr = max(a.maxErr, math.Abs(e))
		a.maxOver = max(a.maxOver, e)
		sumErr += math.Abs(e)
		firstBin := int(time.Unix(0, t.first.Load()).Sub(origin) / time.Millisecond)
		exact := float64(testenv.ExactAdmitted(t.lim.Capacity, t.lim.RefillPerSecond, t.arrivals[firstBin:]))
		ee := 100 * (got - exact) / exact
		a.maxErrExact = max(a.maxErrExact, math.Abs(ee))
		sumExact += math.Abs(ee)
	}
	a.meanErr = sumErr / float64(len(tenants))
	a.meanErrExact = sumExact / float64(len(tenants))
	return a, nil
}
