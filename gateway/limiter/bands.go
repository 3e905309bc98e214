package limiter

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// A request with bands (Request.Bands) is decided on one bucket per band, all or none:
// the route's bucket (the band regions.PrimaryBand), each band's, and the value's when
// set, in that order, in one script call for Redis (shards and leases are not used: the
// buckets share the tenant's slot, and a lease of one bucket would not hold the others),
// under one set of shard locks for a Local or a fallback, whose 1/N split applies to
// every band. The buckets of such a decision are laid out in that order everywhere here
// (bandBuckets): the route's at 0, band i at 1+i, the value's last.

// maxBandBuckets is the most buckets of one decision: the route's, MaxBands bands' and
// a value's.
const maxBandBuckets = 2 + regions.MaxBands

// checkBands validates r's bands for cost: each limit, cost within each capacity, names
// neither empty, nor regions.PrimaryBand, nor twice (one bucket each). Names are ids
// (regions.ValidateID) as tenants and routes are: the rule store validated them.
func (r Request) checkBands(cost int64) error {
	if len(r.Bands) > regions.MaxBands {
		return fmt.Errorf("%w %s/%s: %d bands, at most %d", ErrInvalidRequest, r.Tenant, r.Route, len(r.Bands), regions.MaxBands)
	}
	if len(r.BandRaises) > len(r.Bands) {
		return fmt.Errorf("%w %s/%s: %d band raises for %d bands", ErrInvalidRequest, r.Tenant, r.Route, len(r.BandRaises), len(r.Bands))
	}
	for i, b := range r.Bands {
		if b.Name == "" || strings.EqualFold(b.Name, regions.PrimaryBand) {
			return fmt.Errorf("%w %s/%s: band %d named %q: a band needs a name other than %q", ErrInvalidRequest, r.Tenant, r.Route, i, b.Name, regions.PrimaryBand)
		}
		for _, o := range r.Bands[:i] {
			if o.Name == b.Name {
				return fmt.Errorf("%w %s/%s: band %q appears twice", ErrInvalidRequest, r.Tenant, r.Route, b.Name)
			}
		}
		if q := b.Quota; q != nil {
			// A quota: its allowance may be 0 or below the cost (then it refuses); its
			// period must hold a time and its floor be a count.
			if b.Limit.Capacity < 0 || b.Limit.Capacity > lua.MaxCapacity || q.Floor < 0 || q.Floor > lua.MaxCapacity || !q.End.After(q.Start) {
				return fmt.Errorf("%w %s/%s: quota band %s: allowance %d and floor %d must be between 0 and %d, and its period [%v, %v) not empty", ErrInvalidRequest, r.Tenant, r.Route, b.Name, b.Limit.Capacity, q.Floor, int64(lua.MaxCapacity), q.Start, q.End)
			}
			continue
		}
		if checkLimit(r, "", b.Limit) != nil {
			return checkLimit(r, "band "+b.Name+" ", b.Limit) // the name only for an error
		}
		if i < len(r.BandRaises) {
			if br := r.BandRaises[i]; br.Ago < 0 || !(br.Ratio >= 0 && br.Ratio <= 1) {
				return fmt.Errorf("%w %s/%s: band %s raised %v ago with ratio %v (want a duration >= 0 and a ratio in [0, 1])", ErrInvalidRequest, r.Tenant, r.Route, b.Name, br.Ago, br.Ratio)
			}
		}
		if cost > b.Limit.Capacity {
			return fmt.Errorf("%w %s/%s: cost %d must be between 1 and band %s's capacity %d", ErrInvalidRequest, r.Tenant, r.Route, cost, b.Name, b.Limit.Capacity)
		}
	}
	return nil
}

// limitOf is the regional limit of r's bucket id: the route's, the value's or a band's.
func (r Request) limitOf(id bucketID) regions.Limit {
	switch {
	case id.band != "":
		for _, b := range r.Bands {
			if b.Name == id.band {
				return b.Limit
			}
		}
	case id.value != "":
		return r.ValueLimit
	}
	return r.Limit
}

// bandBuckets writes the ids and regional limits of r's buckets, in the order above,
// into ids and lims, and returns how many.
func (r Request) bandBuckets(ids *[maxBandBuckets]bucketID, lims *[maxBandBuckets]regions.Limit) int {
	ids[0], lims[0] = bucketID{tenant: r.Tenant, route: r.Route}, r.Limit
	n := 1
	for _, b := range r.Bands {
		ids[n], lims[n] = bucketID{tenant: r.Tenant, route: r.Route, band: b.Name}, b.Limit
		if q := b.Quota; q != nil {
			ids[n].period, ids[n].until = q.Start.Unix(), q.End.Add(QuotaGrace).UnixMilli()
		}
		n++
	}
	if r.Value != "" {
		ids[n], lims[n] = bucketID{tenant: r.Tenant, route: r.Route, value: r.Value}, r.ValueLimit
		n++
	}
	return n
}

