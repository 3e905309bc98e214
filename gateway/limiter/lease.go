package limiter

import (
	"cmp"
	"context"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

const (
	leaseShards = 64
	// rateWindow is the window of a key's rate estimate.
	rateWindow = int64(100 * time.Millisecond)
	// admitEvery: an untracked key starts being tracked on 1 in admitEvery of its
	// decisions, so a stream of cold keys churns the table 1/admitEvery as much while a
	// hot key enters within a few dozen decisions.
	admitEvery = 16
	// evictSample: how many tracked keys a full table shard inspects to make room.
	evictSample = 8
)

// LeaseInfo describes one hot key this instance leases tokens for.
type LeaseInfo struct {
	Tenant string `json:"tenant"`
	Route  string `json:"route"`
	// Batch is how many tokens this instance holds at most for the key: it tops its
	// lease up to Batch from the shared bucket in one call.
	Batch int64 `json:"batch"`
	// Instances is the N the batch was sized for (Options.Instances at the last lease).
	Instances int `json:"instances"`
	// Bound is Instances x Batch, the worst-case over-admission of the region for the
	// key: over any interval, the region admits at most what the shared bucket allows
	// plus the tokens leased before the interval and spent in it. It stays within
	// Leases.Fraction of one second's regional refill.
	Bound int64 `json:"overadmission_bound"`
	// Held is how many leased tokens this instance holds unspent now.
	Held int64 `json:"held"`
	// Rate is the tokens per second this instance is asked for on the key.
	Rate float64 `json:"rate"`
	// ExpiresIn is how long the held tokens may still be spent; 0 once expired.
	ExpiresIn time.Duration `json:"expires_in"`
}

// leaseTable is an instance's view of its hot keys: a rate estimate per tracked key and,
// for the hot ones, the tokens leased from the shared bucket.
//
// A key this instance is asked for at Threshold tokens per second or more is leased:
// one Lease call takes up to a batch of tokens from the shared bucket, and decisions
// spend them locally (SourceLease) until they run out or the lease expires (TTL).
// Then one request tops the lease up to the batch while the instance's other requests
// for the key wait for it (at most the call timeout) and take their turn: one Redis call
// per batch, not per request, however many requests are concurrent. (Topping up early,
// at half a batch, was tried: under overload it asks for half batches and doubles the
// calls per admitted request.)
//
// An instance never holds more than a batch, and batch <= Fraction x regional refill /
// instances, so the region's worst-case over-admission, instances x batch, stays within
// Fraction of one second's refill. The batch is also at most what the key uses in a TTL
// and at most a shard's capacity. Below 2 tokens leasing would save nothing, and the key
// is decided by Redis as usual.
//
// When a lease call leaves the shared bucket holding less than a batch per instance,
// the instance waits before asking again: (instances x batch - what the bucket holds) /
// refill, the time the refill needs to make a batch for every instance (see backoff).
// Meanwhile, once its tokens are spent, its requests are rejected locally (Source
// "lease", Allowed false). So a hot key at 20x its limit costs about one Redis call per
// batch admitted, instead of one per request, admitted or not.
//
// Expiry is lazy: held tokens are never spent after their TTL; the next decision on the
// key renews the lease (keeping and topping them up) while the key is hot, or gives
// them back (Return) once it has cooled, and from then on Redis decides the key. A key
// that is never asked for again keeps its held tokens (at most a batch) out of the
// shared bucket: under-admission, never more admission, and the bucket refills a batch
// in at most Fraction / instances seconds.
//
// The table is bounded (Leases.MaxKeys), sharded by a seeded hash of (tenant, route) like
// Local, and evicts the coldest of a few sampled keys to make room.
type leaseTable struct {
	threshold float64
	fraction  float64
	ttl       int64 // ns
	perShard  int
	maxSeries int
	now       func() time.Time
	seed      maphash.Seed
	shards    [leaseShards]leaseShard
}

type leaseShard struct {
	mu sync.Mutex
	m  map[uint64]*hotKey
	_  [48]byte // one 64-byte cache line per shard
}

// hotKey is one tracked key; its fields are guarded by its shard's mutex, and only next
// and refilled (the lease's transitions) change its lease.
type hotKey struct {
	tenant, route string

	// Demand: tokens asked for in the current window, and the last window's rate.
	winStart  int64
	winTokens int64
	prevRate  float64

	// The lease.
	state        leaseState
	held         int64         // tokens leased and not yet spent
	expires      int64         // held tokens may be spent before this time (Unix ns)
	batch        int64         // the batch of the last lease; 0 when not leasing
	instances    int           // the N the batch was sized for
	key          string        // the bucket (or shard) the held tokens came from
	lim          regions.Limit // that bucket's limit, for a return
	wait         chan struct{} // closed when the lease call out (state refilling) returns
	blockedUntil int64         // the shared bucket was empty: no lease call before this
	remaining    int64         // the shared bucket's remaining tokens at the last lease call
	resetAt      int64         // when the shared bucket is full, per the last lease call
}

// leaseState is where a hot key's lease is.
type leaseState uint8

const (
	leaseNone      leaseState = iota // not leasing: Redis decides the key's requests
	leaseHolding                     // tokens held (maybe none) until expires
	leaseRefilling                   // a lease call is out; the others wait for it
)

func newLeaseTable(o LeaseOptions, now func() time.Time) *leaseTable {
	t := &leaseTable{
		threshold: o.Threshold, fraction: o.Fraction, ttl: int64(o.TTL),
		perShard: max(1, o.MaxKeys/leaseShards), maxSeries: o.MaxSeries,
		now: now, seed: maphash.MakeSeed(),
	}
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]*hotKey)
	}
	return t
}

