package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// Defaults of Options.
const (
	DefaultTimeout           = 5 * time.Millisecond
	DefaultBreakerFailures   = 5
	DefaultBreakerOpenFor    = time.Second
	DefaultBreakerProbes     = 1
	DefaultExpectedInstances = 1
)

// Options configures a Redis limiter. Zero fields take the defaults above.
type Options struct {
	// Region is the constant "region" label of the metrics; required with a Registerer.
	Region string
	// KeyPrefix starts every bucket key (lua.Keys); empty means "rl".
	KeyPrefix string
	// Timeout bounds each Redis call (default 5 ms). A call that exceeds it counts as a
	// failure and the decision comes from the fallback, so a slow Redis costs at most
	// this much latency.
	Timeout time.Duration
	// BreakerFailures consecutive failures (errors or timeouts) open the breaker
	// (default 5), once they have gone on for BreakerFailureSpan. While it is open no
	// call goes to Redis.
	BreakerFailures uint32
	// BreakerFailureSpan is how long calls must have been failing, with no success in
	// between, before the breaker opens (default BreakerFailures x Timeout). Calls that
	// time out together, in one pipeline or one stall of a busy machine, then count as
	// one failure rather than as many; a Redis that is down opens it within the span.
	BreakerFailureSpan time.Duration
	// BreakerOpenFor is how long the breaker stays open before it half-opens and lets
	// probes through (default 1 s).
	BreakerOpenFor time.Duration
	// BreakerProbes is how many calls a half-open breaker lets through; that many
	// successes close it, one failure opens it again (default 1).
	BreakerProbes uint32
	// Instances returns the number of live gateway instances of this region (from
	// heartbeats); the fallback holds 1/N of each rule. nil, or a result <= 0, means
	// ExpectedInstances.
	Instances func() int
	// ExpectedInstances is N while Instances does not know (default 1).
	ExpectedInstances int
	// Now is the clock of the fallback buckets, of leases (rates, expiry) and of the
	// breaker's failure span; nil means time.Now. The shared bucket itself runs on
	// Redis TIME.
	Now func() time.Time
	// MaxFallbackBuckets caps the fallback's buckets (LocalOptions.MaxBuckets).
	MaxFallbackBuckets int
	// Registerer receives the metrics; nil means they are not registered.
	Registerer prometheus.Registerer
	// Logger receives breaker state changes (never per-request lines); nil discards.
	Logger *slog.Logger

	// NoPipelining sends every call as its own EVALSHA. By default concurrent calls to
	// the same Redis share pipelines (see PipelineBatch); with one caller at a time the
	// two are the same.
	NoPipelining bool
	// PipelineBatch is the most calls sent in one pipeline (default 64).
	PipelineBatch int
	// PipelineInFlight is the most calls or pipelines out at once (default 4): a call
	// that finds them all out waits in a queue, and the next one to come back sends
	// everything queued.
	PipelineInFlight int

	// LeaseThreshold turns token leases on: a key this instance is asked for at this
	// many tokens per second or more takes batches of tokens from Redis and spends them
	// locally (Source "lease"). 0 means leases off. A few hundred is a sensible value:
	// below it a key costs few Redis calls anyway.
	LeaseThreshold float64
	// LeaseFraction bounds the region's worst-case over-admission on a leased key,
	// instances x batch, as a fraction of one second's regional refill (default 0.02).
	LeaseFraction float64
	// LeaseTTL is how long leased tokens may be spent (default 250 ms); later they go
	// back to Redis.
	LeaseTTL time.Duration
	// MaxLeaseKeys bounds the keys tracked for leases (default 4096).
	MaxLeaseKeys int
	// MaxLeaseSeries bounds the keys exported with their over-admission bound
	// (ratelimit_lease_overadmission_bound_tokens), largest first (default 16).
	MaxLeaseSeries int
}

