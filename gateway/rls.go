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

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/regions"
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

// ShouldRateLimit decides every descriptor independently; the overall code is
// OVER_LIMIT if any descriptor is. A Redis outage is answered from the fallback; the
// only gRPC errors are a malformed request (InvalidArgument) and a gateway that has no
// snapshot yet (Unavailable), where Envoy's failure_mode_deny decides.
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
		q, err := g.parseDescriptor(snap, desc, req.GetHitsAddend())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case q.refund:
			continue // refunds are not supported: nothing is taken or given back
		case !q.unauthenticated && g.guard != nil && q.client.IsValid():
			// A client blocked by unauthenticated_limit is refused before its key counts,
			// as by the proxy: a guesser must not learn which guesses hit.
			if _, blocked := g.guard.blocked(q.client); blocked {
				q.unauthenticated, q.blocked = true, true
			}
		}
		switch {
		case q.unauthenticated:
			q.rt.counters[doorRLS][decUnauthenticated][srcNone].Inc()
			if g.guard != nil && q.client.IsValid() && !q.blocked {
				if _, ok := g.guard.fail(ctx, q.client); !ok {
					q.blocked = true
				}
			}
			if q.blocked {
				g.m.unauthThrottled.Inc()
			}
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		case q.refused:
			// A cost above the route's cap or a missing or over-long limit_by value:
			// over the limit, never a free pass. Counted as throttled by no source.
			q.rt.counters[doorRLS][decThrottled][srcNone].Inc()
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		}
		v, ok := g.decide(ctx, ask{door: doorRLS, snap: snap, tenant: q.tenant, rt: q.rt, cost: q.cost, value: q.value})
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
		resp.ResponseHeadersToAdd = headerValues(shown.hdr)
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

// headerValues are our rate-limit headers as Envoy header values.
func headerValues(h rateHeaders) []*corev3.HeaderValue {
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

// rlsAsk is one parsed descriptor.
type rlsAsk struct {
	tenant          string
	rt              *route
	cost            int64
	value           string
	unauthenticated bool // no usable identity: over the limit, Redis untouched
	refused         bool // a cost or value this route refuses: over the limit
	refund          bool // is_negative_hits: not supported, answered OK untouched
	// client is the remote_address entry as the unauthenticated guard counts clients;
	// invalid when there is none. Failed authentications of a client are charged to
	// unauthenticated_limit, as the proxy does.
	client  netip.Addr
	blocked bool // the client has used up its unauthenticated_limit
}

// errDescriptor is a malformed descriptor (InvalidArgument).
var errDescriptor = errors.New("malformed descriptor")

// parseDescriptor maps one descriptor onto the gateway's model (docs/proxies.md):
// api_key (resolved like the key header; unknown, revoked or missing means
// unauthenticated), tenant (only with rls_trust_tenant), route (a route id; unknown or
// absent means the "*" rule), hits_addend as the cost (0 means the route's fixed cost,
// capped by routes[].cost.max), and the entry a limit_by route names. It never touches
// Redis and allocates no state that grows with the values it sees.
func (g *Gateway) parseDescriptor(snap *regions.Snapshot, d *rlcommon.RateLimitDescriptor, reqHits uint32) (rlsAsk, error) {
	entries := d.GetEntries()
	if len(entries) > maxEntries {
		return rlsAsk{}, fmt.Errorf("%w: more than %d entries", errDescriptor, maxEntries)
	}
	var key, tenant, routeID string
	var nKey, nTenant, nRoute int
	var client netip.Addr
	for _, e := range entries {
		switch e.GetKey() {
		case entryRemoteAddress:
			if a, err := netip.ParseAddr(e.GetValue()); err == nil && a.Zone() == "" {
				client = clientKey(a.Unmap())
			}
		case entryAPIKey:
			key, nKey = e.GetValue(), nKey+1
		case entryTenant:
			tenant, nTenant = e.GetValue(), nTenant+1
		case entryRoute:
			routeID, nRoute = e.GetValue(), nRoute+1
		}
	}
	q := rlsAsk{rt: g.anyRoute, client: client}
	if nRoute > 1 {
		return rlsAsk{}, fmt.Errorf("%w: more than one route entry", errDescriptor)
	}
	if rt, ok := g.routes[routeID]; ok {
		q.rt = rt
	}
	if d.GetIsNegativeHits() {
		q.refund = true
		return q, nil
	}
	switch {
	case nKey+nTenant != 1:
		// None, or several identities: which would a log believe?
		q.unauthenticated = true
	case nKey == 1:
		var ok bool
		if q.tenant, ok = lookupKey(snap, key); !ok {
			q.unauthenticated = true
		}
	default:
		if !g.cfg.RLSTrustTenant || regions.ValidateID("tenant", tenant) != nil {
			q.unauthenticated = true
		}
		q.tenant = tenant
	}
	if q.unauthenticated {
		return q, nil
	}
	hits := uint64(reqHits)
	if d.GetHitsAddend() != nil {
		hits = d.GetHitsAddend().GetValue()
	}
	q.cost = q.rt.cost.Fixed
	if q.cost == 0 {
		q.cost = 1
	}
	if hits > 0 {
		if hits > MaxCost || (q.rt.cost.Max > 0 && int64(hits) > q.rt.cost.Max) {
			q.refused = true
			return q, nil
		}
		q.cost = int64(hits)
	}
	q.value, q.refused = rlsValue(q.rt.limitBy, entries)
	return q, nil
}

// rlsValue finds the limit_by value of a descriptor: remote_address for client_ip (as
// the unauthenticated guard counts clients: an IPv4 address or an IPv6 /64), the entry
// named like the header for header:NAME (case-insensitively, '_' for '-'), the named
// entry for descriptor:NAME. refused when the value is missing, repeated, empty, too
// long or, for an address, not one.
func rlsValue(lb limitBy, entries []*rlcommon.RateLimitDescriptor_Entry) (value string, refused bool) {
	if lb.kind == limitByNone {
		return "", false
	}
	n := 0
	for _, e := range entries {
		var match bool
		switch lb.kind {
		case limitByClientIP:
			match = e.GetKey() == entryRemoteAddress
		case limitByHeader:
			match = sameHeaderName(e.GetKey(), lb.name)
		case limitByDescriptor:
			match = e.GetKey() == lb.name
		}
		if match {
			value, n = e.GetValue(), n+1
		}
	}
	if n != 1 || value == "" || len(value) > limiter.MaxValueLen {
		return "", true
	}
	if lb.kind == limitByClientIP {
		a, err := netip.ParseAddr(value)
		if err != nil || a.Zone() != "" {
			return "", true
		}
		value = clientKey(a.Unmap()).String()
	}
	return value, false
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