// key hashes (tenant, route) and picks its shard. Each id is hashed on its own (no copy
// through a Hash's buffer) and the two are mixed; an entry also keeps its ids and a
// lookup checks them, so two pairs whose hashes collide never share a lease.
func (t *leaseTable) key(tenant, route string) (uint64, *leaseShard) {
	k := maphash.String(t.seed, tenant)*0x9e3779b97f4a7c15 ^ maphash.String(t.seed, route)
	return k, &t.shards[k>>58]
}

// observe counts cost tokens asked for at now.
func (k *hotKey) observe(now, cost int64) {
	if el := now - k.winStart; el >= rateWindow {
		k.prevRate = float64(k.winTokens) * 1e9 / float64(el)
		k.winStart, k.winTokens = now, 0
	}
	k.winTokens += cost
}

// rate is the tokens per second asked for: over the window that would end now if it is
// due; else the larger of the last window's rate and a lower bound of the current one's
// (the tokens so far over the whole window), so a key is hot as soon as it has been
// asked for threshold x window tokens within a window, and one request after a silence
// never reads as a high rate.
func (k *hotKey) rate(now int64) float64 {
	el := now - k.winStart
	if el >= rateWindow {
		return float64(k.winTokens) * 1e9 / float64(el)
	}
	return max(k.prevRate, float64(k.winTokens)*1e9/float64(rateWindow))
}

// batchFor is the batch to lease for k now, or 0 when it should not be leased.
func (t *leaseTable) batchFor(k *hotKey, lim regions.Limit, instances, shards int, now int64) int64 {
	rate := k.rate(now)
	if rate < t.threshold {
		return 0
	}
	b := int64(t.fraction * lim.RefillPerSecond / float64(instances))
	b = min(b, int64(math.Ceil(rate*float64(t.ttl)/1e9)), lim.Capacity/int64(shards))
	if b < 2 {
		return 0
	}
	return b
}

// insertLocked starts tracking a key, evicting a cold one if the shard is full. It
// returns nil when there is no room (every sampled key is busy).
func (t *leaseTable) insertLocked(s *leaseShard, h uint64, tenant, route string, now int64) *hotKey {
	if len(s.m) >= t.perShard {
		var (
			victim  uint64
			coldest = math.Inf(1)
			found   bool
			seen    int
		)
		for kh, k := range s.m {
			if k.state != leaseRefilling && (k.held == 0 || now >= k.expires) {
				if r := k.rate(now); r < coldest {
					victim, coldest, found = kh, r, true
				}
			}
			if seen++; seen >= evictSample {
				break
			}
		}
		if !found {
			return nil
		}
		delete(s.m, victim)
	}
	k := &hotKey{tenant: tenant, route: route, winStart: now}
	s.m[h] = k
	return k
}

