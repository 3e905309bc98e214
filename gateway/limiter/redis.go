package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// Redis decides with the region's shared token bucket in Redis (one EVALSHA per
// decision, concurrent ones pipelined together), behind a per-call timeout and a circuit
// breaker. When a call fails or the breaker is open, the fallback decides instead
// (SourceFallback) with a local bucket holding floor(Limit/N), N being the live
// instances of the region, so the region as a whole still admits at most its limit, and
// what it admits is charged to Redis afterwards. Sharded rules (Request.Shards) spread
// over sub-buckets; hot keys may be leased (Options.Leases).
//
// It is safe for concurrent use. It has no goroutine of its own: the pipelining starts
// short-lived ones that send queued calls and exit when the queue is empty, and a failed
// call or a NOSCRIPT reply starts one that reloads the scripts under a deadline (rewarm),
// which Close stops.
type Redis struct {
	rdb     redis.Scripter
	tb      *lua.TokenBucket
	batch   *batcher    // nil with Pipeline.Off
	leases  *leaseTable // nil with leases off
	fb      *fallback
	keys    lua.Keys
	timeout time.Duration
	cb      *gobreaker.TwoStepCircuitBreaker[struct{}]
	m       *redisMetrics
	log     *slog.Logger
	rewarm  rewarmer
	// failingSince is when the first failure since the last success happened, in ns
	// since origin plus 1, 0 when the last call succeeded (Breaker.FailureSpan).
	// Durations from origin use the monotonic clock when Now is time.Now, so a wall
	// clock step cannot stop the breaker from opening.
	failingSince atomic.Int64
	// evictingPolicy is what CheckEviction last read, so it warns on a change only.
	evictingPolicy atomic.Bool
	now            func() time.Time
	origin         time.Time
}

// rewarmer is the one goroutine that reloads the scripts out of band (see
// Redis.rewarmScripts), and what Close stops.
type rewarmer struct {
	loading   atomic.Bool // a rewarm is running
	forAtMost time.Duration
	sync.Mutex
	closed bool
	ctx    context.Context // ended by Close
	stop   context.CancelFunc
	wg     sync.WaitGroup
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
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("new redis limiter: %w", err)
	}
	m := newRedisMetrics()
	l := &Redis{
		rdb:     rdb,
		tb:      lua.NewTokenBucket(rdb),
		fb:      newFallback(opts, m),
		keys:    lua.Keys{Prefix: opts.KeyPrefix},
		timeout: opts.Timeout,
		m:       m,
		log:     opts.Logger.With("region", opts.Region),
		now:     opts.Now,
		origin:  opts.Now(),
	}
	l.rewarm.forAtMost = max(scriptLoadTimeout, 10*opts.Timeout, opts.Breaker.OpenFor)
	l.rewarm.ctx, l.rewarm.stop = context.WithCancel(context.Background())
	failures, span := opts.Breaker.Failures, opts.Breaker.FailureSpan.Nanoseconds()
	l.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "redis",
		MaxRequests: opts.Breaker.Probes,
		Timeout:     opts.Breaker.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			since := l.failingSince.Load()
			return c.ConsecutiveFailures >= failures && since != 0 && l.sinceOrigin()-since >= span
		},
		IsExcluded: func(err error) bool { return errors.Is(err, errCallerGone) },
		// Called under the breaker's lock, only on a change: cheap, and the only log.
		OnStateChange: func(_ string, from, to gobreaker.State) { l.stateChanged(from, to) },
	})
	if p, ok := rdb.(pipeliner); ok && !opts.Pipeline.Off {
		l.batch = newBatcher(l, p, opts.Timeout, opts.Pipeline.Batch, opts.Pipeline.InFlight, m)
	}
	if opts.Leases.Threshold > 0 {
		l.leases = newLeaseTable(opts.Leases, opts.Now)
	}
	cs := append(l.m.collectors(l.leases), l.fb.local.m.collectors(l.fb.local.Len)...)
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
// in Redis (of r.Value when set): from one random shard of it, then one other if that
// one rejects, when r.Shards >= 2; or from this instance's lease on the key when it is
// hot (Source lease). If Redis does not answer within the timeout, fails, or the
// breaker is open, the fallback decides (Source fallback) and the error is nil: a Redis
// outage is not the caller's error. The error is non-nil only for an invalid request
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
		return l.take(ctx, r, cost, l.keys.Value(r.Tenant, r.Route, r.Value), r.Limit)
	}
	if l.leases != nil {
		if d, ok := l.decideLease(ctx, r, cost, shards); ok {
			return d, nil
		}
	}
	if shards <= 1 {
		return l.take(ctx, r, cost, l.keys.Bucket(r.Tenant, r.Route), r.Limit)
	}
	i, j := twoShards(shards)
	d, err := l.take(ctx, r, cost, l.keys.Shard(r.Tenant, r.Route, i), r.Limit.Shard(shards, i))
	if err != nil || d.Allowed || d.Source != SourceRedis {
		return d, err
	}
	l.m.shardRetries.Inc()
	d2, err := l.take(ctx, r, cost, l.keys.Shard(r.Tenant, r.Route, j), r.Limit.Shard(shards, j))
	if err == nil && !d2.Allowed && d2.Source == SourceRedis {
		d2.RetryAfter = min(d.RetryAfter, d2.RetryAfter) // whichever shard refills first
	}
	return d2, err
}

