package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// A request whose cost is known only after its response (LLM tokens, bytes) is decided on
// an estimate (Request.Cost) and settled afterwards with the difference: Settle on either
// limiter. The difference is charged to every bucket the decision took from, into debt
// if need be, never refused and never clipped at -capacity into a free pass; a cost
// below the estimate is given back, up to each bucket's capacity.

// MaxSettle is the largest difference Settle takes, either way: 2 x lua.MaxCapacity, the
// most one script call takes from a bucket.
const MaxSettle = 2 * lua.MaxCapacity

// Directions of ratelimit_settled_tokens_total (tokens per request, not per bucket).
const (
	settleCharged  = iota // taken from the buckets (for Redis: once a reply was read)
	settleReturned        // given back
	settleOwed            // Redis did not answer: recorded, charged by a later call
	settleDropped         // a return Redis did not answer: dropped (errs low)
	settleDirections
)

var settleNames = [settleDirections]string{"charged", "returned", "owed", "dropped"}

// newSettled is ratelimit_settled_tokens_total and its first n directions' counters.
func newSettled(n int) (*prometheus.CounterVec, [settleDirections]prometheus.Counter) {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_settled_tokens_total",
		Help: "Tokens settled after a response said a request's real cost, by direction: charged (above the estimate), returned (below it), owed (Redis did not answer: charged by a later call), dropped (a return Redis did not answer).",
	}, []string{"direction"})
	var cs [settleDirections]prometheus.Counter
	for i := range n {
		cs[i] = v.WithLabelValues(settleNames[i])
	}
	return v, cs
}

// checkSettle validates r as Decide would, and delta.
func (r Request) checkSettle(delta int64) (cost int64, err error) {
	if cost, err = r.cost(); err != nil {
		return 0, err
	}
	if delta < -MaxSettle || delta > MaxSettle {
		return 0, fmt.Errorf("%w %s/%s: settle %d must be between %d and %d", ErrInvalidRequest, r.Tenant, r.Route, delta, -int64(MaxSettle), int64(MaxSettle))
	}
	return cost, nil
}

// Settle charges the difference between the real cost of a request r and the estimate
// it was decided (and admitted) on, r.Cost: the response said the cost was r.Cost +
// delta. r must be the request as it was decided.
//
// delta > 0 takes delta more tokens from every bucket of r, in one script call
// (lua.OpSettle): the route's bucket (shard 0 of a sharded rule: the decision took from
// a random shard, and the shards' sum is what the rule holds, so the region's tokens are
// charged exactly, at shard 0's refill), each band's and the value's. It is never
// refused and goes into debt as deep as delta takes it (down to lua.MaxDebtSeconds of
// refill below full): later requests are refused until the refill has paid it back.
// A missing bucket is charged as a full one. delta < 0 gives -delta back to every bucket
// that exists, up to its capacity (lua.OpReturn). delta == 0 does nothing.
//
// When Redis does not answer (down, the breaker open, the call timed out), a delta > 0
// is recorded per bucket and charged with a settle on the next call of that bucket that
// reaches Redis (or by Flush), once its reply is read; a call that timed out after Redis
// ran it is charged again, as a fallback's debt is (at least once, never lost). A
// delta < 0 is dropped then: it only errs low, counting tokens the request did not
// use. The fallback's own buckets are not charged: they start empty each episode.
//
// The error is non-nil only for an invalid request or delta (ErrInvalidRequest) or a
// ctx that ended (then a delta > 0 is recorded as owed all the same).
func (l *Redis) Settle(ctx context.Context, r Request, delta int64) error {
	cost, err := r.checkSettle(delta)
	if err != nil {
		return err
	}
	shards, err := r.shards(cost)
	if err != nil {
		return err
	}
	if delta == 0 {
		return nil
	}
	var ids [maxBandBuckets]bucketID
	var lims [maxBandBuckets]regions.Limit
	n := r.bandBuckets(&ids, &lims)
	if shards > 1 && r.Value == "" && len(r.Bands) == 0 {
		lims[0] = r.Limit.Shard(shards, 0)
	}
	bs := make([]lua.Bucket, n)
	for b := range n {
		bs[b] = r.bucket(l.keyOf(ids[b]), lims[b], 0)
		if q := r.quotaOf(b); q != nil {
			bs[b] = counter(bs[b].Key, lims[b], q)
		}
	}
	op, tokens := lua.OpSettle, delta
	if delta < 0 {
		op, tokens = lua.OpReturn, -delta
	}
	_, ok, err := l.callCharging(ctx, op, tokens, bs, ids[:n], r)
	switch {
	case ok && delta > 0:
		l.m.settled[settleCharged].Add(float64(delta))
	case ok:
		l.m.settled[settleReturned].Add(float64(-delta))
	case errors.Is(err, ErrInvalidRequest):
		// Redis refused the arguments (a bug here): recording them would fail again.
	case delta > 0:
		for b := range n {
			l.fb.unsettled.add(ids[b], lims[b], delta)
		}
		l.m.settled[settleOwed].Add(float64(delta))
	default:
		l.m.settled[settleDropped].Add(float64(-delta))
	}
	if err != nil {
		return fmt.Errorf("settle %s/%s: %w", r.Tenant, r.Route, err)
	}
	return nil
}

