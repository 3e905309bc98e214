package gateway

import (
	"context"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/quotaplane/quotaplane/regions"
)

// The reverse proxy door: clients talk to the gateway, which admits and decides each
// request (admit.go, decide.go) and forwards what it allows to the route's upstream.

// route is one configured route as the doors see it.
type route struct {
	id       string
	match    string // routes[].match as written, the r.Pattern the observer reads
	proxy    *httputil.ReverseProxy
	counters *routeCounters
	cost     CostConfig
	limitBy  limitBy
	perValue *PerValueConfig // each limit_by value's bucket; nil: the rule's size
	// settles are the proxy door's settle counters of a route with
	// cost.response_header (nil without); the logged flags say a malformed or capped
	// response cost has been logged once. rlsSettles are the RLS door's, on first use.
	settles                       *settleCounters
	malformedLogged, cappedLogged atomic.Bool
	rlsSettlesOnce                sync.Once
	rlsSettles                    *settleCounters
}

// newRoutes builds the routes, their reverse proxies and the route table of both HTTP
// doors, and the proxy's handler: /v1/check (unless disabled) and every other path.
func (g *Gateway) newRoutes() error {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = 1024
	transport.MaxIdleConnsPerHost = 256
	transport.ResponseHeaderTimeout = 0 // the upstream's business; the client may cancel
	g.transport = transport

	doors := g.doors()
	t := &routeTable{rules: g.cfg.Routing.rules(), byID: make(map[string]*route, len(g.cfg.Routes))}
	list := make([]*route, len(g.cfg.Routes))
	for i, rc := range g.cfg.Routes {
		target, err := url.Parse(rc.Upstream)
		if err != nil {
			return &ConfigError{File: g.cfg.file, Key: "routes.upstream", Reason: redactedReason(err, rc.Upstream)}
		}
		lb, _ := parseLimitBy(rc.LimitBy, rc.LimitByCase) // normalize has checked it
		rt := &route{
			id:       rc.ID,
			match:    rc.Match,
			counters: g.m.newRouteCounters(g.cfg.Region, rc.ID, doors...),
			cost:     rc.Cost,
			limitBy:  lb,
			perValue: rc.PerValue,
		}
		if rc.Cost.ResponseHeader != "" {
			rt.settles = g.m.newSettleCounters(rc.ID, doorProxy)
		}
		rt.proxy = g.newReverseProxy(rt, target, transport)
		list[i] = rt
		t.byID[rc.ID] = rt
	}
	mux, err := newRouteMux(g.cfg.Routes, t.rules, func(i int) http.Handler { return matched{list[i]} })
	if err != nil {
		return err // normalize has built the same table
	}
	t.mux = mux
	// Requests no route matches are counted (when unauthenticated) as route _unmatched;
	// the RLS and check doors decide requests that name "*" under the "*" rule.
	t.none = &route{id: routeUnmatched, counters: &routeCounters{}}
	for _, d := range doors {
		t.none.counters[d][decUnauthenticated][srcNone] = g.m.requests.WithLabelValues(
			g.cfg.Region, routeUnmatched, decisionNames[decUnauthenticated], sourceNames[srcNone], doorNames[d])
	}
	if len(doors) > 1 {
		t.star = &route{id: regions.Wildcard, counters: g.m.newRouteCounters(g.cfg.Region, regions.Wildcard, doors[1:]...)}
	}
	switch u := g.cfg.Routing.Unmatched; u {
	case routingRefuse:
	case regions.Wildcard:
		t.unmatched = t.star
	default:
		t.unmatched = t.byID[u]
	}
	g.routes = t

	checkOn := !g.cfg.Check.Disabled
	g.handler = g.obs.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if checkOn && r.URL.Path == checkPath {
			g.serveCheck(w, r)
			return
		}
		g.serveProxy(w, r)
	}))
	return nil
}

// newReverseProxy is rt's reverse proxy to target.
func (g *Gateway) newReverseProxy(rt *route, target *url.URL, transport http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			if len(g.trusted) > 0 {
				// Behind trusted proxies the upstream learns the client they vouch for,
				// then the proxy (SetXForwarded appends the peer).
				if c := g.trusted.clientAddr(pr.In); c.IsValid() && c != peerAddr(pr.In) {
					pr.Out.Header["X-Forwarded-For"] = []string{c.String()}
				}
			}
			pr.SetXForwarded()
			// The key stays at the edge; the upstream learns the tenant instead. Set on
			// the outbound request only: the inbound one's Connection header has been
			// applied already, so "Connection: X-Tenant-Id" cannot remove it.
			stripHeaders(pr.Out.Header, g.auth.identity)
			if tenant, ok := pr.In.Context().Value(tenantKey{}).(string); ok {
				pr.Out.Header[hdrTenant] = []string{tenant}
			}
		},
		Transport:      g.obs.transport(rt.id, transport),
		BufferPool:     proxyBuffers,
		ModifyResponse: g.modifyResponse(rt),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			g.obs.upstreamFailed(r, rt.id, err)
			problemUpstream.write(w)
		},
	}
}