// Redis decides with the region's shared token bucket in Redis (one EVALSHA per
// decision, concurrent ones pipelined together), behind a per-call timeout and a circuit
// breaker. When a call fails or the breaker is open, a local bucket holding Limit/N
// decides instead (Source "fallback"), N being the live instances of the region, so the
// region as a whole still admits about its limit. Sharded rules (Request.Shards) spread
// over sub-buckets; hot keys may be leased (Options.LeaseThreshold).
//
// It is safe for concurrent use. It has no goroutine of its own: the pipelining starts
// short-lived ones that send queued calls and exit when the queue is empty, and a failed
// call or a NOSCRIPT reply starts one that reloads the scripts under a deadline (rewarm),
// which Close stops.
type Redis struct {
	rdb       redis.Scripter
	tb        *lua.TokenBucket
	batch     *batcher    // nil with NoPipelining
	leases    *leaseTable // nil with leases off
	keys      lua.Keys
	timeout   time.Duration
	cb        *gobreaker.TwoStepCircuitBreaker[struct{}]
	fallback  *Local
	instances func() int
	expected  int
	openFor   time.Duration // the breaker's open interval: the RetryAfter of a cost the fallback cannot hold
	m         *redisMetrics
	log       *slog.Logger
	loading   atomic.Bool // a rewarm is running
	rewarmFor time.Duration
	// life guards closed and the rewarm goroutines' WaitGroup (see Close).
	life struct {
		sync.Mutex
		closed bool
		ctx    context.Context // ended by Close
		stop   context.CancelFunc
		wg     sync.WaitGroup
	}
	// failingSince is when the first failure since the last success happened, in ns
	// since origin plus 1, 0 when the last call succeeded (Options.BreakerFailureSpan).
	// Durations from origin use the monotonic clock when Now is time.Now, so a wall
	// clock step cannot stop the breaker from opening.
	failingSince atomic.Int64
	now          func() time.Time
	origin       time.Time
}

// errCallerGone marks a call abandoned because the caller's context ended: it says
// nothing about Redis, so the breaker ignores it.
var errCallerGone = errors.New("caller context ended")