// capOf is the cap of bucket b of r's buckets as bandBuckets lays them out: a band's is
// held by its own raise (bandCap), the route's and the value's by the route's (capFor).
func (r Request) capOf(b int, lim regions.Limit) float64 {
	if b >= 1 && b <= len(r.Bands) {
		return r.bandCap(b-1, lim)
	}
	return r.capFor(lim, 0)
}

// QuotaGrace is how long a quota's counter outlives its period in Redis: a gateway
// whose clock is behind still counts on it, and a request decided just before the end
// can still be settled on it.
const QuotaGrace = time.Hour

// quotaOf is the quota of bucket b of r's buckets as bandBuckets lays them out; nil for
// a token bucket.
func (r Request) quotaOf(b int) *regions.QuotaCounter {
	if b >= 1 && b <= len(r.Bands) {
		return r.Bands[b-1].Quota
	}
	return nil
}

// counter is the Redis counter at key of quota q with allowance lim.Capacity (at least
// 1: a decision is not sent to Redis with less, quotaShort refuses it first).
func counter(key string, lim regions.Limit, q *regions.QuotaCounter) lua.Bucket {
	return lua.Bucket{Key: key, Capacity: max(lim.Capacity, 1), Counter: true, Expire: q.End.Add(QuotaGrace), Cap: float64(q.Floor)}
}

// bucketOf is r.bucket for bucket b of r's buckets (capOf), at key; a quota's counter.
func (r Request) bucketOf(b int, key string, lim regions.Limit) lua.Bucket {
	if q := r.quotaOf(b); q != nil {
		return counter(key, lim, q)
	}
	c := r.capOf(b, lim)
	return lua.Bucket{Key: key, Capacity: lim.Capacity, Refill: lim.RefillPerSecond, Cap: c, CapAll: c >= 0, ChangedAgo: r.ChangedAgo}
}

// keyOf is the Redis key of the bucket id (its shard 0 for a route).
func (l *Redis) keyOf(id bucketID) string {
	switch {
	case id.period != 0:
		return l.keys.Quota(id.tenant, id.route, id.band, id.period)
	case id.band != "":
		return l.keys.Band(id.tenant, id.route, id.band)
	case id.value != "":
		return l.keys.Value(id.tenant, id.route, id.value)
	}
	return l.keys.Bucket(id.tenant, id.route)
}

// takeBands decides r, which has bands, with one script call on all its buckets (each
// held to r's raise cap under its own limit), or with the fallback when Redis does not
// answer.
func (l *Redis) takeBands(ctx context.Context, r Request, cost int64) (Decision, error) {
	now := l.now()
	var ids [maxBandBuckets]bucketID
	var lims [maxBandBuckets]regions.Limit
	n := r.bandBuckets(&ids, &lims)
	bs := make([]lua.Bucket, n)
	for b := range n {
		bs[b] = r.bucketOf(b, l.keyOf(ids[b]), lims[b])
	}
	if d, short := r.quotaShort(now, cost, 1); short {
		// Refused on the region's allowance: nothing to decide in Redis. But what a
		// fallback admitted on these buckets is charged all the same (a charge only),
		// or a spent quota's counter would never count it.
		if l.fb.mayOwe() {
			if _, _, err := l.callCharging(ctx, lua.OpCharge, 0, bs, ids[:n], r); err != nil && ctx.Err() == nil {
				l.log.Debug("quota debts not charged", "tenant", r.Tenant, "route", r.Route, "err", err)
			}
		}
		d.Source = SourceRedis
		return d, nil
	}
	out, ok, err := l.callCharging(ctx, lua.OpTake, cost, bs, ids[:n], r)
	if err != nil {
		return Decision{}, fmt.Errorf("decide %s/%s: %w", r.Tenant, r.Route, err)
	}
	if !ok {
		return l.fb.decide(r, cost), nil
	}
	allowed := out.Granted > 0
	retry := out.RetryAfter
	var ds [maxBandBuckets]Decision
	for b := range n {
		o, lim := out.Buckets[b], lims[b]
		d := Decision{Allowed: allowed, Limit: lim.Capacity, RefillPerSecond: lim.RefillPerSecond, Remaining: o.Remaining, ResetAfter: o.ResetAfter}
		if q := r.quotaOf(b); q != nil {
			// A counter: what is left of the allowance, until the period ends.
			d.ResetAfter, d.used, d.quota = untilEnd(now, q), o.Used, q
			if !allowed && o.Remaining < cost {
				d.RetryAfter = quotaRetry(now, q, cost)
				retry = max(retry, d.RetryAfter)
			}
		} else if !allowed && o.Remaining < cost {
			// This bucket refuses: it holds cost tokens (cap - cost)/refill before it is full.
			d.RetryAfter = max(o.ResetAfter-secondsUp(float64(lim.Capacity-cost)/lim.RefillPerSecond), time.Millisecond)
		}
		ds[b] = d
	}
	d := r.banded(ds[:n], allowed, retry)
	d.Source = SourceRedis
	return d, nil
}