// decision is a decision made from k's lease at now.
func (k *hotKey) decision(lim regions.Limit, now int64, allowed bool) Decision {
	d := Decision{Allowed: allowed, Limit: lim.Capacity, RefillPerSecond: lim.RefillPerSecond, Source: SourceLease}
	d.Remaining = max(0, min(lim.Capacity, k.remaining+k.held))
	if k.resetAt > now {
		d.ResetAfter = time.Duration(k.resetAt - now)
	}
	if !allowed {
		d.RetryAfter = max(time.Duration(k.blockedUntil-now), time.Millisecond)
	}
	return d
}

// leaseAction is what a request on a leased key does next (leaseStep).
type leaseAction uint8

const (
	actRedis  leaseAction = iota // not leased (cold, too small, or a cost above a batch): Redis decides
	actSpend                     // spent from the lease: the answer is d
	actReject                    // the shared bucket is known to be empty: the answer is d
	actWait                      // another request's lease call is out: wait for it, then look again
	actRefill                    // this request tops the lease up with a call, then looks again
	actReturn                    // give n tokens back to key; then look again (trim) or let Redis decide (cooled)
)

// leaseStep is one transition's outcome: the action and what it needs.
type leaseStep struct {
	act   leaseAction
	d     Decision      // actSpend, actReject
	wait  chan struct{} // actWait
	want  int64         // actRefill: tokens to ask for
	batch int64         // actRefill: the batch being filled
	n     int           // actRefill: the N it is sized for
	key   string        // actReturn
	lim   regions.Limit // actReturn
	give  int64         // actReturn
	again bool          // actReturn: look again after it (a trim, not a cooled key)
}

// next is the lease's one transition for a request of cost at now, with the shard's
// mutex held: spend, refuse, wait, refill, return or leave it to Redis, in that order of
// preference. It never does I/O; the caller does what the step says outside the lock.
func (t *leaseTable) next(k *hotKey, lim regions.Limit, cost int64, shards, instances int, now int64) leaseStep {
	switch {
	case k.state == leaseHolding && k.held >= cost && now < k.expires:
		k.held -= cost
		return leaseStep{act: actSpend, d: k.decision(lim, now, true)}
	case k.state == leaseRefilling:
		return leaseStep{act: actWait, wait: k.wait}
	case k.batch > 0 && now < k.blockedUntil:
		return leaseStep{act: actReject, d: k.decision(lim, now, false)}
	}
	b := t.batchFor(k, lim, instances, shards, now)
	switch {
	case b > 0 && cost > b:
		return leaseStep{act: actRedis} // a request larger than a batch: Redis decides it, the lease stays
	case b == 0:
		// Cold, or too small to lease: unspent tokens go back, Redis decides.
		step := leaseStep{act: actRedis}
		if k.held > 0 {
			step = leaseStep{act: actReturn, key: k.key, lim: k.lim, give: k.held}
		}
		k.state, k.held, k.batch, k.expires, k.blockedUntil = leaseNone, 0, 0, 0, 0
		return step
	case k.held > b:
		// The batch shrank (fewer requests, more instances): give the excess back.
		step := leaseStep{act: actReturn, key: k.key, lim: k.lim, give: k.held - b, again: true}
		k.held, k.expires = b, now+t.ttl
		return step
	}
	k.state, k.wait = leaseRefilling, make(chan struct{})
	return leaseStep{act: actRefill, want: b - k.held, batch: b, n: instances}
}

// leaseResult is what a lease call (one or two shards) brought back.
type leaseResult struct {
	answered bool
	granted  int64
	calls    int
	key      string
	lim      regions.Limit
	res      lua.Outcome // the sum over the shards asked, for backoff
}

// refilled applies a lease call's result to k, with the shard's mutex held, and wakes the
// requests that waited for it.
func (t *leaseTable) refilled(k *hotKey, step leaseStep, lr leaseResult, shards int, lim regions.Limit, now int64) {
	k.state = leaseHolding
	close(k.wait)
	if !lr.answered {
		return
	}
	// Held tokens from two shards go back to the last one; a return clips at its
	// capacity, which can only lose tokens, never add any.
	k.held += lr.granted
	k.key, k.lim = lr.key, lr.lim
	k.batch, k.instances = step.batch, step.n
	k.expires = now + t.ttl
	remaining := lr.res.Buckets[0].Remaining
	k.remaining, k.resetAt = remaining, now+int64(lr.res.Buckets[0].ResetAfter)
	if wait := backoff(lr.granted, step.want, remaining, lr.res.RetryAfter, shards, lr.calls, step.n, step.batch, lim.RefillPerSecond); wait > 0 {
		k.blockedUntil = now + int64(wait)
	}
}