// NewRedis returns a limiter that runs the bucket script on rdb (a *redis.Client, a
// *redis.ClusterClient, or any redis.Scripter). It dials nothing and starts no
// goroutines.
//
// A go-redis client ignores context deadlines on the socket unless its options set
// ContextTimeoutEnabled: true, and then a stalled Redis would hold each request for the
// client's ReadTimeout (seconds) instead of Options.Timeout. NewRedis therefore refuses a
// *redis.Client, *redis.ClusterClient or *redis.Ring without it.
func NewRedis(rdb redis.Scripter, opts Options) (*Redis, error) {
	if rdb == nil {
		return nil, errors.New("new redis limiter: no redis client")
	}
	if err := checkContextTimeouts(rdb); err != nil {
		return nil, fmt.Errorf("new redis limiter: %w", err)
	}
	if opts.Timeout < 0 || opts.BreakerOpenFor < 0 || opts.BreakerFailureSpan < 0 || opts.ExpectedInstances < 0 {
		return nil, fmt.Errorf("new redis limiter: negative Timeout %v, BreakerOpenFor %v, BreakerFailureSpan %v or ExpectedInstances %d",
			opts.Timeout, opts.BreakerOpenFor, opts.BreakerFailureSpan, opts.ExpectedInstances)
	}
	if opts.PipelineBatch < 0 || opts.PipelineInFlight < 0 || opts.LeaseTTL < 0 || opts.MaxLeaseKeys < 0 || opts.MaxLeaseSeries < 0 {
		return nil, fmt.Errorf("new redis limiter: negative PipelineBatch %d, PipelineInFlight %d, LeaseTTL %v, MaxLeaseKeys %d or MaxLeaseSeries %d",
			opts.PipelineBatch, opts.PipelineInFlight, opts.LeaseTTL, opts.MaxLeaseKeys, opts.MaxLeaseSeries)
	}
	if !(opts.LeaseThreshold >= 0) || math.IsInf(opts.LeaseThreshold, 0) || !(opts.LeaseFraction >= 0 && opts.LeaseFraction <= 1) {
		return nil, fmt.Errorf("new redis limiter: LeaseThreshold %v must be a finite number >= 0 and LeaseFraction %v within [0, 1]",
			opts.LeaseThreshold, opts.LeaseFraction)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.BreakerFailures == 0 {
		opts.BreakerFailures = DefaultBreakerFailures
	}
	if opts.BreakerFailureSpan == 0 {
		opts.BreakerFailureSpan = time.Duration(opts.BreakerFailures) * opts.Timeout
	}
	if opts.BreakerOpenFor == 0 {
		opts.BreakerOpenFor = DefaultBreakerOpenFor
	}
	if opts.BreakerProbes == 0 {
		opts.BreakerProbes = DefaultBreakerProbes
	}
	if opts.ExpectedInstances == 0 {
		opts.ExpectedInstances = DefaultExpectedInstances
	}
	if opts.Instances == nil {
		opts.Instances = func() int { return 0 }
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PipelineBatch == 0 {
		opts.PipelineBatch = DefaultPipelineBatch
	}
	if opts.PipelineInFlight == 0 {
		opts.PipelineInFlight = DefaultPipelineInFlight
	}
	if opts.LeaseFraction == 0 {
		opts.LeaseFraction = DefaultLeaseFraction
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.MaxLeaseKeys == 0 {
		opts.MaxLeaseKeys = DefaultMaxLeaseKeys
	}
	if opts.MaxLeaseSeries == 0 {
		opts.MaxLeaseSeries = DefaultMaxLeaseSeries
	}
	l := &Redis{
		rdb:       rdb,
		tb:        lua.NewTokenBucket(rdb),
		keys:      lua.Keys{Prefix: opts.KeyPrefix},
		timeout:   opts.Timeout,
		fallback:  newLocal(LocalOptions{Now: opts.Now, MaxBuckets: opts.MaxFallbackBuckets}),
		instances: opts.Instances,
		expected:  opts.ExpectedInstances,
		openFor:   opts.BreakerOpenFor,
		m:         newRedisMetrics(),
		log:       opts.Logger.With("region", opts.Region),
		now:       opts.Now,
		origin:    opts.Now(),
		rewarmFor: max(scriptLoadTimeout, 10*opts.Timeout, opts.BreakerOpenFor),
	}
	l.life.ctx, l.life.stop = context.WithCancel(context.Background())
	failures, span := opts.BreakerFailures, opts.BreakerFailureSpan.Nanoseconds()
	l.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "redis",
		MaxRequests: opts.BreakerProbes,
		Timeout:     opts.BreakerOpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			since := l.failingSince.Load()
			return c.ConsecutiveFailures >= failures && since != 0 && l.sinceOrigin()-since >= span
		},
		IsExcluded: func(err error) bool { return errors.Is(err, errCallerGone) },
		// Called under the breaker's lock, only on a change: cheap, and the only log.
		OnStateChange: func(_ string, from, to gobreaker.State) { l.stateChanged(from, to) },
	})
	if p, ok := rdb.(pipeliner); ok && !opts.NoPipelining {
		l.batch = newBatcher(l, p, opts.PipelineBatch, opts.PipelineInFlight)
	}
	if opts.LeaseThreshold > 0 {
		l.leases = newLeaseTable(opts.LeaseThreshold, opts.LeaseFraction, opts.LeaseTTL, opts.MaxLeaseKeys, opts.MaxLeaseSeries, opts.Now)
	}
	cs := append(l.m.collectors(l.leases), l.fallback.m.collectors(l.fallback.Len)...)
	if err := register(opts.Registerer, opts.Region, cs...); err != nil {
		return nil, fmt.Errorf("new redis limiter: %w", err)
	}
	return l, nil
}

// checkContextTimeouts refuses the go-redis clients known to ignore context deadlines.
func checkContextTimeouts(rdb redis.Scripter) error {
	enabled := true
	switch c := rdb.(type) {
	case *redis.Client:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		enabled = c.Options().ContextTimeoutEnabled
	}
	if !enabled {
		return errors.New("the redis client must set ContextTimeoutEnabled: true, or a stalled Redis stalls every request for the client's ReadTimeout instead of the limiter's Timeout")
	}
	return nil
}