// untilEnd is the time from now to the end of quota q's period, at least a millisecond.
func untilEnd(now time.Time, q *regions.QuotaCounter) time.Duration {
	return max(q.End.Sub(now), time.Millisecond)
}

// quotaRetry is how long a request of cost that quota q refuses should wait: q.Retry
// when the region's allowance can still grow by the cost (it grows with the count), else
// until the period's end; at most that.
func quotaRetry(now time.Time, q *regions.QuotaCounter, cost int64) time.Duration {
	end := untilEnd(now, q)
	if q.Grow >= cost && q.Retry > 0 {
		return min(q.Retry, end)
	}
	return end
}

// quotaShare is what one of n instances may take of quota band b (a BandLimit with
// Quota) in a decision of its own: what is left of the allowance above the floor, split
// n ways (rounded down; n = 1: the region's).
func quotaShare(b regions.BandLimit, n int) int64 {
	left := max(b.Limit.Capacity-b.Quota.Floor, 0)
	if n > 1 {
		left /= int64(n)
	}
	return left
}

// quotaShort is r refused at now when one of its quota bands cannot take cost within
// an instance's part of it (quotaShare; n = 1: the region's): refused without a bucket
// deciding, Retry-After until the end of the period of the quota that refuses longest.
// ok is false when every quota has room (or r has none): the buckets decide.
func (r Request) quotaShort(now time.Time, cost int64, n int) (Decision, bool) {
	short := -1
	for i, b := range r.Bands {
		if b.Quota != nil && quotaShare(b, n) < cost && (short < 0 || quotaRetry(now, b.Quota, cost) > quotaRetry(now, r.Bands[short].Quota, cost)) {
			short = i
		}
	}
	if short < 0 {
		return Decision{}, false
	}
	ds := make([]Decision, 1+len(r.Bands))
	ds[0] = Decision{Limit: r.Limit.Capacity, RefillPerSecond: r.Limit.RefillPerSecond}
	for i, b := range r.Bands {
		if b.Quota == nil {
			ds[1+i] = Decision{Limit: fallbackLimit(b.Limit, n).Capacity, RefillPerSecond: fallbackLimit(b.Limit, n).RefillPerSecond}
			continue
		}
		left := quotaShare(b, n)
		ds[1+i] = Decision{Limit: left, Remaining: left, ResetAfter: untilEnd(now, b.Quota), quota: b.Quota}
		if left < cost {
			ds[1+i].RetryAfter = quotaRetry(now, b.Quota, cost)
		}
	}
	if r.Value != "" {
		ds = append(ds, Decision{Limit: r.ValueLimit.Capacity, RefillPerSecond: r.ValueLimit.RefillPerSecond})
	}
	return r.banded(ds, false, ds[1+short].RetryAfter), true
}

// quotaRefill is the refill of the in-memory bucket that stands for a quota's counter
// (a standalone Local's, a fallback's): small enough never to make a whole token within
// any period (3e-5 tokens in a year), yet a valid refill.
const quotaRefill = 1e-12

