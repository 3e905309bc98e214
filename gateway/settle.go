package gateway

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/gateway/limiter"
)

// Cost known after the response (docs/configuration.md). A proxy route with
// cost.response_header is admitted on its estimate (its cost as usual); once the
// upstream's response headers arrive, the real cost they state is settled: the
// difference is charged to the request's buckets, into debt if need be, or given back
// (limiter Settle), in the background. Over RLS, a descriptor Envoy sends when the stream
// is done, marked with the quotaplane_phase entry, charges its hits_addend whole.

// settleOutcome is the outcome label of ratelimit_settles_total.
type settleOutcome uint8

const (
	settleSettled   settleOutcome = iota // settled at the real cost
	settleCapped                         // the real cost was above cost.max: settled at max
	settleMissing                        // no cost header: the estimate stands
	settleMalformed                      // a cost header that is not one decimal integer >= 0
	settleFailed                         // the limiter refused the settle (an invalid request)
	numSettleOutcomes
)

var settleOutcomeNames = [numSettleOutcomes]string{"settled", "capped", "missing", "malformed", "failed"}

// settleCounters are one route's ratelimit_settles_total series at one door.
type settleCounters [numSettleOutcomes]prometheus.Counter

// newSettleCounters resolves (and so pre-initialises) route's series at door d.
func (m *metrics) newSettleCounters(route string, d door) *settleCounters {
	var c settleCounters
	for o := range numSettleOutcomes {
		c[o] = m.settles.WithLabelValues(route, doorNames[d], settleOutcomeNames[o])
	}
	return &c
}

// maxSettling bounds the settles in flight in the background; past it a response waits
// for its own settle (at most the Redis timeout): back pressure, never a lost charge.
const maxSettling = 1024

// settler runs the proxy's settles in the background, each bounded by its own timeout,
// and waits for them at shutdown.
type settler struct {
	timeout time.Duration
	slots   chan struct{}
	mu      sync.Mutex
	closed  bool // after close, settles run in the caller
	wg      sync.WaitGroup
}

func newSettler(timeout time.Duration) *settler {
	return &settler{timeout: timeout, slots: make(chan struct{}, maxSettling)}
}

// settle charges delta against r, as decided, on lim, in the background when a slot
// is free and the settler is open, else in the caller; done gets the limiter's error.
func (s *settler) settle(lim decider, r limiter.Request, delta int64, done func(error)) {
	s.mu.Lock()
	background := !s.closed
	if background {
		select {
		case s.slots <- struct{}{}:
			s.wg.Add(1)
		default:
			background = false
		}
	}
	s.mu.Unlock()
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		done(lim.Settle(ctx, r, delta))
	}
	if !background {
		run()
		return
	}
	go func() {
		defer s.wg.Done()
		defer func() { <-s.slots }()
		run()
	}()
}

// close waits for the settles in flight; later ones run in their caller.
func (s *settler) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
}

// settleKey carries a proxied request's pendingSettle from serveProxy to the reverse
// proxy's ModifyResponse.
type settleKey struct{}

// pendingSettle is what a response's real cost is settled against: the request exactly
// as the limiter decided it, whose Cost is the estimate.
type pendingSettle struct {
	req limiter.Request
}