// chargeUnsettled charges what settles of the buckets bs (named ids) recorded while
// Redis did not answer, one settle call per owing bucket, before the call of
// callCharging: cleared once a reply was read, recorded again otherwise. A table owing
// nothing costs one atomic load.
func (l *Redis) chargeUnsettled(ctx context.Context, bs []lua.Bucket, ids []bucketID) {
	if l.fb.unsettled.size.Load() == 0 {
		return
	}
	for b := range bs {
		owed := l.fb.unsettled.take(ids[b], MaxSettle)
		if owed == 0 {
			continue
		}
		one := bs[b]
		one.Debt = 0
		_, ok, err := l.call(ctx, lua.Decision{Op: lua.OpSettle, N: owed, Buckets: []lua.Bucket{one}})
		if errors.Is(err, ErrInvalidRequest) {
			continue // refused: it would be again (a bug here; counted as invalid)
		}
		if !ok {
			l.fb.unsettled.add(ids[b], regions.Limit{Capacity: one.Capacity, RefillPerSecond: one.Refill}, owed)
			return // Redis does not answer: the other buckets' wait for the next call
		}
		l.m.settled[settleCharged].Add(float64(owed))
	}
}

// Settle is Redis.Settle on the local buckets of a standalone limiter: delta > 0 takes
// delta more tokens from every bucket of r (the route's, each band's, the value's; a
// missing one counts as full), into debt as deep as it goes (down to
// lua.MaxDebtSeconds of refill below full, as in Redis), never refused; delta < 0
// gives -delta back to every bucket it holds, up to its capacity; delta == 0 does
// nothing. The error is non-nil only for an invalid request or delta
// (ErrInvalidRequest) or a ctx that has already ended.
func (l *Local) Settle(ctx context.Context, r Request, delta int64) error {
	if _, err := r.checkSettle(delta); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("settle %s/%s: %w", r.Tenant, r.Route, err)
	}
	if delta == 0 {
		return nil
	}
	l.settle(l.now(), r, delta)
	if delta > 0 {
		l.m.settled[settleCharged].Add(float64(delta))
	} else {
		l.m.settled[settleReturned].Add(float64(-delta))
	}
	return nil
}

// settle applies delta to r's buckets at now, each under its shard's lock (one at a
// time: a settle checks nothing across buckets).
func (l *Local) settle(now time.Time, r Request, delta int64) {
	var ids [maxBandBuckets]bucketID
	var lims [maxBandBuckets]regions.Limit
	n := r.bandBuckets(&ids, &lims)
	for i := range n {
		lim := lims[i]
		quota := r.quotaOf(i) != nil
		if quota {
			lim = regions.Limit{Capacity: quotaShare(r.Bands[i-1], 1), RefillPerSecond: quotaRefill}
		}
		k, s := l.key(ids[i])
		s.mu.Lock()
		e, ok := s.m[k]
		switch {
		case quota:
			// A quota's bucket never refills: a settle goes as deep as delta takes it.
			e.b.refill(now, float64(lim.Capacity), lim.RefillPerSecond)
			e.b.tokens = min(max(e.b.tokens-float64(delta), -lua.MaxCapacity), float64(lim.Capacity))
			l.store(s, k, e, ok, now, lim)
		case ok || delta > 0:
			l.open(&e, ok, now, lim, r.capFor(lim, 0))
			e.b.settle(now, lim, delta)
			l.store(s, k, e, ok, now, lim)
		}
		s.mu.Unlock()
	}
}