// Decide takes r.Cost tokens (0 means 1) from the shared bucket of (r.Tenant, r.Route)
// in Redis: from one random shard of it, then one other if that one rejects, when
// r.Shards >= 2; or from this instance's lease on the key when it is hot (Source
// "lease"). If Redis does not answer within the timeout, fails, or the breaker is open,
// the fallback decides (Source "fallback") and the error is nil: a Redis outage is not
// the caller's error. The error is non-nil only for an invalid request
// (ErrInvalidRequest) or when ctx ended before a decision.
func (l *Redis) Decide(ctx context.Context, r Request) (Decision, error) {
	cost, err := r.cost()
	if err != nil {
		return Decision{}, err
	}
	shards, err := r.shards(cost)
	if err != nil {
		return Decision{}, err
	}
	if r.Value != "" {
		// A client value's bucket is small and its own: neither sharded nor leased.
		return l.take(ctx, r, cost, l.bucket(r), r.Limit)
	}
	if l.leases != nil {
		if d, ok := l.decideLease(ctx, r, cost, shards); ok {
			return d, nil
		}
	}
	if shards <= 1 {
		return l.take(ctx, r, cost, l.bucket(r), r.Limit)
	}
	i, j := twoShards(shards)
	d, err := l.take(ctx, r, cost, l.keys.Shard(r.Tenant, r.Route, i), ShardLimit(r.Limit, shards, i))
	if err != nil || d.Allowed || d.Source != SourceRedis {
		return d, err
	}
	l.m.shardRetries.Inc()
	d2, err := l.take(ctx, r, cost, l.keys.Shard(r.Tenant, r.Route, j), ShardLimit(r.Limit, shards, j))
	if err == nil && !d2.Allowed && d2.Source == SourceRedis {
		d2.RetryAfter = min(d.RetryAfter, d2.RetryAfter) // whichever shard refills first
	}
	return d2, err
}

// take decides r with cost tokens from the bucket at key holding lim, or with the
// fallback when Redis does not answer. A shard's answer is scaled back to the whole
// rule: Limit is the rule's capacity and Remaining the shard's times the shards.
func (l *Redis) take(ctx context.Context, r Request, cost int64, key lua.Ref, lim regions.Limit) (Decision, error) {
	debt := l.owed(r, lim)
	a, ok, err := l.call(ctx, lua.ScriptTake, key, lim, cost, debt)
	if !ok {
		// No reply was read, so the call did not count, whatever Redis may do with it
		// later: the debt stays owed and what the fallback admits is owed too. A call
		// that did run (a paused Redis runs it on resume) is then charged twice, which
		// errs toward under-admission, never toward a second bucket.
		l.stillOwed(r, debt)
	}
	if err != nil {
		return Decision{}, fmt.Errorf("decide %s/%s: %w", r.Tenant, r.Route, err)
	}
	if !ok {
		return l.decideFallback(r, cost, true), nil
	}
	l.repaid(debt, a.res.Charged)
	remaining := a.res.Remaining
	if lim.Capacity != r.Limit.Capacity && lim.Capacity > 0 {
		remaining = min(r.Limit.Capacity, remaining*(r.Limit.Capacity/lim.Capacity))
	}
	l.observe(r, remaining)
	return Decision{
		Allowed:    a.res.Allowed,
		Limit:      r.Limit.Capacity,
		Remaining:  remaining,
		RetryAfter: a.res.RetryAfter,
		ResetAfter: a.res.ResetAfter,
		Source:     SourceRedis,
	}, nil
}

// bucket is the unsharded bucket of r: its client value's own bucket when r.Value is
// set.
func (l *Redis) bucket(r Request) lua.Ref {
	if r.Value != "" {
		return l.keys.Value(r.Tenant, r.Route, r.Value)
	}
	return l.keys.Bucket(r.Tenant, r.Route)
}

// repaid counts what the script charged of a debt sent, and what it wrote off (the
// -capacity floor of the bucket clipped it: the bucket was already a whole bucket in
// debt, so the rest would only have delayed its recovery further).
func (l *Redis) repaid(debt, charged int64) {
	if debt == 0 {
		return // a counter's Add is an atomic write: not for every decision
	}
	l.m.repaid.Add(float64(charged))
	if debt > charged {
		l.m.writtenOff.Add(float64(debt - charged))
	}
}