// take decides r with cost tokens from the bucket key holding lim, or with the fallback
// when Redis does not answer. A shard's answer is scaled back to the whole rule: Limit
// is the rule's capacity and Remaining the shard's times the shards.
func (l *Redis) take(ctx context.Context, r Request, cost int64, key lua.Ref, lim regions.Limit) (Decision, error) {
	a, ok, err := l.callCharging(ctx, r, lua.ScriptTake, key, lim, cost)
	if err != nil {
		return Decision{}, fmt.Errorf("decide %s/%s: %w", r.Tenant, r.Route, err)
	}
	if !ok {
		return l.fb.decide(r, cost), nil
	}
	remaining := a.res.Remaining
	if lim.Capacity != r.Limit.Capacity && lim.Capacity > 0 {
		remaining = min(r.Limit.Capacity, remaining*(r.Limit.Capacity/lim.Capacity))
	}
	l.fb.observe(r, remaining)
	return Decision{
		Allowed:         a.res.Allowed,
		Limit:           r.Limit.Capacity,
		RefillPerSecond: r.Limit.RefillPerSecond,
		Remaining:       remaining,
		RetryAfter:      a.res.RetryAfter,
		ResetAfter:      a.res.ResetAfter,
		Source:          SourceRedis,
	}, nil
}

