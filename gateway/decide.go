package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/regions"
)

// ask is one decision asked through any door: the reverse proxy, the RLS gRPC service
// or the check endpoint. Each door authenticates and reads cost and value its own way;
// from here on they are one path.
type ask struct {
	door   door
	snap   *regions.Snapshot
	tenant string
	rt     *route
	cost   int64  // >= 1
	value  string // the per-value bucket of a limit_by route; "" for none
}

// verdict is the outcome of one decision.
type verdict struct {
	dec decision
	src source
	// advertised: the headers describe an enforced limit. False under a shadow rule (a
	// client must not slow down for a limit that is only measured) and when the limiter
	// could not decide (the request is let through with no made-up headers).
	advertised bool
	hdr        rateHeaders
	// refill is the refill of the bucket that decided (the fallback's is 1/N of the
	// region's; for a rule with bands, the reported band's), for the RLS status's
	// current_limit.
	refill float64
	// quotaWindow is the length of the reported band's period when it is a calendar
	// quota (0 for a token bucket), for the RLS status's current_limit.
	quotaWindow time.Duration
	// resetAfter is the time until the bucket (the reported band) is full (allowed) or
	// until the next request can be admitted (throttled).
	resetAfter time.Duration
	// settleable: the limiter admitted the request under an enforced rule (not shadow,
	// not fail open, not a cost refusal), as req, the request exactly as decided: a
	// response's real cost is settled against req (settle.go).
	settleable bool
	req        limiter.Request
}

// decide is the one decision path of every door: rule lookup, the limiter (Redis with
// its fallback, leases and shards, or the local limiter), shadow rules, fail open, and
// the metrics. ok is false only when ctx ended first: there is no one to answer.
func (g *Gateway) decide(ctx context.Context, a ask) (v verdict, ok bool) {
	start := time.Now()
	req, rule := g.limiterRequest(a)
	lim, bands := req.Limit, req.Bands
	var d limiter.Decision
	var err error
	tooBig := bands != nil && costAboveBands(a.cost, lim, bands)
	if !tooBig {
		d, err = g.lim.Decide(ctx, req)
	}
	elapsed := time.Since(start)
	switch {
	case tooBig || err != nil && bands != nil && errors.Is(err, limiter.ErrInvalidRequest) && a.cost > 1:
		// A cost above one of the bands' capacity (or the rule's): refused like a cost
		// above the rule's, naming the band it does not fit.
		d = costRefusal(a.cost, lim, bands)
		v.src = srcNone
	case err != nil && ctx.Err() != nil:
		return verdict{}, false
	case err != nil && errors.Is(err, limiter.ErrInvalidRequest) && a.cost > 1:
		// A cost no bucket of this rule can ever hold (above the regional capacity, or
		// one shard's): refused, never let through as if the limiter had failed.
		d = limiter.Decision{Allowed: false, Limit: lim.Capacity, RetryAfter: fillTime(lim)}
		v.src = srcNone
	case err != nil:
		// Could not decide: let the request through (fail open) and count it. The
		// client sees no limit headers rather than made-up ones.
		g.m.decisionErrors.Inc()
		g.m.duration[srcNone].Observe(elapsed.Seconds())
		a.rt.counters[a.door][decAllowed][srcNone].Inc()
		g.tenants.count(a.tenant, a.rt.id, decAllowed)
		g.log.Debug("limiter failed; request let through", "region", g.cfg.Region, "tenant", a.tenant, "route", a.rt.id, "err", err)
		return verdict{dec: decAllowed, src: srcNone}, true
	default:
		v.src = sourceOf(d.Source)
		g.sawQuotas(a.tenant, a.rt.id, d)
	}
	g.m.duration[v.src].Observe(elapsed.Seconds())
	v.dec = decAllowed
	if !d.Allowed {
		v.dec = decThrottled
		if rule.Shadow {
			v.dec = decShadowThrottled
		}
	}
	a.rt.counters[a.door][v.dec][v.src].Inc()
	g.tenants.count(a.tenant, a.rt.id, v.dec)
	if rule.Shadow {
		return v, true
	}
	v.refill = d.RefillPerSecond
	v.advertised = true
	v.hdr = decisionHeaders(d)
	if len(d.Bands) > 0 {
		if q := d.Bands[reportedBand(d)].Quota; q != nil {
			v.quotaWindow = q.End.Sub(q.Start)
		}
	}
	v.resetAfter = d.ResetAfter
	if !d.Allowed {
		v.resetAfter = d.RetryAfter
	}
	if d.Allowed {
		v.req, v.settleable = req, true
	}
	return v, true
}

