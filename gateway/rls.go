package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Descriptor entries the RLS service understands (docs/proxies.md).
const (
	entryAPIKey        = "api_key"
	entryTenant        = "tenant"
	entryRoute         = "route"
	entryRemoteAddress = "remote_address" // Envoy's remote_address action
)

// Bounds of one RLS request: more is refused with InvalidArgument.
const (
	maxDescriptors = 32
	maxEntries     = 16
)

// rlsService is envoy.service.ratelimit.v3.RateLimitService on the gateway's decision path.
type rlsService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	g *Gateway
	// overrideLogged: a descriptor's limit override has been refused and logged once.
	overrideLogged atomic.Bool
}

// rlsStreamWorkers is how many goroutines serve RLS calls. gRPC-Go otherwise starts a
// goroutine per call, whose 8 KiB stack grows on every call on the way to Redis: 9% of
// the gateway's CPU at 64 callers (docs/rls-profile.md). Workers keep their grown
// stacks; a call that finds all of them busy gets its own goroutine as before. More
// workers than callers measured no better, probably because an idle worker's stack is
// shrunk by the garbage collector and grows again.
const rlsStreamWorkers = 64

// newRLSServer is the gRPC server of rls_listen.
func (g *Gateway) newRLSServer() *grpc.Server {
	s := grpc.NewServer(grpc.MaxRecvMsgSize(1<<20), grpc.MaxConcurrentStreams(1024), grpc.NumStreamWorkers(rlsStreamWorkers))
	rlsv3.RegisterRateLimitServiceServer(s, &rlsService{g: g})
	return s
}