// callCharging is the one charge/settle path of a call that may carry r's fallback
// debt (Take and Lease, on a bucket, a shard or a lease): it takes the debt from the
// fallback, sends it with the call, and settles it: cleared when a reply was read, kept
// whole when none was (the call did not count).
func (l *Redis) callCharging(ctx context.Context, r Request, op lua.Script, key lua.Ref, lim regions.Limit, n int64) (answer, bool, error) {
	debt := l.fb.owed(r, lim)
	a, ok, err := l.call(ctx, op, key, lim, n, debt)
	l.fb.settle(r, debt, ok, a.res.Charged)
	return a, ok, err
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
		l.rewarmScripts("a redis call failed", slog.LevelDebug)
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

// lostScripts loads the bucket scripts into Redis again after a call found them
// missing (NOSCRIPT: Redis restarted, or SCRIPT FLUSH), out of band (rewarmScripts). The
// call that found them missing retries with EVAL within its own timeout, but on a slow
// Redis that retry may never fit; without the load, every later call would fail the
// same way.
func (l *Redis) lostScripts() {
	if l.rewarmScripts("redis had lost the bucket scripts", slog.LevelInfo) {
		l.m.noscript.Inc()
	}
}

// rewarmScripts loads the bucket scripts into Redis, which also opens a connection, on
// a goroutine of its own, one at a time, trying every rewarmEvery until it succeeds or
// rewarm.forAtMost has passed (the breaker's open interval, at least scriptLoadTimeout
// and 10 x the call timeout). It runs after a call found the scripts missing, and after
// a call that failed for another reason than its timeout (a refused or dropped
// connection): then, once Redis is back, the breaker's next probe finds a connection
// open and the scripts loaded, instead of paying for a dial and an EVAL within the call
// timeout and failing again on a busy machine, which would keep the breaker open
// another interval. It logs its success at level, and a failure at debug (the breaker
// logs the outage). It reports whether it started.
func (l *Redis) rewarmScripts(why string, level slog.Level) bool {
	w := &l.rewarm
	if w.loading.Load() {
		return false // one at a time; the check saves the lock on every failed call
	}
	w.Lock()
	defer w.Unlock()
	if w.closed || !w.loading.CompareAndSwap(false, true) {
		return false
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer w.loading.Store(false)
		ctx, cancel := context.WithTimeout(w.ctx, w.forAtMost)
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
	w := &l.rewarm
	w.Lock()
	if !w.closed {
		w.closed = true
		w.stop()
	}
	w.Unlock()
	w.wg.Wait()
}

// scriptLoadTimeout is the least time rewarm goes on trying; rewarmEvery is its pace.
const (
	scriptLoadTimeout = time.Second
	rewarmEvery       = 50 * time.Millisecond
)

// Load loads the bucket scripts into Redis, which also opens a connection, under the
// caller's deadline rather than Options.Timeout. Call it at startup (and it serves as a
// readiness probe): otherwise the first decisions pay for a dial and an EVAL, which may
// exceed a 5 ms timeout and be answered by the fallback. It then runs CheckEviction.
func (l *Redis) Load(ctx context.Context) error {
	if err := l.tb.Load(ctx); err != nil {
		return err
	}
	l.CheckEviction(ctx)
	return nil
}

// configGetter is the one go-redis method CheckEviction needs.
type configGetter interface {
	ConfigGet(ctx context.Context, parameter string) *redis.MapStringStringCmd
}

// CheckEviction reads Redis's maxmemory-policy. An evicting policy (allkeys-*,
// volatile-*) may evict buckets and rule records under memory pressure, and an evicted
// bucket reads as full (or, for a shard, as empty), so the limit no longer holds. That
// is a loud warning and ratelimit_redis_evicting_policy 1, not a refusal: the operator
// may have sized memory so that it never evicts, and a gateway that stopped deciding
// would turn a configuration smell into an outage. The warning is logged when the
// policy becomes evicting, not at every check; the gauge follows every check. A policy
// set with CONFIG SET after start is seen at the next call, so the gateway calls it
// every reload_interval. A Redis that refuses CONFIG (managed services often do) is
// logged at debug and leaves the gauge as it was.
func (l *Redis) CheckEviction(ctx context.Context) {
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
	now := evicting(policy)
	was := l.evictingPolicy.Swap(now)
	switch {
	case now && !was:
		l.m.evictingPolicy.Set(1)
		l.log.Warn("REDIS MAY EVICT RATE LIMIT BUCKETS: maxmemory-policy evicts keys, and an evicted bucket reads as full, so limits may not hold under memory pressure; set maxmemory-policy noeviction (or size maxmemory so it never evicts)",
			"maxmemory_policy", policy)
	case !now && was:
		l.m.evictingPolicy.Set(0)
		l.log.Info("redis maxmemory-policy no longer evicts keys", "maxmemory_policy", policy)
	case !now:
		l.m.evictingPolicy.Set(0)
	}
}

// evicting reports whether a maxmemory-policy evicts keys.
func evicting(policy string) bool {
	return strings.HasPrefix(policy, "allkeys-") || strings.HasPrefix(policy, "volatile-")
}

// FallbackActive reports whether the breaker is not closed, that is whether decisions
// are (or may be) coming from the fallback. For readiness and status pages.
func (l *Redis) FallbackActive() bool { return l.cb.State() != gobreaker.StateClosed }

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