// takeBands is take for a request with bands: each of its buckets holding 1/n of its
// rule (fallbackLimit; n = 1 for a standalone Local), admitted together or not at all.
// The buckets' shards are locked once each, in shard order as take locks them, so no two
// decisions deadlock and never both pass a check only one can.
func (l *Local) takeBands(now time.Time, r Request, n int, cost int64, owe bool) Decision {
	var ids [maxBandBuckets]bucketID
	var rules, lims [maxBandBuckets]regions.Limit
	var keys [maxBandBuckets]uint64
	var shards [maxBandBuckets]*shard
	var es [maxBandBuckets]entry
	var found [maxBandBuckets]bool
	if d, short := r.quotaShort(now, cost, n); short {
		return d
	}
	m := r.bandBuckets(&ids, &rules)
	// The distinct shards' indexes, sorted (insertion sort: at most maxBandBuckets).
	var order [maxBandBuckets]uint8
	locks := 0
	for i := range m {
		lims[i] = fallbackLimit(rules[i], n)
		if q := r.quotaOf(i); q != nil {
			// A quota's counter as a bucket of this instance's part of what is left,
			// that never refills within a period (one bucket per period).
			lims[i] = regions.Limit{Capacity: quotaShare(r.Bands[i-1], n), RefillPerSecond: quotaRefill}
		}
		keys[i], shards[i] = l.key(ids[i])
		si := uint8(keys[i] >> 58)
		j := 0
		for j < locks && order[j] < si {
			j++
		}
		if j < locks && order[j] == si {
			continue
		}
		copy(order[j+1:locks+1], order[j:locks])
		order[j] = si
		locks++
	}
	for _, si := range order[:locks] {
		l.shards[si].mu.Lock()
	}
	defer func() {
		for i := locks - 1; i >= 0; i-- {
			l.shards[order[i]].mu.Unlock()
		}
	}()
	all := true
	for i := range m {
		es[i], found[i] = shards[i].m[keys[i]]
		if r.quotaOf(i) != nil {
			// A quota starts with its part, a fallback's too: it never refills.
			l.open(&es[i], true, now, lims[i], lua.NoCap)
		} else {
			l.open(&es[i], found[i], now, lims[i], r.capOf(i, lims[i]))
		}
		all = all && es[i].b.has(now, lims[i], cost)
	}
	var ds [maxBandBuckets]Decision
	var retry time.Duration
	for i := range m {
		ds[i] = es[i].b.decide(now, lims[i], cost, all)
		if q := r.quotaOf(i); q != nil {
			ds[i].RefillPerSecond, ds[i].ResetAfter, ds[i].quota = 0, untilEnd(now, q), q
			if ds[i].RetryAfter > 0 {
				ds[i].RetryAfter = quotaRetry(now, q, cost)
			}
		}
		retry = max(retry, ds[i].RetryAfter)
		// Looked up again: storing an earlier bucket of the same shard may have evicted it.
		_, was := shards[i].m[keys[i]]
		l.store(shards[i], keys[i], es[i], was, now, lims[i])
		if owe && all {
			shards[i].owe(keys[i], owing{tokens: cost, id: ids[i], lim: lims[i], rule: rules[i]})
		}
	}
	return r.banded(ds[:m], all, retry)
}

// banded is the decision of a request with bands from its buckets' own decisions ds
// (laid out as bandBuckets lays them out, each with its own RetryAfter when it refused),
// admitted or not, with retry the decision's RetryAfter when refused. Bands[0] is the
// rule's own band (the route's bucket and the value's folded by tighter, as a request
// without bands is), then each band; the top-level fields are the band closest to
// exhaustion (closer). Source is left for the caller.
func (r Request) banded(ds []Decision, allowed bool, retry time.Duration) Decision {
	prim := ds[0]
	if r.Value != "" {
		prim = tighter(prim, ds[len(ds)-1])
	}
	bands := make([]BandState, 1+len(r.Bands))
	bands[0] = bandState(regions.PrimaryBand, prim)
	top := prim
	for i, b := range r.Bands {
		d := ds[1+i]
		bands[1+i] = bandState(b.Name, d)
		if closer(d, top) {
			top = d
		}
	}
	top.Allowed, top.RetryAfter, top.Bands = allowed, 0, bands
	if !allowed {
		top.RetryAfter = retry
	}
	return top
}

// closer reports whether band a is closer to exhaustion than band b: it refuses longer
// (its own RetryAfter; 0 for a band that admits), or as long and has fewer tokens left,
// or as many and takes longer to fill (tighter's order). Ties keep b: the earlier band.
func closer(a, b Decision) bool {
	if a.RetryAfter != b.RetryAfter {
		return a.RetryAfter > b.RetryAfter
	}
	return a.Remaining < b.Remaining || (a.Remaining == b.Remaining && a.ResetAfter > b.ResetAfter)
}

func bandState(name string, d Decision) BandState {
	return BandState{Name: name, Limit: d.Limit, RefillPerSecond: d.RefillPerSecond, Remaining: d.Remaining, ResetAfter: d.ResetAfter, Quota: d.quota, Used: d.used}
}

// refusedBands fills d.Bands for a fallback refusal of r made with no bucket deciding:
// each band's limit split n ways (n = 1: the region's), nothing remaining.
func (r Request) refusedBands(d Decision, n int) Decision {
	if len(r.Bands) == 0 {
		return d
	}
	d.Bands = make([]BandState, 1+len(r.Bands))
	d.Bands[0] = BandState{Name: regions.PrimaryBand, Limit: d.Limit, RefillPerSecond: d.RefillPerSecond}
	for i, b := range r.Bands {
		lim := fallbackLimit(b.Limit, n)
		d.Bands[1+i] = BandState{Name: b.Name, Limit: lim.Capacity, RefillPerSecond: lim.RefillPerSecond}
		if b.Quota != nil {
			d.Bands[1+i] = BandState{Name: b.Name, Limit: quotaShare(b, n), Quota: b.Quota}
		}
	}
	return d
}
