package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
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
}

// newRLSServer is the gRPC server of rls_listen.
func (g *Gateway) newRLSServer() *grpc.Server {
	s := grpc.NewServer(grpc.MaxRecvMsgSize(1<<20), grpc.MaxConcurrentStreams(1024))
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
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors())),
	}
	var shown *verdict // the verdict whose headers the response carries
	for i, desc := range req.GetDescriptors() {
		c, refund, err := g.descriptorClaim(desc, req.GetHitsAddend())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		if refund {
			continue // refunds are not supported: nothing is taken or given back
		}
		a := g.admit(ctx, snap, &c)
		if a.refused != admitted {
			// Over the limit, never a free pass: no identity (counted unauthenticated by
			// admit), no route, or a cost or value the route refuses (counted as
			// throttled by no source).
			if !a.refused.unauthenticated() && a.refused != refusedUnmatched {
				c.rt.counters[doorRLS][decThrottled][srcNone].Inc()
			}
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		}
		v, ok := g.decide(ctx, a.ask)
		if !ok {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		if v.dec == decThrottled {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if !v.advertised {
			continue
		}
		st.CurrentLimit = currentLimit(v.hdr.quota, v.refill)
		st.LimitRemaining = uint32(min(max(v.hdr.remaining, 0), math.MaxUint32))
		st.DurationUntilReset = durationpb.New(v.resetAfter)
		if shown == nil || moreRestrictive(&v, shown) {
			vv := v
			shown = &vv
		}
	}
	if shown != nil {
		resp.ResponseHeadersToAdd = envoyHeaders(shown.hdr)
	}
	return resp, nil
}

// moreRestrictive: a throttled verdict beats an allowed one; then fewer tokens left.
func moreRestrictive(a, b *verdict) bool {
	if a.hdr.throttled != b.hdr.throttled {
		return a.hdr.throttled
	}
	return a.hdr.remaining < b.hdr.remaining
}

// currentLimit describes a token bucket as Envoy's requests per unit: the refill rate in
// the smallest unit where it is at least one request, named after the bucket.
func currentLimit(capacity int64, refill float64) *rlsv3.RateLimitResponse_RateLimit {
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
	return &rlsv3.RateLimitResponse_RateLimit{
		Name:            "token bucket capacity=" + strconv.FormatInt(capacity, 10),
		RequestsPerUnit: uint32(min(math.Round(refill*u.sec), math.MaxUint32)),
		Unit:            u.u,
	}
}

// envoyHeaders are our rate-limit headers as Envoy header values.
func envoyHeaders(h rateHeaders) []*corev3.HeaderValue {
	hdr := make(map[string][]string, 5)
	h.write(hdr)
	out := make([]*corev3.HeaderValue, 0, len(hdr))
	for _, name := range []string{hdrLimit, hdrRemaining, hdrPolicy, hdrRateLimit, hdrRetryAfter} {
		if v := hdr[name]; len(v) == 1 {
			out = append(out, &corev3.HeaderValue{Key: name, Value: v[0]})
		}
	}
	return out
}

// errDescriptor is a malformed descriptor (InvalidArgument).
var errDescriptor = errors.New("malformed descriptor")

// descriptorClaim reads one descriptor into a claim (docs/proxies.md): api_key (a key,
// resolved like the key header), tenant (an identity only with rls_trust_tenant), route
// (a route id, or "*"; none or an unknown one is unmatched), remote_address (the client,
// for the guard and limit_by client_ip), hits_addend as the cost, and the entry a
// limit_by route names. refund reports is_negative_hits, answered OK untouched. It
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
