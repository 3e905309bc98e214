package gateway

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/regions"
)

// maxKeyLen bounds the API key the gateway hashes; longer keys are unknown.
const maxKeyLen = 256

// newHandler builds the proxy handler: a ServeMux with one handler per route and a
// fallback for requests no route matches.
func (g *Gateway) newHandler() error {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = 1024
	transport.MaxIdleConnsPerHost = 256
	transport.ResponseHeaderTimeout = 0 // the upstream's business; the client may cancel
	g.transport = transport

	mux := http.NewServeMux()
	g.routes = make(map[string]*route, len(g.cfg.Routes))
	g.byPattern = make(map[string]*route, len(g.cfg.Routes))
	for _, rc := range g.cfg.Routes {
		target, err := url.Parse(rc.Upstream)
		if err != nil {
			return &ConfigError{File: g.cfg.file, Key: "routes.upstream", Reason: redactedReason(err, rc.Upstream)}
		}
		lb, _ := parseLimitBy(rc.LimitBy) // normalize has checked it
		rt := &route{
			id:       rc.ID,
			counters: g.m.newRouteCounters(g.cfg.Region, rc.ID, g.doors()...),
			cost:     rc.Cost,
			limitBy:  lb,
		}
		g.routes[rc.ID] = rt
		g.byPattern[rc.Match] = rt
		rt.proxy = &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				if len(g.trusted) > 0 {
					// Behind trusted proxies the upstream learns the client they vouch
					// for, then the proxy (SetXForwarded appends the peer).
					if c := g.trusted.clientAddr(pr.In); c.IsValid() && c != peerAddr(pr.In) {
						pr.Out.Header["X-Forwarded-For"] = []string{c.String()}
					}
				}
				pr.SetXForwarded()
				// The key stays at the edge; the upstream learns the tenant instead. Set on
				// the outbound request only: the inbound one's Connection header has been
				// applied already, so "Connection: X-Tenant-Id" cannot remove it.
				g.stripIdentity(pr.Out.Header)
				if tenant, ok := pr.In.Context().Value(tenantKey{}).(string); ok {
					pr.Out.Header[hdrTenant] = []string{tenant}
				}
			},
			Transport:      g.upstreamTransport(rc.ID, transport),
			BufferPool:     proxyBuffers,
			ModifyResponse: stripUpstreamRateHeaders,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				g.upstreamFailed(r, rt.id, err)
				problemUpstream.write(w)
			},
		}
		mux.Handle(rc.Match, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g.serve(w, r, rt)
		}))
	}
	// Requests no route matches: authenticated like any other, then 404. A route whose
	// pattern already covers every request ("/") leaves nothing unmatched, and then
	// registering the fallback fails; that is fine.
	un := &route{id: routeUnmatched}
	un.counters = &routeCounters{}
	un.counters[doorProxy][decUnauthenticated][srcNone] = g.m.requests.WithLabelValues(
		g.cfg.Region, routeUnmatched, decisionNames[decUnauthenticated], sourceNames[srcNone], doorNames[doorProxy])
	_ = registerPattern(mux, "/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.serveUnmatched(w, r, un)
	}))
	g.mux = mux
	var h http.Handler = mux
	// The RLS service and the check endpoint decide requests that match no route under
	// the "*" rule, counted as route "*".
	if doors := g.doors()[1:]; len(doors) > 0 {
		g.anyRoute = &route{id: regions.Wildcard, counters: g.m.newRouteCounters(g.cfg.Region, regions.Wildcard, doors...)}
	}
	if !g.cfg.Check.Disabled {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == checkPath {
				g.serveCheck(w, r)
				return
			}
			mux.ServeHTTP(w, r)
		})
	}
	g.handler = g.observeRequests(h)
	return nil
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

// stripUpstreamRateHeaders drops rate-limit headers an upstream sent: the gateway's own,
// set before forwarding, are the ones that describe the client's limit.
func stripUpstreamRateHeaders(res *http.Response) error {
	h := res.Header
	if len(h) == 0 {
		return nil
	}
	delete(h, hdrLimit)
	delete(h, hdrRemaining)
	delete(h, hdrPolicy)
	delete(h, hdrRateLimit)
	return nil
}

// authenticate resolves the request's key to a tenant, or writes the refusal and returns
// ok false. It never touches Redis. Refusals: 401 for no key or an unknown, revoked or
// over-long one; 400 for more than one key (which key would an upstream or a log
// believe?); 503 before the first snapshot; 429 for a client that has used up its
// unauthenticated_limit, decided before the key is looked up (see clientGuard).
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request, rt *route, d door) (*regions.Snapshot, string, bool) {
	var client netip.Addr
	if g.guard != nil {
		client = clientKey(g.trusted.clientAddr(r))
		if retry, blocked := g.guard.blocked(client); blocked {
			g.refuse(w, r, rt, d, client, nil, retry)
			return nil, "", false
		}
	}
	key, p := g.readKey(r.Header)
	if p != nil {
		g.refuse(w, r, rt, d, client, p, 0)
		return nil, "", false
	}
	snap := g.snap.Load()
	if snap == nil {
		problemNotReady.write(w)
		return nil, "", false
	}
	tenant, ok := lookupKey(snap, key)
	if !ok {
		g.refuse(w, r, rt, d, client, problemBadKey, 0)
		return nil, "", false
	}
	return snap, tenant, true
}