// decideLease answers r from this instance's lease on its key, taking or topping up the
// lease when the key is hot. ok is false when the key is not leased (cold, untracked, or
// a rule too small to lease): the caller decides with Redis. The lease's state changes
// only in next and refilled, each called under the key's shard lock; what a step needs
// (a Redis call, a wait) happens outside it.
func (l *Redis) decideLease(ctx context.Context, r Request, cost int64, shards int) (Decision, bool) {
	t := l.leases
	k, s := t.track(r.Tenant, r.Route, cost)
	if k == nil {
		return Decision{}, false
	}
	// Many requests may wait for one refill of a batch that serves only some of them;
	// the others take their turn (refill, or wait for the next one), bounded by the
	// timeout of a Redis call, and only then ask Redis themselves.
	deadline := time.Now().Add(l.timeout)
	for {
		s.mu.Lock()
		step := t.next(k, r.Limit, cost, shards, l.fb.n(), t.now().UnixNano())
		s.mu.Unlock()
		switch step.act {
		case actSpend:
			return step.d, true
		case actReject:
			l.m.leaseRejected.Inc()
			return step.d, true
		case actRedis:
			return Decision{}, false
		case actReturn:
			l.giveBack(ctx, step.key, step.lim, step.give)
			if !step.again {
				return Decision{}, false
			}
		case actWait:
			if !waitRefill(ctx, step.wait, deadline) {
				return Decision{}, false
			}
		case actRefill:
			lr := l.leaseCall(ctx, r, step.want, shards)
			s.mu.Lock()
			t.refilled(k, step, lr, shards, r.Limit, t.now().UnixNano())
			s.mu.Unlock()
			if !lr.answered {
				return l.fb.decide(r, cost), true
			}
		}
		if time.Now().After(deadline) {
			return Decision{}, false
		}
	}
}

// track finds or starts tracking (tenant, route)'s hot key and counts cost tokens asked
// for, or returns nil: an untracked key is admitted on 1 in admitEvery decisions, a hash
// collision with another key's slot or a full shard leaves it untracked.
func (t *leaseTable) track(tenant, route string, cost int64) (*hotKey, *leaseShard) {
	h, s := t.key(tenant, route)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.m[h]
	if k != nil && (k.tenant != tenant || k.route != route) {
		return nil, nil // a hash collision: the slot is another key's
	}
	if k == nil && rand.Uint32N(admitEvery) != 0 {
		return nil, nil // the clock is read only for tracked keys
	}
	now := t.now().UnixNano()
	if k == nil {
		if k = t.insertLocked(s, h, tenant, route, now); k == nil {
			return nil, nil
		}
	}
	k.observe(now, cost)
	return k, s
}

