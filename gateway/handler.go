package gateway

import (
	"crypto/sha256"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/regions"
)

// maxKeyLen bounds the X-Api-Key value the gateway hashes; longer keys are unknown.
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
	for _, rc := range g.cfg.Routes {
		target, err := url.Parse(rc.Upstream)
		if err != nil {
			return &ConfigError{File: g.cfg.file, Key: "routes.upstream", Reason: redactedReason(err, rc.Upstream)}
		}
		rt := &route{
			id:       rc.ID,
			counters: g.m.newRouteCounters(g.cfg.Region, rc.ID),
			upErrs:   g.m.upstreamErrors.WithLabelValues(rc.ID),
		}
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
				// The key stays at the edge; the upstream learns the tenant instead. The
				// inbound X-Tenant-Id was already replaced by the gateway's own (serve).
				delete(pr.Out.Header, hdrAPIKey)
			},
			Transport:      transport,
			BufferPool:     proxyBuffers,
			ModifyResponse: stripUpstreamRateHeaders,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if r.Context().Err() == nil {
					rt.upErrs.Inc()
					g.log.Debug("upstream failed", "region", g.cfg.Region, "route", rt.id, "err", err)
				}
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
	un.counters[decUnauthenticated][srcNone] = g.m.requests.WithLabelValues(
		g.cfg.Region, routeUnmatched, decisionNames[decUnauthenticated], sourceNames[srcNone])
	_ = registerPattern(mux, "/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.serveUnmatched(w, r, un)
	}))
	g.handler = mux
	return nil
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
// over-long one; 400 for more than one X-Api-Key header (which key would an upstream or
// a log believe?); 503 before the first snapshot; 429 for a client that has used up its
// unauthenticated_limit, decided before the key is looked up (see clientGuard).
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request, rt *route) (*regions.Snapshot, string, bool) {
	var client netip.Addr
	if g.guard != nil {
		client = clientKey(g.trusted.clientAddr(r))
		if retry, blocked := g.guard.blocked(client); blocked {
			g.refuse(w, r, rt, client, nil, retry)
			return nil, "", false
		}
	}
	vals := r.Header[hdrAPIKey]
	switch {
	case len(vals) > 1: // even if some are empty (found by FuzzAPIKeyHeader)
		g.refuse(w, r, rt, client, problemManyKeys, 0)
		return nil, "", false
	case len(vals) == 0 || vals[0] == "":
		g.refuse(w, r, rt, client, problemMissingKey, 0)
		return nil, "", false
	}
	snap := g.snap.Load()
	if snap == nil {
		problemNotReady.write(w)
		return nil, "", false
	}
	key := vals[0]
	var tenant string
	ok := len(key) <= maxKeyLen
	if ok {
		tenant, ok = snap.Tenant(hashKey(key))
	}
	if !ok {
		g.refuse(w, r, rt, client, problemBadKey, 0)
		return nil, "", false
	}
	return snap, tenant, true
}

// refuse answers a request that did not authenticate with p, counted as unauthenticated;
// with the per-client limit on it also takes one of the client's attempts, and answers
// 429 instead when none is left. A nil p means the client is already blocked.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, rt *route, client netip.Addr, p *problem, retry time.Duration) {
	rt.counters[decUnauthenticated][srcNone].Inc()
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
	snap, tenant, ok := g.authenticate(w, r, rt)
	if !ok {
		return
	}
	rule, lim, _ := snap.RegionalRule(g.cfg.Region, tenant, rt.id)
	start := time.Now()
	d, err := g.lim.Decide(r.Context(), limiter.Request{Tenant: tenant, Route: rt.id, Limit: lim, Cost: 1, Shards: rule.Shards})
	elapsed := time.Since(start)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client is gone; there is no one to answer
		}
		// Could not decide: let the request through (fail open) and count it. The
		// client sees no limit headers rather than made-up ones.
		g.m.decisionErrors.Inc()
		g.m.duration[srcNone].Observe(elapsed.Seconds())
		rt.counters[decAllowed][srcNone].Inc()
		g.tenants.count(tenant, rt.id, decAllowed)
		g.log.Debug("limiter failed; request let through", "region", g.cfg.Region, "tenant", tenant, "route", rt.id, "err", err)
		g.forward(w, r, rt, tenant)
		return
	}
	src := parseSource(string(d.Source))
	g.m.duration[src].Observe(elapsed.Seconds())
	dec := decAllowed
	if !d.Allowed {
		dec = decThrottled
		if rule.Shadow {
			dec = decShadowThrottled
		}
	}
	rt.counters[dec][src].Inc()
	g.tenants.count(tenant, rt.id, dec)

	// A shadow rule is not enforced, so it is not advertised either: a client must not
	// slow down for a limit that is only being measured.
	if !rule.Shadow {
		refill := lim.RefillPerSecond
		if lim.Capacity > 0 && d.Limit != lim.Capacity {
			refill *= float64(d.Limit) / float64(lim.Capacity) // the fallback's 1/N bucket
		}
		newRateHeaders(d.Limit, refill, d.Remaining, d.ResetAfter, d.RetryAfter, !d.Allowed).write(w.Header())
	}
	if dec == decThrottled {
		problemThrottled.write(w)
		return
	}
	g.forward(w, r, rt, tenant)
}

// forward proxies to the route's upstream with X-Tenant-Id set to the authenticated
// tenant; any client-sent X-Tenant-Id is replaced, never passed on.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, rt *route, tenant string) {
	r.Header[hdrTenant] = []string{tenant}
	rt.proxy.ServeHTTP(w, r)
}

// serveUnmatched answers requests no route matches: 401 like any other without a valid
// key, 404 with one. Nothing is limited and no tenant series is touched.
func (g *Gateway) serveUnmatched(w http.ResponseWriter, r *http.Request, rt *route) {
	if _, _, ok := g.authenticate(w, r, rt); !ok {
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