// call runs one script call on Redis behind the breaker and the timeout, pipelined
// with concurrent calls unless pipelining is off. ok reports that Redis answered; when
// it did not, the failure is counted (and fed to the breaker) and the caller uses the
// fallback; the answer then says only whether the call may have run all the same
// (maybeRan). err is non-nil only when the arguments were invalid (ErrInvalidRequest) or
// ctx ended: then Redis is not to blame.
func (l *Redis) call(ctx context.Context, op lua.Script, key lua.Ref, lim regions.Limit, n, debt int64) (answer, bool, error) {
	done, err := l.cb.Allow()
	if err != nil { // open, or half-open with its probes already out
		l.m.breakerOpen.Inc()
		return answer{}, false, nil
	}
	var a answer
	if l.batch != nil && op != lua.ScriptReturn {
		a, err = l.batch.do(ctx, op, key, lim, n, debt)
	} else {
		a, err = l.direct(ctx, op, key, lim, n, debt)
	}
	switch {
	case err == nil:
		l.succeeded()
		done(nil)
		return a, true, nil
	case errors.Is(err, lua.ErrInvalidArgument):
		l.succeeded()
		done(nil) // Redis answered, so it is healthy; the request is what is wrong
		l.m.invalid.Inc()
		return answer{}, false, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	case ctx.Err() != nil:
		done(errCallerGone)
		return answer{}, false, ctx.Err()
	case a.timedOut:
		l.failingSince.CompareAndSwap(0, l.sinceOrigin())
		done(err)
		l.m.timeout.Inc()
	default:
		l.failingSince.CompareAndSwap(0, l.sinceOrigin())
		done(err)
		l.m.failed.Inc()
		l.rewarm("a redis call failed", slog.LevelDebug)
	}
	l.log.Debug("redis call failed; using fallback", "key", key.Key, "err", err)
	return answer{}, false, nil
}

// sinceOrigin is the time since the limiter was made, in ns plus 1 (never 0).
func (l *Redis) sinceOrigin() int64 { return int64(l.now().Sub(l.origin)) + 1 }

// succeeded ends a run of failures. It writes only when there was one, so concurrent
// successes do not contend on the cache line.
func (l *Redis) succeeded() {
	if l.failingSince.Load() != 0 {
		l.failingSince.Store(0)
	}
}

// reloadScripts loads the bucket scripts into Redis again after a call found them
// missing (NOSCRIPT: Redis restarted, or SCRIPT FLUSH), out of band (rewarm). The call
// that found them missing retries with EVAL within its own timeout, but on a slow Redis
// that retry may never fit; without the load, every later call would fail the same way.
func (l *Redis) reloadScripts() {
	if l.rewarm("redis had lost the bucket scripts", slog.LevelInfo) {
		l.m.noscript.Inc()
	}
}

// rewarm loads the bucket scripts into Redis, which also opens a connection, on a
// goroutine of its own, one at a time, trying every rewarmEvery until it succeeds or
// rewarmFor has passed (the breaker's open interval, at least scriptLoadTimeout and 10
// x the call timeout). It runs after a call found the scripts missing, and after a call
// that failed for another reason than its timeout (a refused or dropped connection):
// then, once Redis is back, the breaker's next probe finds a connection open and the
// scripts loaded, instead of paying for a dial and an EVAL within the call timeout and
// failing again on a busy machine, which would keep the breaker open another interval.
// It logs its success at level, and a failure at debug (the breaker logs the outage).
// It reports whether it started.
func (l *Redis) rewarm(why string, level slog.Level) bool {
	if l.loading.Load() {
		return false // one at a time; the check saves the lock on every failed call
	}
	l.life.Lock()
	defer l.life.Unlock()
	if l.life.closed || !l.loading.CompareAndSwap(false, true) {
		return false
	}
	l.life.wg.Add(1)
	go func() {
		defer l.life.wg.Done()
		defer l.loading.Store(false)
		ctx, cancel := context.WithTimeout(l.life.ctx, l.rewarmFor)
		defer cancel()
		tick := time.NewTicker(rewarmEvery)
		defer tick.Stop()
		for {
			err := l.tb.Load(ctx)
			if err == nil {
				l.log.Log(ctx, level, why+"; loaded the bucket scripts again")
				return
			}
			select {
			case <-ctx.Done():
				l.log.Debug(why+"; loading the bucket scripts failed", "err", err)
				return
			case <-tick.C:
			}
		}
	}()
	return true
}