// ShouldRateLimit decides every descriptor independently, each through the one
// admission path (admit.go); the overall code is OVER_LIMIT if any descriptor is. A
// Redis outage is answered from the fallback; the only gRPC errors are a malformed
// request (InvalidArgument) and a gateway that has no snapshot yet (Unavailable), where
// Envoy's failure_mode_deny decides.
func (s *rlsService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	g := s.g
	if len(req.GetDescriptors()) > maxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "at most %d descriptors", maxDescriptors)
	}
	snap := g.snap.Load()
	if snap == nil {
		return nil, status.Error(codes.Unavailable, "the gateway has not loaded its configuration yet")
	}
	resp, statuses := newRLSReply(len(req.GetDescriptors()))
	var shown verdict // the verdict whose headers the response carries, when any is
	hasShown := false
	for i, desc := range req.GetDescriptors() {
		c, refund, err := g.descriptorClaim(desc, req.GetHitsAddend())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		st := &statuses[i]
		if refund {
			continue // refunds are not supported: nothing is taken or given back
		}
		if c.done {
			// Sent when the stream is done: its hits are the real cost, charged whole,
			// answered OK (there is nothing left to refuse). Admitted at the fixed cost,
			// so that a cost above cost.max is charged as max rather than refused.
			hits := c.hits
			if hits == 0 && desc.GetHitsAddend() == nil {
				hits = 1 // Envoy's default: an unset hits_addend adds 1
			}
			c.hits = 0
			if a := g.admit(ctx, snap, &c); a.refused == admitted {
				g.settleDone(ctx, a.ask, hits)
			}
			continue
		}
		a := g.admit(ctx, snap, &c)
		if a.refused != admitted {
			// Over the limit, never a free pass: no identity (counted unauthenticated by
			// admit), no route, or a cost or value the route refuses (counted as
			// throttled by no source).
			if !a.refused.unauthenticated() && a.refused != refusedUnmatched {
				c.rt.counters[doorRLS][decThrottled][srcNone].Inc()
			}
			st.status.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		}
		if desc.GetLimit() != nil {
			// Envoy's per-descriptor limit override is not honoured (limits live in
			// quotaplane's rules, with their bands): refused, never decided under a
			// limit it does not state, and logged once so the Envoy config is fixed.
			c.rt.counters[doorRLS][decThrottled][srcNone].Inc()
			if !s.overrideLogged.Swap(true) {
				g.log.Warn("rls descriptor has a limit override, which is not supported: answered OVER_LIMIT; remove limit from the Envoy rate limit action",
					"region", g.cfg.Region, "route", c.rt.id)
			}
			st.status.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		}
		v, ok := g.decide(ctx, a.ask)
		if !ok {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		if v.dec == decThrottled {
			st.status.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if !v.advertised {
			continue
		}
		if v.quotaWindow > 0 {
			st.status.CurrentLimit = quotaLimit(&st.limit, v.hdr.quota, v.quotaWindow)
		} else {
			st.status.CurrentLimit = currentLimit(&st.limit, v.hdr.quota, v.refill)
		}
		st.status.LimitRemaining = uint32(min(max(v.hdr.remaining, 0), math.MaxUint32))
		st.status.DurationUntilReset = durationOf(&st.reset, v.resetAfter)
		if !hasShown || moreRestrictive(&v, &shown) {
			shown, hasShown = v, true
		}
	}
	if hasShown {
		resp.ResponseHeadersToAdd = envoyHeaders(shown.hdr)
	}
	return resp, nil
}

// rlsStatus is one descriptor's status with the messages it points to, allocated
// together: a response is a handful of allocations whatever it says.
type rlsStatus struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// newRLSReply is an OK response with n OK statuses, in three allocations: the
// response, the statuses and the slice pointing at them.
func newRLSReply(n int) (*rlsv3.RateLimitResponse, []rlsStatus) {
	statuses := make([]rlsStatus, n)
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	for i := range statuses {
		statuses[i].status.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &statuses[i].status
	}
	return resp, statuses
}

// durationOf is durationpb.New(d) written into into.
func durationOf(into *durationpb.Duration, d time.Duration) *durationpb.Duration {
	into.Seconds, into.Nanos = int64(d/time.Second), int32(d%time.Second)
	return into
}

// moreRestrictive: a throttled verdict beats an allowed one; then fewer tokens left.
func moreRestrictive(a, b *verdict) bool {
	if a.hdr.throttled != b.hdr.throttled {
		return a.hdr.throttled
	}
	return a.hdr.remaining < b.hdr.remaining
}

// currentLimit describes a token bucket as Envoy's requests per unit, written into into:
// the refill rate in the smallest unit where it is at least one request, named after
// the bucket.
func currentLimit(into *rlsv3.RateLimitResponse_RateLimit, capacity int64, refill float64) *rlsv3.RateLimitResponse_RateLimit {
	units := []struct {
		u   rlsv3.RateLimitResponse_RateLimit_Unit
		sec float64
	}{
		{rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
		{rlsv3.RateLimitResponse_RateLimit_MINUTE, 60},
		{rlsv3.RateLimitResponse_RateLimit_HOUR, 3600},
		{rlsv3.RateLimitResponse_RateLimit_DAY, 86400},
	}
	u := units[len(units)-1]
	for _, c := range units {
		if refill*c.sec >= 1 {
			u = c
			break
		}
	}
	const prefix = "token bucket capacity="
	var buf [len(prefix) + 20]byte
	into.Name = string(strconv.AppendInt(append(buf[:0], prefix...), capacity, 10))
	into.RequestsPerUnit = uint32(min(math.Round(refill*u.sec), math.MaxUint32))
	into.Unit = u.u
	return into
}

// quotaLimit describes a calendar quota as Envoy's requests per unit, written into
// into: the allowance per period, the unit its period's (window: the period's length,
// 23 to 25 hours for a day across a daylight-saving change).
func quotaLimit(into *rlsv3.RateLimitResponse_RateLimit, allowance int64, window time.Duration) *rlsv3.RateLimitResponse_RateLimit {
	switch {
	case window <= time.Hour:
		into.Unit = rlsv3.RateLimitResponse_RateLimit_HOUR
	case window <= 25*time.Hour:
		into.Unit = rlsv3.RateLimitResponse_RateLimit_DAY
	case window <= 8*24*time.Hour:
		into.Unit = rlsv3.RateLimitResponse_RateLimit_WEEK
	default:
		into.Unit = rlsv3.RateLimitResponse_RateLimit_MONTH
	}
	const prefix = "calendar quota allowance="
	var buf [len(prefix) + 20]byte
	into.Name = string(strconv.AppendInt(append(buf[:0], prefix...), allowance, 10))
	into.RequestsPerUnit = uint32(min(max(allowance, 0), math.MaxUint32))
	return into
}

// envoyHeaders are our rate-limit headers as Envoy header values, in the order of
// rlsHeaderNames, allocated together.
func envoyHeaders(h rateHeaders) []*corev3.HeaderValue {
	hdr := make(http.Header, len(rlsHeaderNames))
	h.write(hdr)
	all := new(struct {
		vals [len(rlsHeaderNames)]corev3.HeaderValue
		ptrs [len(rlsHeaderNames)]*corev3.HeaderValue
	})
	out := all.ptrs[:0]
	for i, name := range rlsHeaderNames {
		if v := hdr[name]; len(v) == 1 {
			all.vals[i].Key, all.vals[i].Value = name, v[0]
			out = append(out, &all.vals[i])
		}
	}
	return out
}

// rlsHeaderNames are the headers an RLS response can carry, in their order.
var rlsHeaderNames = [...]string{hdrLimit, hdrRemaining, hdrReset, hdrPolicy, hdrRateLimit, hdrRetryAfter}

// errDescriptor is a malformed descriptor (InvalidArgument).
var errDescriptor = errors.New("malformed descriptor")

// descriptorClaim reads one descriptor into a claim (docs/proxies.md): api_key (a key,
// resolved like the key header), tenant (an identity only with rls_trust_tenant), route
// (a route id, or "*"; none or an unknown one is unmatched), remote_address (the client,
// for the guard and limit_by client_ip), hits_addend as the cost, and the entry a
// limit_by route names, and quotaplane_phase=done (a descriptor sent when the stream is
// done: settled, not decided). refund reports is_negative_hits, answered OK untouched. It
// never touches Redis and allocates no state that grows with the values it sees.
func (g *Gateway) descriptorClaim(d *rlcommon.RateLimitDescriptor, reqHits uint32) (c claim, refund bool, err error) {
	entries := d.GetEntries()
	if len(entries) > maxEntries {
		return claim{}, false, fmt.Errorf("%w: more than %d entries", errDescriptor, maxEntries)
	}
	var routeID string
	nRoute, nClient := 0, 0
	for _, e := range entries {
		switch e.GetKey() {
		case entryRemoteAddress:
			nClient++
			if a, err := netip.ParseAddr(e.GetValue()); err == nil && a.Zone() == "" {
				c.client = clientKey(a.Unmap())
			}
		case entryAPIKey:
			c.keys = append(c.keys, e.GetValue())
		case entryTenant:
			c.tenants = append(c.tenants, e.GetValue())
		case entryRoute:
			routeID, nRoute = e.GetValue(), nRoute+1
		case entryPhase:
			if e.GetValue() != phaseDone || c.done {
				return claim{}, false, fmt.Errorf("%w: %s must be %q, once", errDescriptor, entryPhase, phaseDone)
			}
			c.done = true
		}
	}
	if nRoute > 1 {
		return claim{}, false, fmt.Errorf("%w: more than one route entry", errDescriptor)
	}
	if nClient != 1 {
		c.client = netip.Addr{} // none, or several: which is the client?
	}
	c.door = doorRLS
	c.rt, c.outcome = g.routes.named(routeID, nRoute == 1)
	c.fromHits, c.hits = true, uint64(reqHits)
	if d.GetHitsAddend() != nil {
		c.hits = d.GetHitsAddend().GetValue()
	}
	if lb := c.rt.limitBy; lb.kind == limitByHeader || lb.kind == limitByDescriptor {
		for _, e := range entries {
			if lb.kind == limitByHeader && sameHeaderName(e.GetKey(), lb.name) || e.GetKey() == lb.name {
				c.values = append(c.values, e.GetValue())
			}
		}
	}
	return c, d.GetIsNegativeHits(), nil
}

// serveRLS serves the gRPC service on ln until ctx ends, then stops gracefully within
// the drain timeout.
func (g *Gateway) serveRLS(ctx context.Context, srv *grpc.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	t := time.NewTimer(g.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		srv.Stop()
		<-done
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