// quotaInDatabaseMode adjusts the quota bands of a gateway that counts its quotas with
// the other regions: a refusal while the fleet has budget left may try again after two
// syncs (the allowance grows with the count); before the first count, and in a region
// the snapshot does not know (which would get an equal split on top of the known
// regions' shares: more than the budget), a quota allows nothing more.
func (g *Gateway) quotaInDatabaseMode(s *regions.Snapshot, bands []regions.BandLimit) {
	loaded := g.usage.Loaded()
	known := s.KnowsRegion(g.cfg.Region)
	for i, b := range bands {
		if b.Quota == nil {
			continue
		}
		q := *b.Quota
		q.Retry = 2 * g.cfg.QuotaSyncInterval
		if !loaded || !known {
			q.Grow = regions.MaxCapacity // try again after the syncs, not at the period's end
			bands[i].Limit.Capacity = q.Floor
		}
		bands[i].Quota = &q
	}
}

// sawQuotas passes on the quota counters a decision Redis made showed (the region's
// usage of each quota band's period) to be reported to the store.
func (g *Gateway) sawQuotas(tenant, route string, d limiter.Decision) {
	if g.usage == nil || d.Source != limiter.SourceRedis {
		return
	}
	for _, b := range d.Bands {
		if b.Quota != nil && b.Used > 0 {
			g.usage.Saw(regions.QuotaKey{Tenant: tenant, Route: route, Band: b.Name, Start: b.Quota.Start.Unix()}, b.Used)
		}
	}
}

// quotaUsage is what the store has counted of one period of a quota band: nothing for a
// standalone gateway (its Local counts alone). Before the first count it is nothing too;
// quotaInDatabaseMode then allows nothing more, so a gateway that starts while the store
// is down never hands out a fresh allowance.
func (g *Gateway) quotaUsage(tenant, route, band string, start time.Time) regions.QuotaUsage {
	if g.usage == nil {
		return regions.QuotaUsage{}
	}
	u, _ := g.usage.Usage(regions.QuotaKey{Tenant: tenant, Route: route, Band: band, Start: start.Unix()})
	return u
}