// readKey finds the one API key of a request: the value of auth.key_header, or with
// auth.bearer the token of "Authorization: Bearer <key>". p is the refusal when there
// is none (401) or more than one (400).
func (g *Gateway) readKey(h http.Header) (key string, p *problem) {
	vals := h[g.cfg.Auth.KeyHeader]
	var auth []string
	if g.cfg.Auth.Bearer {
		auth = h["Authorization"]
	}
	switch {
	case len(vals)+len(auth) > 1: // even if some are empty (found by FuzzAPIKeyHeader)
		return "", g.problems.manyKeys
	case len(vals) == 1 && vals[0] != "":
		return vals[0], nil
	case len(auth) == 1:
		if token, ok := bearerToken(auth[0]); ok {
			return token, nil
		}
	}
	return "", g.problems.missingKey
}

// bearerToken is the token of an RFC 6750 "Bearer <token>" credential; the scheme is
// case-insensitive.
func bearerToken(v string) (string, bool) {
	const scheme = "bearer "
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	token := strings.TrimLeft(v[len(scheme):], " ")
	return token, token != ""
}

// lookupKey resolves a presented key to its tenant: false for an unknown, revoked or
// over-long key.
func lookupKey(snap *regions.Snapshot, key string) (string, bool) {
	if key == "" || len(key) > maxKeyLen {
		return "", false
	}
	return snap.Tenant(hashKey(key))
}

// refuse answers a request that did not authenticate with p, counted as unauthenticated;
// with the per-client limit on it also takes one of the client's attempts, and answers
// 429 instead when none is left. A nil p means the client is already blocked.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, rt *route, d door, client netip.Addr, p *problem, retry time.Duration) {
	rt.counters[d][decUnauthenticated][srcNone].Inc()
	if p != nil && g.guard != nil {
		if wait, ok := g.guard.fail(r.Context(), client); !ok {
			p, retry = nil, wait
		}
	}
	if p == nil {
		g.m.unauthThrottled.Inc()
		writeGuardRefusal(w, retry)
		return
	}
	p.write(w)
}

// hashKey is regions.HashKey without a heap copy of the key.
func hashKey(key string) regions.KeyHash {
	var buf [maxKeyLen]byte
	return sha256.Sum256(append(buf[:0], key...))
}

// serve is the hot path of one routed request.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, rt *route) {
	snap, tenant, ok := g.authenticate(w, r, rt, doorProxy)
	if !ok {
		return
	}
	cost, value, p := g.costAndValue(r, rt)
	if p != nil {
		p.write(w)
		return
	}
	v, ok := g.decide(r.Context(), ask{door: doorProxy, snap: snap, tenant: tenant, rt: rt, cost: cost, value: value})
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
	g.forward(w, r, rt, tenant)
}

// tenantKey carries the authenticated tenant from serve to the proxy's Rewrite.
type tenantKey struct{}

// forward proxies to the route's upstream with X-Tenant-Id set to the authenticated
// tenant (in Rewrite); any client-sent X-Tenant-Id, under any spelling, is dropped.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, rt *route, tenant string) {
	noteForwarded(r, tenant)
	rt.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
}

// stripIdentity deletes every header whose name normalises (case-insensitively, with '_'
// taken for '-') to the tenant header or to a header that carries the API key. Upstreams
// built on CGI, WSGI or PHP fold "X-Tenant_Id" and "X-Tenant-Id" into one variable, so
// either spelling from a client could pose as the gateway's own.
func (g *Gateway) stripIdentity(h http.Header) {
	for name := range h {
		if g.identityHeader(name) {
			delete(h, name)
		}
	}
}

// identityHeader reports whether name is, normalised, one of the identity headers.
func (g *Gateway) identityHeader(name string) bool {
	for _, id := range g.identityHeaders {
		if sameHeaderName(name, id) {
			return true
		}
	}
	return false
}

// sameHeaderName compares header names ignoring ASCII case and treating '_' as '-'.
func sameHeaderName(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == '_' {
			x = '-'
		}
		if y == '_' {
			y = '-'
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// serveUnmatched answers requests no route matches: 401 like any other without a valid
// key, 404 with one. Nothing is limited and no tenant series is touched.
func (g *Gateway) serveUnmatched(w http.ResponseWriter, r *http.Request, rt *route) {
	if _, _, ok := g.authenticate(w, r, rt, doorProxy); !ok {
		return
	}
	g.m.unmatched.Inc()
	problemNotFound.write(w)
}

// newAdminHandler serves /metrics, /healthz (alive) and /readyz (a snapshot is loaded
// and the gateway is not draining).
func (g *Gateway) newAdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.gatherer, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch {
		case g.draining.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("draining\n"))
		case g.snap.Load() == nil:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("no snapshot loaded yet\n"))
		default:
			_, _ = w.Write([]byte("ready\n"))
		}
	})
	return mux
}
