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

// Client is what the Redis limiter needs of a go-redis client: *redis.Client,
// *redis.ClusterClient, *redis.Ring, a failover client and redis.UniversalClient all are.
type Client interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// Redis decides with the region's shared token buckets in Redis (one script call per
// batch of concurrent decisions), behind a per-call timeout and a circuit breaker. While
// the breaker is open, the fallback decides instead (SourceFallback) with local buckets
// that start empty and earn this instance's 1/N of the refill, N being the live
// instances of the region, and what it admits is charged to Redis afterwards. Sharded
// rules (Request.Shards) spread over sub-buckets; hot keys may be leased
// (Options.Leases); a rule's bands are decided in the same call as its own bucket.
//
// It is safe for concurrent use. It has no goroutine of its own: the batcher starts
// short-lived ones that send queued decisions and exit when the queue is empty, and a
// failed call or a NOSCRIPT reply starts one that reloads the scripts under a deadline
// (rewarm), which Close stops.
type Redis struct {
	rdb     Client
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

// NewRedis returns a limiter that runs the bucket script on rdb. It dials nothing and
// starts no goroutines.
//
// A go-redis client ignores context deadlines on the socket unless its options set
// ContextTimeoutEnabled: true, and then a stalled Redis would hold each request for the
// client's ReadTimeout (seconds) instead of Options.Timeout. NewRedis therefore refuses a
// *redis.Client, *redis.ClusterClient or *redis.Ring without it.
func NewRedis(rdb Client, opts Options) (*Redis, error) {
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
	if !opts.Pipeline.Off {
		l.batch = newBatcher(l, rdb, opts.Timeout, opts.Pipeline.Batch, opts.Pipeline.InFlight, m)
	}
	if opts.Leases.Threshold > 0 {
		l.leases = newLeaseTable(opts.Leases, opts.Now)
	}
	if err := register(opts.Registerer, opts.Region, l.m.collectors(l.leases, l.fb)...); err != nil {
		return nil, fmt.Errorf("new redis limiter: %w", err)
	}
	return l, nil
}

// checkContextTimeouts refuses the go-redis clients known to ignore context deadlines.
func checkContextTimeouts(rdb Client) error {
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
// in Redis, and from r.Value's bucket nested in it when set and from each band's bucket
// of r.Bands (all or none, in one script call; then without shards or lease): from one
// random shard, then one other if that one rejects, when r.Shards >= 2; or from this
// instance's lease on the key when it is hot (Source lease). If Redis does not answer
// within the timeout, fails, or the breaker is open, the fallback decides (Source
// fallback) and the error is nil: a Redis outage is not the caller's error. The
// fallback refuses while the breaker is closed (one failed call admits nothing no one
// counts) and, once it is open, admits from buckets that start empty (fallback.go). The error
// is non-nil only for an invalid request (ErrInvalidRequest) or when ctx ended before a
// decision.
func (l *Redis) Decide(ctx context.Context, r Request) (Decision, error) {
	cost, err := r.cost()
	if err != nil {
		return Decision{}, err
	}
	shards, err := r.shards(cost)
	if err != nil {
		return Decision{}, err
	}
	if len(r.Bands) > 0 {
		return l.takeBands(ctx, r, cost) // one bucket each, no shard, no lease
	}
	if r.Value == "" && l.leases != nil {
		if d, ok := l.decideLease(ctx, r, cost, shards); ok {
			return d, nil
		}
	}
	if shards <= 1 || r.Value != "" {
		return l.take(ctx, r, cost, 0, 1)
	}
	i, j := twoShards(shards)
	d, err := l.take(ctx, r, cost, i, shards)
	if err != nil || d.Allowed || d.Source != SourceRedis {
		return d, err
	}
	l.m.shardRetries.Inc()
	d2, err := l.take(ctx, r, cost, j, shards)
	if err == nil && !d2.Allowed && d2.Source == SourceRedis {
		d2.RetryAfter = min(d.RetryAfter, d2.RetryAfter) // whichever shard refills first
	}
	return d2, err
}

// take decides r with cost tokens from shard i of k of its bucket (k = 1: the bucket
// itself) and its value's bucket, or with the fallback when Redis does not answer. A
// shard's answer is scaled back to the whole rule: Limit is the rule's capacity and
// Remaining the shard's times the shards.
func (l *Redis) take(ctx context.Context, r Request, cost int64, i, k int) (Decision, error) {
	lim := r.Limit.Shard(k, i)
	var bs [2]lua.Bucket
	var ids [2]bucketID
	bs[0] = r.bucket(l.keys.Shard(r.Tenant, r.Route, i), lim, i)
	ids[0] = bucketID{tenant: r.Tenant, route: r.Route}
	n := 1
	if r.Value != "" {
		v := r.ValueLimit
		bs[1] = r.bucket(l.keys.Value(r.Tenant, r.Route, r.Value), v, 0)
		ids[1] = bucketID{tenant: r.Tenant, route: r.Route, value: r.Value}
		n = 2
	}
	out, ok, err := l.callCharging(ctx, lua.OpTake, cost, bs[:n], ids[:n], r)
	if err != nil {
		return Decision{}, fmt.Errorf("decide %s/%s: %w", r.Tenant, r.Route, err)
	}
	if !ok {
		return l.fb.decide(r, cost), nil
	}
	d := Decision{Allowed: out.Granted > 0, RetryAfter: out.RetryAfter, Source: SourceRedis}
	for b := range n {
		lim := regions.Limit{Capacity: bs[b].Capacity, RefillPerSecond: bs[b].Refill}
		o := out.Buckets[b]
		if b == 0 && k > 1 {
			lim = r.Limit
			o.Remaining = min(r.Limit.Capacity, o.Remaining*int64(k))
		}
		db := Decision{Allowed: d.Allowed, Limit: lim.Capacity, RefillPerSecond: lim.RefillPerSecond, Remaining: o.Remaining, ResetAfter: o.ResetAfter, RetryAfter: d.RetryAfter, Source: SourceRedis}
		if b == 0 {
			d = db
		} else {
			d = tighter(d, db)
		}
	}
	d.RetryAfter = out.RetryAfter
	return d, nil
}

// callCharging is the one charge/settle path of a call (a take or a lease, on a bucket,
// a shard or a lease's bucket; a Settle): it charges first what settles of its buckets
// owe (chargeUnsettled), takes each bucket's debt from the fallback, sends it
// with the call, and settles it: cleared when a reply was read, owed again when none
// was (the call did not count). ids name the buckets for their debts; r is the request
// whose limits they were admitted under.
func (l *Redis) callCharging(ctx context.Context, op lua.Op, n int64, bs []lua.Bucket, ids []bucketID, r Request) (lua.Outcome, bool, error) {
	// What settles owed while Redis did not answer is charged first.
	l.chargeUnsettled(ctx, bs, ids)
	var two [2]taken // no allocation for a decision of one or two buckets
	debts := two[:]
	if len(bs) > len(two) {
		debts = make([]taken, len(bs))
	}
	for b := range bs {
		debts[b] = l.fb.owed(ids[b], 2*bs[b].Capacity)
		bs[b].Debt = debts[b].total()
	}
	out, ok, err := l.call(ctx, lua.Decision{Op: op, N: n, Buckets: bs})
	for b := range bs {
		if bs[b].Debt == 0 {
			continue
		}
		var charged int64
		if ok {
			charged = out.Buckets[b].Charged
		}
		l.fb.settle(ids[b], r.limitOf(ids[b]), debts[b], ok, charged)
	}
	return out, ok, err
}

// call runs one decision on Redis behind the breaker and the timeout, batched with
// concurrent ones unless pipelining is off. ok reports that Redis answered; when it did
// not, the failure is counted (and fed to the breaker) and the caller uses the
// fallback. err is non-nil only when the arguments were invalid (ErrInvalidRequest) or
// ctx ended: then Redis is not to blame.
func (l *Redis) call(ctx context.Context, d lua.Decision) (lua.Outcome, bool, error) {
	done, err := l.cb.Allow()
	if err != nil { // open, or half-open with its probes already out
		l.m.breakerOpen.Inc()
		return lua.Outcome{}, false, nil
	}
	var (
		out      lua.Outcome
		timedOut bool
	)
	if l.batch != nil && d.Op != lua.OpReturn {
		out, timedOut, err = l.batch.do(ctx, d)
	} else {
		out, timedOut, err = l.direct(ctx, d)
	}
	switch {
	case err == nil:
		l.succeeded()
		done(nil)
		return out, true, nil
	case errors.Is(err, lua.ErrInvalidArgument):
		l.succeeded()
		done(nil) // Redis answered, so it is healthy; the request is what is wrong
		l.m.invalid.Inc()
		return lua.Outcome{}, false, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	case ctx.Err() != nil:
		done(errCallerGone)
		return lua.Outcome{}, false, ctx.Err()
	case timedOut:
		l.failingSince.CompareAndSwap(0, l.sinceOrigin())
		done(err)
		l.m.timeout.Inc()
	default:
		l.failingSince.CompareAndSwap(0, l.sinceOrigin())
		done(err)
		l.m.failed.Inc()
		l.rewarmScripts("a redis call failed", slog.LevelDebug)
	}
	l.log.Debug("redis call failed; the fallback decides (refuses until the breaker opens)", "key", d.Buckets[0].Key, "err", err)
	return lua.Outcome{}, false, nil
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
			err := lua.Load(ctx, l.rdb)
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
// Redis client, which the caller owns. Call Flush first to charge what the fallback owes.
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
	if err := lua.Load(ctx, l.rdb); err != nil {
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
		l.fb.end()
		l.m.active.Set(0)
		l.log.Info("redis circuit breaker closed; decisions from redis again", "from", from.String())
		return
	}
	l.fb.begin()
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

// Flush charges what the fallback still owes to Redis, one charge per owing bucket,
// and what settles owe (Settle: Redis did not answer), one settle per owing bucket,
// batched into script calls (one per hash slot on a cluster), within ctx, whatever the
// breaker says: a stopping gateway's debts would otherwise be gone with it. What Redis
// does not answer for is lost: counted (ratelimit_fallback_debt_lost_tokens_total) and
// logged. The gateway calls it when it stops, after its last request. It returns the
// tokens charged and lost.
func (l *Redis) Flush(ctx context.Context) (charged, lost int64) {
	var settled int64
	owed := l.fb.drain()
	nDebts := len(owed)
	owed = append(owed, l.fb.unsettled.drain()...) // after the debts: settles
	if len(owed) == 0 {
		return 0, 0
	}
	g := groupingOf(l.rdb)
	type part struct {
		batch  lua.Batch
		debts  []owedBucket
		settle []bool
	}
	var parts []*part
	bySlot := map[uint16]*part{}
	for i, o := range owed {
		key := l.keyOf(o.id)
		settle := i >= nDebts
		d := min(o.tokens, MaxSettle) // the most one settle takes (several settles add up)
		if !settle {
			d = min(o.tokens, 2*o.lim.Capacity) // more cannot be charged: the script floors at -capacity
		}
		if o.tokens > d {
			l.m.writtenOff.Add(float64(o.tokens - d))
		}
		o.tokens = d
		sl := uint16(0)
		if g != groupAll {
			sl = slot(key)
		}
		p := bySlot[sl]
		if p == nil || p.batch.Len() >= maxFlushBatch || g == groupNothing {
			p = &part{}
			parts = append(parts, p)
			bySlot[sl] = p
		}
		b := lua.Bucket{Key: key, Capacity: o.lim.Capacity, Refill: o.lim.RefillPerSecond, Debt: d, Cap: lua.NoCap}
		if o.id.until != 0 { // a quota's counter, of the period the debt was admitted in
			b = lua.Bucket{Key: key, Capacity: max(o.lim.Capacity, 1), Counter: true, Expire: time.UnixMilli(o.id.until), Debt: d}
		}
		if settle {
			b.Debt = 0
			p.batch.Add(lua.Decision{Op: lua.OpSettle, N: d, Buckets: []lua.Bucket{b}})
		} else {
			p.batch.Add(lua.Decision{Op: lua.OpCharge, Buckets: []lua.Bucket{b}})
		}
		p.debts = append(p.debts, o)
		p.settle = append(p.settle, settle)
	}
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(parts))
	for i, p := range parts {
		cmds[i] = p.batch.Cmd(ctx)
		_ = pipe.Process(ctx, cmds[i])
	}
	_, _ = pipe.Exec(ctx)
	for i, p := range parts {
		if lua.IsNoScript(cmds[i].Err()) {
			cmds[i] = p.batch.EvalCmd(ctx)
			_ = l.rdb.Process(ctx, cmds[i])
		}
		outs, err := p.batch.Read(cmds[i], nil)
		for j, o := range p.debts {
			if err != nil {
				lost += o.tokens
				continue
			}
			if p.settle[j] {
				settled += outs[j].Granted
				continue
			}
			c := outs[j].Buckets[0].Charged
			charged += c
			if o.tokens > c {
				l.m.writtenOff.Add(float64(o.tokens - c))
			}
		}
	}
	l.m.repaid.Add(float64(charged))
	l.m.flushed.Add(float64(charged))
	l.m.settled[settleCharged].Add(float64(settled))
	charged += settled
	l.m.lost.Add(float64(lost))
	if lost > 0 {
		l.log.Warn("fallback debts lost: redis did not answer the flush", "tokens", lost, "charged", charged)
	} else {
		l.log.Info("fallback debts charged to redis", "tokens", charged)
	}
	return charged, lost
}

// maxFlushBatch is the most charges one flush call carries.
const maxFlushBatch = 256