// modifyResponse is rt's ModifyResponse: the upstream's rate headers stripped, and with
// cost.response_header the response's real cost settled (settle.go).
func (g *Gateway) modifyResponse(rt *route) func(*http.Response) error {
	if rt.cost.ResponseHeader == "" {
		return stripUpstreamRateHeaders
	}
	return func(res *http.Response) error {
		g.settleResponse(rt, res)
		return stripUpstreamRateHeaders(res)
	}
}

// doors are the interfaces this gateway decides requests for: the proxy, and RLS and
// the check endpoint when they are on.
func (g *Gateway) doors() []door {
	d := []door{doorProxy}
	if g.cfg.RLSListen != "" {
		d = append(d, doorRLS)
	}
	if !g.cfg.Check.Disabled {
		d = append(d, doorCheck)
	}
	return d
}

// serveProxy is the hot path of one proxied request: the route its path names under
// the routing rules, the one admission path, the decision, and the upstream. A request
// no route matches is authenticated like any other, then answered 404: the proxy
// forwards only what it matched.
func (g *Gateway) serveProxy(w http.ResponseWriter, r *http.Request) {
	target := r.RequestURI
	if target == "" {
		target = r.URL.RequestURI() // a request built in code rather than read by a server
	}
	rt, out := g.routes.lookup(doorProxy, r.Method, r.Host, target)
	if out == outMatched {
		r.Pattern = rt.match // what the observer labels the request by, as ServeMux would set it
	}
	c := claim{door: doorProxy, rt: rt, outcome: out, client: clientKey(g.trusted.clientAddr(r)), keys: g.auth.keys(r.Header)}
	readHTTPFields(&c, r.Header)
	a := g.admit(r.Context(), g.snap.Load(), &c)
	if a.refused != admitted {
		g.auth.problems.write(w, a)
		return
	}
	v, ok := g.decide(r.Context(), a.ask)
	if !ok {
		return // the client is gone; there is no one to answer
	}
	if v.advertised {
		v.hdr.write(w.Header())
	}
	if v.dec == decThrottled {
		problemThrottled.write(w)
		return
	}
	noteForwarded(r, a.tenant)
	ctx := context.WithValue(r.Context(), tenantKey{}, a.tenant)
	if v.settleable && rt.cost.ResponseHeader != "" {
		// Admitted on an estimate: the response's real cost is settled against the
		// request exactly as decided.
		ctx = context.WithValue(ctx, settleKey{}, &pendingSettle{req: v.req})
	}
	rt.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// readHTTPFields reads the claim's cost and limit_by value from an HTTP request's
// headers (the proxied request's, or the check request's).
func readHTTPFields(c *claim, h http.Header) {
	if c.rt.cost.Header != "" {
		c.costs = headerValues(h, c.rt.cost.Header)
	}
	if c.rt.limitBy.kind == limitByHeader {
		c.values = headerValues(h, c.rt.limitBy.name)
	}
}

// tenantKey carries the authenticated tenant from serveProxy to the proxy's Rewrite.
type tenantKey struct{}

// proxyBuffers lends the reverse proxies the buffers they copy response bodies through.
// Without a pool, ReverseProxy allocates 32 KB per proxied request: most of the bytes a
// request allocated, and so most of the garbage collector's work (docs/BENCHMARKS.md,
// "Profiles").
var proxyBuffers httputil.BufferPool = &bufferPool{}

type bufferPool struct{ p sync.Pool }

const proxyBufferSize = 32 << 10 // ReverseProxy's own size

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, proxyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == proxyBufferSize {
		b.p.Put(&buf)
	}
}

// stripUpstreamRateHeaders drops every rate-limit header an upstream sent (RateLimit*,
// X-RateLimit-*): the gateway's own, set before forwarding, are the ones that describe
// the client's limit, and a client must not read two.
func stripUpstreamRateHeaders(res *http.Response) error {
	for name := range res.Header {
		if isRateHeader(name) {
			delete(res.Header, name)
		}
	}
	return nil
}