// waitRefill waits for another request's lease call on the same key, until deadline.
// It reports whether the call returned.
func waitRefill(ctx context.Context, w <-chan struct{}, deadline time.Time) bool {
	select {
	case <-w:
		return true
	default:
	}
	wait := time.Until(deadline)
	if wait <= 0 {
		return false
	}
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-w:
		return true
	case <-tm.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// leaseCall takes up to want tokens for r's key with one lease call, and a second on
// another shard of a sharded rule whose first shard gave less than half of them. It
// runs without the shard's lock.
func (l *Redis) leaseCall(ctx context.Context, r Request, want int64, shards int) leaseResult {
	ctx = context.WithoutCancel(ctx) // a client hanging up must not waste a batch
	first, second := 0, 0
	if shards > 1 {
		first, second = twoShards(shards)
	}
	lim := r.Limit.Shard(shards, first)
	key := l.keys.Shard(r.Tenant, r.Route, first)
	id := []bucketID{{tenant: r.Tenant, route: r.Route}}
	l.m.leaseCalls.Inc()
	out, ok, _ := l.callCharging(ctx, lua.OpLease, want, []lua.Bucket{r.bucket(key, lim, first)}, id, r)
	lr := leaseResult{answered: ok, granted: out.Granted, calls: 1, key: key, lim: lim, res: out}
	if !ok {
		return lr
	}
	if 2*lr.granted < want && shards > 1 {
		// Less than half a batch: the next shard may have more. (At half or more, a
		// second call would cost more than the tokens it adds are worth.)
		lim2 := r.Limit.Shard(shards, second)
		key2 := l.keys.Shard(r.Tenant, r.Route, second)
		l.m.leaseCalls.Inc()
		out2, ok2, _ := l.callCharging(ctx, lua.OpLease, want-lr.granted, []lua.Bucket{r.bucket(key2, lim2, second)}, id, r)
		if ok2 {
			lr.calls++
			if lr.granted == 0 || out2.Granted > 0 {
				lr.key, lr.lim = key2, lim2 // give back to a shard that had tokens
			}
			lr.granted += out2.Granted
			lr.res.Buckets[0].Remaining += out2.Buckets[0].Remaining
			lr.res.RetryAfter = min(lr.res.RetryAfter, out2.RetryAfter)
		}
	}
	l.m.leaseGranted.Add(float64(lr.granted))
	// What the shards asked hold, spread over all of them: the rule's estimate.
	lr.res.Buckets[0].Remaining = min(r.Limit.Capacity, lr.res.Buckets[0].Remaining*int64(max(shards, 1))/int64(lr.calls))
	return lr
}

// backoff is how long an instance should not ask for a lease again after a lease call
// that wanted want tokens and got granted, with res the shared bucket's answer (the sum
// over the shards asked, when calls is 2). When the bucket still holds a batch for every
// instance, there is no wait. Otherwise the instance waits until the refill can have
// made one: (instances x batch - what the bucket holds) / refill. With the bucket empty
// that is this instance's fair share of the refill making a batch, so n instances
// together ask about once per batch refilled, and a backlog in the bucket shortens the
// wait, so tokens do not pile up unspent. For a sharded rule, what the bucket holds is
// estimated from the shards asked.
func backoff(granted, want, remaining int64, retryAfter time.Duration, shards, calls, instances int, batch int64, refill float64) time.Duration {
	held := float64(remaining)
	if shards > 1 {
		held = held / float64(calls) * float64(shards)
	}
	missing := float64(batch)*float64(instances) - held
	if granted == want && missing <= 0 {
		return 0
	}
	wait := time.Duration(max(missing, 1) / refill * 1e9)
	if granted == 0 {
		wait = max(wait, retryAfter)
	}
	return wait
}

// giveBack returns n unspent tokens to the bucket at key. A failure loses them (the
// bucket refills them), which can only under-admit; it is counted with the others.
func (l *Redis) giveBack(ctx context.Context, key string, lim regions.Limit, n int64) {
	l.m.returnCalls.Inc()
	d := lua.Decision{Op: lua.OpReturn, N: n, Buckets: []lua.Bucket{{Key: key, Capacity: lim.Capacity, Refill: lim.RefillPerSecond, Cap: lua.NoCap}}}
	if _, ok, _ := l.call(context.WithoutCancel(ctx), d); ok {
		l.m.leaseReturned.Add(float64(n))
	}
}

// Leases lists the keys this instance leases tokens for now, largest bound first: at
// most Leases.MaxKeys, each with its batch and over-admission bound. For an admin page.
// It returns nil when leases are off.
func (l *Redis) Leases() []LeaseInfo {
	if l.leases == nil {
		return nil
	}
	return l.leases.list(0)
}

// list returns the leasing keys, largest bound first; limit > 0 keeps that many.
func (t *leaseTable) list(limit int) []LeaseInfo {
	now := t.now().UnixNano()
	var out []LeaseInfo
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, k := range s.m {
			if k.batch == 0 {
				continue
			}
			li := LeaseInfo{
				Tenant: k.tenant, Route: k.route, Batch: k.batch, Instances: k.instances,
				Bound: k.batch * int64(k.instances), Held: k.held, Rate: k.rate(now),
			}
			if k.expires > now {
				li.ExpiresIn = time.Duration(k.expires - now)
			}
			out = append(out, li)
		}
		s.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b LeaseInfo) int {
		return cmp.Or(cmp.Compare(b.Bound, a.Bound), cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Route, b.Route))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}