// limiterRequest is the limiter's request for a, under the rule the snapshot gives a's
// tenant and route in this region: the share (held while an increase is pending), the
// bands, the per-value bucket and the raise markers.
func (g *Gateway) limiterRequest(a ask) (limiter.Request, regions.Rule) {
	rule, lim, share := a.snap.RegionalRule(g.cfg.Region, a.tenant, a.rt.id)
	// A share increase another region's gateways have not acknowledged yet is not
	// enforced: one of them may be cut off from the store and still hold its old share.
	pending, held := a.snap.Pending(g.cfg.Region, a.tenant, a.rt.id)
	if held {
		share *= pending
		lim = regions.Scale(rule.Capacity, rule.RefillPerSecond, share)
	}
	now := g.now()
	bands := rule.ScaledBands(share, now, func(band string, start time.Time) regions.QuotaUsage {
		return g.quotaUsage(a.tenant, a.rt.id, band, start)
	})
	if g.usage != nil && len(bands) > 0 {
		g.quotaInDatabaseMode(a.snap, bands)
	}
	req := limiter.Request{Tenant: a.tenant, Route: a.rt.id, Limit: lim, Cost: a.cost, Shards: rule.Shards, Bands: bands}
	if a.value != "" {
		req.Value, req.ValueLimit = a.value, lim
		if pv := a.rt.perValue; pv != nil {
			req.ValueLimit = regions.Scale(pv.Capacity, pv.RefillPerSecond, share)
		}
	}
	// A raise's ratio relative to the old share in force (held), not the new.
	inForce := func(ratio float64) float64 {
		if held && pending > 0 {
			return min(1, ratio/pending)
		}
		return ratio
	}
	// Within a fill time of a change that may have raised this limit, a bucket Redis no
	// longer holds comes back at the old limit plus the refill since, not full.
	if ago, ratio, ok := a.snap.Raise(g.cfg.Region, a.tenant, a.rt.id, g.sinceSnapshot()); ok {
		req.RaisedAgo, req.RaiseRatio = ago, inForce(ratio)
	}
	// A bucket Redis holds under the limit before a change is converted when the change
	// is in force at every gateway: one reload lag after it (docs/reliability.md's L,
	// within which the old limit may still be enforced). A lagging gateway's writes
	// come before that instant, so converting then never cuts what they left; before
	// it, the bucket converts at its call. A held increase has changed nothing this
	// gateway enforces (its row's date is not the old share's): no age either.
	if !held {
		if ago := a.snap.ChangedAgo(g.cfg.Region, a.tenant, a.rt.id, rule, req.RaisedAgo, g.sinceSnapshot()) - g.reloadLag(); ago > 0 {
			req.ChangedAgo = ago
		}
	}
	// Each band is held by its own raises (and the share's), not by the rule's own.
	for i, b := range rule.Bands {
		if b.Quota() {
			continue // a quota has no bucket to hold: its allowance follows the share
		}
		if ago, ratio, ok := a.snap.BandRaise(g.cfg.Region, a.tenant, a.rt.id, b.Name, b.Limit().FillTime(), g.sinceSnapshot()); ok {
			if req.BandRaises == nil {
				req.BandRaises = make([]limiter.Raise, len(rule.Bands))
			}
			req.BandRaises[i] = limiter.Raise{Ago: ago, Ratio: inForce(ratio)}
		}
	}
	return req, rule
}

// reloadLag is how long after a change to the control plane every gateway enforces it:
// the reload interval (the safety net when a NOTIFY is lost) and a second for the reload
// itself (docs/reliability.md's L).
func (g *Gateway) reloadLag() time.Duration { return g.cfg.ReloadInterval + time.Second }

// costAboveBands reports whether cost does not fit the rule's capacity (lim) or one of
// its bands': no bucket of the rule can ever admit it.
func costAboveBands(cost int64, lim regions.Limit, bands []regions.BandLimit) bool {
	if cost > lim.Capacity {
		return true
	}
	for _, b := range bands {
		if b.Quota == nil && cost > b.Limit.Capacity { // a quota's allowance moves: the limiter refuses
			return true
		}
	}
	return false
}

// costRefusal is the decision for a cost that does not fit a rule with bands: refused,
// reported as the first bucket (the rule's own, then its bands in order) it does not fit,
// with Retry-After that bucket's fill time; the policy still lists every band.
func costRefusal(cost int64, lim regions.Limit, bands []regions.BandLimit) limiter.Decision {
	states := make([]limiter.BandState, 0, 1+len(bands))
	states = append(states, limiter.BandState{Name: regions.PrimaryBand, Limit: lim.Capacity, RefillPerSecond: lim.RefillPerSecond})
	for _, b := range bands {
		states = append(states, limiter.BandState{Name: b.Name, Limit: b.Limit.Capacity, RefillPerSecond: b.Limit.RefillPerSecond, Quota: b.Quota})
	}
	over, fill := 0, lim
	if cost <= lim.Capacity {
		for i, b := range bands {
			if b.Quota == nil && cost > b.Limit.Capacity {
				over, fill = i+1, b.Limit
				break
			}
		}
	}
	// The top-level fields are the refusing band's, as the limiter's are (reportedBand
	// finds it: no band before it has its limit, or that one would refuse first).
	st := states[over]
	return limiter.Decision{Allowed: false, Limit: st.Limit, RefillPerSecond: st.RefillPerSecond, RetryAfter: fillTime(fill), Bands: states}
}

// fillTime is how long an empty bucket of lim takes to fill.
func fillTime(lim regions.Limit) time.Duration {
	if !(lim.RefillPerSecond > 0) {
		return time.Hour
	}
	s := float64(lim.Capacity) / lim.RefillPerSecond
	if s > 86400 {
		return 24 * time.Hour
	}
	return time.Duration(s * float64(time.Second))
}