// settleResponse reads the real cost from an upstream response of rt and settles the
// difference from the estimate, when the request was admitted by a limiter decision
// (serveProxy attached a pendingSettle). A missing or malformed value charges nothing
// more; one above cost.max is charged as max.
func (g *Gateway) settleResponse(rt *route, res *http.Response) {
	if res.Request == nil {
		return
	}
	p, ok := res.Request.Context().Value(settleKey{}).(*pendingSettle)
	if !ok {
		return
	}
	real, outcome := realCost(headerValues(res.Header, rt.cost.ResponseHeader), rt.cost.Max)
	switch outcome {
	case settleMissing:
		rt.settles.count(settleMissing)
		g.log.Debug("response states no cost; the estimate stands", "region", g.cfg.Region, "route", rt.id, "header", rt.cost.ResponseHeader)
		return
	case settleMalformed:
		rt.settles.count(settleMalformed)
		if !rt.malformedLogged.Swap(true) {
			g.log.Warn("upstream response cost is not one decimal integer >= 0; the estimate stands (logged once per route)",
				"region", g.cfg.Region, "route", rt.id, "header", rt.cost.ResponseHeader)
		}
		return
	case settleCapped:
		if !rt.cappedLogged.Swap(true) {
			g.log.Warn("upstream response cost is above cost.max; charged as max (logged once per route)",
				"region", g.cfg.Region, "route", rt.id, "header", rt.cost.ResponseHeader, "max", rt.cost.Max)
		}
	}
	g.settler.settle(g.lim, p.req, real-p.req.Cost, func(err error) {
		if err != nil {
			rt.settles.count(settleFailed)
			g.log.Debug("settle failed", "region", g.cfg.Region, "tenant", p.req.Tenant, "route", rt.id, "err", err)
			return
		}
		rt.settles.count(outcome)
	})
}

// count increments outcome's counter; a nil set (a route without settles) counts nothing.
func (c *settleCounters) count(o settleOutcome) {
	if c != nil {
		c[o].Inc()
	}
}

// realCost reads a response's real cost: one value of plain decimal digits, capped at
// max (capped then). None is missing; several, a sign, a space inside or anything but
// digits is malformed.
func realCost(vals []string, max int64) (int64, settleOutcome) {
	switch len(vals) {
	case 0:
		return 0, settleMissing
	case 1:
	default:
		return 0, settleMalformed
	}
	s := trimOWS(vals[0])
	if s == "" {
		return 0, settleMalformed
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, settleMalformed
		}
	}
	if len(s) > 18 { // digits only: far above any max (MaxCost)
		return max, settleCapped
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, settleMalformed
	}
	if n > max {
		return max, settleCapped
	}
	return n, settleSettled
}

// entryPhase marks an RLS descriptor Envoy sends when the stream is done
// (apply_on_stream_done): quotaplane_phase=done (docs/proxies.md).
const (
	entryPhase = "quotaplane_phase"
	phaseDone  = "done"
)

// settleDone charges a done-phase RLS descriptor: its hits (the real cost, capped by
// the route's cost.max, or MaxCost without one) taken whole from the buckets the
// request's decision took from, into debt if need be, never refused. The caller answers
// OK whatever happens: the stream is over, there is nothing left to refuse. A claim
// that does not authenticate is counted as admit counts it; a shadow rule is not charged.
func (g *Gateway) settleDone(ctx context.Context, a ask, hits uint64) {
	if hits == 0 {
		return
	}
	req, rule := g.limiterRequest(a)
	if rule.Shadow {
		return
	}
	limit := a.rt.cost.Max
	if limit <= 0 {
		limit = MaxCost
	}
	outcome := settleSettled
	charge := int64(min(hits, uint64(MaxCost)))
	if charge > limit {
		charge, outcome = limit, settleCapped
	}
	req.Cost = 1 // nothing was estimated here: the decision's call took its own cost
	c := g.rlsSettles(a.rt)
	if err := g.lim.Settle(ctx, req, charge); err != nil {
		c.count(settleFailed)
		g.log.Debug("settle failed", "region", g.cfg.Region, "tenant", a.tenant, "route", a.rt.id, "err", err)
		return
	}
	c.count(outcome)
}

// rlsSettles are rt's settle counters at the RLS door, resolved on first use: only a
// route Envoy sends done-phase descriptors for has them.
func (g *Gateway) rlsSettles(rt *route) *settleCounters {
	rt.rlsSettlesOnce.Do(func() { rt.rlsSettles = g.m.newSettleCounters(rt.id, doorRLS) })
	return rt.rlsSettles
}