// Close stops a rewarm in progress, if any, and waits for it; no rewarm starts after it.
// Decisions go on working (they need no goroutine of their own). It does not close the
// Redis client, which the caller owns.
func (l *Redis) Close() {
	l.life.Lock()
	if !l.life.closed {
		l.life.closed = true
		l.life.stop()
	}
	l.life.Unlock()
	l.life.wg.Wait()
}

// scriptLoadTimeout is the least time rewarm goes on trying; rewarmEvery is its pace.
const (
	scriptLoadTimeout = time.Second
	rewarmEvery       = 50 * time.Millisecond
)

// Load loads the bucket scripts into Redis, which also opens a connection, under the
// caller's deadline rather than Options.Timeout. Call it at startup (and it serves as a
// readiness probe): otherwise the first decisions pay for a dial and an EVAL, which may
// exceed a 5 ms timeout and be answered by the fallback.
//
// It also checks Redis's maxmemory-policy: an evicting policy (allkeys-*, volatile-*)
// may evict buckets and rule records under memory pressure, and an evicted bucket reads
// as full (or, for a shard, as empty), so the limit no longer holds. That is a loud
// warning and ratelimit_redis_evicting_policy 1, not a refusal: the operator may have
// sized memory so that it never evicts, and a gateway that refused to start would turn
// a configuration smell into an outage. A Redis that refuses CONFIG (managed services
// often do) is logged at debug and not an error.
func (l *Redis) Load(ctx context.Context) error {
	if err := l.tb.Load(ctx); err != nil {
		return err
	}
	l.checkEviction(ctx)
	return nil
}

// configGetter is the one go-redis method checkEviction needs.
type configGetter interface {
	ConfigGet(ctx context.Context, parameter string) *redis.MapStringStringCmd
}

func (l *Redis) checkEviction(ctx context.Context) {
	c, ok := l.rdb.(configGetter)
	if !ok {
		return
	}
	v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		l.log.Debug("cannot read redis maxmemory-policy; not checked", "err", err)
		return
	}
	policy := v["maxmemory-policy"]
	if evicting(policy) {
		l.m.evictingPolicy.Set(1)
		l.log.Warn("REDIS MAY EVICT RATE LIMIT BUCKETS: maxmemory-policy evicts keys, and an evicted bucket reads as full, so limits may not hold under memory pressure; set maxmemory-policy noeviction (or size maxmemory so it never evicts)",
			"maxmemory_policy", policy)
		return
	}
	l.m.evictingPolicy.Set(0)
}

// evicting reports whether a maxmemory-policy evicts keys.
func evicting(policy string) bool {
	return strings.HasPrefix(policy, "allkeys-") || strings.HasPrefix(policy, "volatile-")
}

// FallbackActive reports whether the breaker is not closed, that is whether decisions
// are (or may be) coming from the fallback. For readiness and status pages.
func (l *Redis) FallbackActive() bool { return l.cb.State() != gobreaker.StateClosed }

// instanceCount is N: the live instances of the region, else ExpectedInstances.
func (l *Redis) instanceCount() int {
	if n := l.instances(); n > 0 {
		return n
	}
	return l.expected
}

func (l *Redis) stateChanged(from, to gobreaker.State) {
	l.m.state.Set(float64(stateValue(to)))
	if to == gobreaker.StateClosed {
		l.m.active.Set(0)
		l.log.Info("redis circuit breaker closed; decisions from redis again", "from", from.String())
		return
	}
	l.m.active.Set(1)
	l.log.Warn("redis circuit breaker state changed; decisions from local fallback", "from", from.String(), "to", to.String())
}

// stateValue is the ratelimit_breaker_state value: 0 closed, 1 half-open, 2 open.
func stateValue(s gobreaker.State) int {
	switch s {
	case gobreaker.StateHalfOpen:
		return 1
	case gobreaker.StateOpen:
		return 2
	default:
		return 0
	}
}
