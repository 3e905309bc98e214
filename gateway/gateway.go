package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// decider is the limiter as the gateway uses it: *limiter.Redis or *limiter.Local.
type decider interface {
	Decide(ctx context.Context, r limiter.Request) (limiter.Decision, error)
	Close()
}

// Options are the gateway's dependencies. The zero value works: logs are discarded and
// metrics go to a registry of the gateway's own, served on /metrics.
type Options struct {
	// Logger receives lifecycle events and state changes; nil discards. Requests are
	// logged at Debug only.
	Logger *slog.Logger
	// Registerer receives the gateway's and the limiter's metrics; nil means a new
	// registry. Gatherer is what /metrics serves; nil means Registerer, which must then
	// be a Gatherer too (a *prometheus.Registry): a wrapped Registerer needs the
	// Gatherer of the registry it wraps, or /metrics would not show the gateway's series.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Now is the clock for share expiry; nil means time.Now.
	Now func() time.Time
}

// Gateway is one region gateway: the proxy handler, the admin handler and, in Run, the
// snapshot reloader and heartbeats.
type Gateway struct {
	cfg        Config
	log        *slog.Logger
	gatherer   prometheus.Gatherer
	registerer prometheus.Registerer
	now        func() time.Time
	m          *metrics
	tenants    *tenantTracker
	instanceID string

	snap atomic.Pointer[regions.Snapshot]
	// readyMu makes "not draining, so ready" and "draining, so not ready" one step each:
	// a reload racing the drain cannot set ratelimit_gateway_ready back to 1.
	readyMu  sync.Mutex
	draining atomic.Bool
	// emptySnapshot: the last database snapshot had no region rows (acceptSnapshot).
	emptySnapshot atomic.Bool

	lim      decider
	obs      *observer   // proxy metrics, upstream error log, access log (observe.go)
	fallback func() bool // reports the Redis breaker not closed; nil without Redis
	// loadScripts is the Redis limiter's Load (scripts, maxmemory-policy check); nil
	// without Redis.
	loadScripts func(context.Context) error
	// checkEviction is the Redis limiter's CheckEviction; nil without Redis.
	checkEviction func(context.Context)
	guard         *clientGuard // nil when unauthenticated_limit is disabled
	trusted       trustedProxies
	rdb           redis.UniversalClient // *redis.Client, or *redis.ClusterClient with redis.cluster

	// identityHeaders are the header names stripped from every proxied request under
	// any spelling: the tenant header and the headers that carry the key.
	identityHeaders []string
	problems        keyProblems

	handler   http.Handler
	routes    *routeTable // the routes, matched by both HTTP doors and named by RLS
	admin     http.Handler
	transport *http.Transport // to the upstreams

	rlsLn net.Listener       // rls_listen, opened by Run
	drain context.CancelFunc // ends drainCtx's context when draining starts

	store *store.Store // database mode: opened by Run (it dials on first use)
}

// New validates cfg, fills its defaults and builds the gateway. It starts no goroutine of
// its own and opens nothing to the database (Run opens the store). It does build the
// Redis client, and go-redis's pool opens its warm connections (MinIdleConns) in the
// background at once; a Redis that is down costs nothing here, the limiter falls back.
// A standalone gateway's handler works at once; a database one answers 503 until Run has
// loaded a snapshot.
func New(cfg Config, opts Options) (_ *Gateway, err error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	g := &Gateway{
		cfg:        cfg,
		log:        opts.Logger,
		registerer: opts.Registerer,
		gatherer:   opts.Gatherer,
		now:        opts.Now,
		instanceID: cfg.InstanceID,
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.registerer == nil {
		g.registerer = prometheus.NewRegistry()
	}
	if g.gatherer == nil {
		ga, ok := g.registerer.(prometheus.Gatherer)
		if !ok {
			return nil, fmt.Errorf("gateway %s: Options.Gatherer is required: the Registerer (%T) is not a prometheus.Gatherer", cfg.Region, g.registerer)
		}
		g.gatherer = ga
	}
	if g.instanceID == "" {
		g.instanceID = defaultInstanceID()
	} else if err := regions.ValidateID("instance", g.instanceID); err != nil {
		return nil, &ConfigError{File: cfg.file, Key: "instance_id", Reason: unwrapInvalid(err)}
	}

	if g.trusted, err = newTrustedProxies(cfg.TrustedProxies); err != nil {
		return nil, &ConfigError{File: cfg.file, Key: "trusted_proxies", Reason: err.Error()}
	}
	if !cfg.UnauthenticatedLimit.Disabled {
		if g.guard, err = newClientGuard(cfg.UnauthenticatedLimit, g.now); err != nil {
			return nil, fmt.Errorf("gateway %s: unauthenticated limit: %w", cfg.Region, err)
		}
	}
	// Whatever New registers or opens from here on is undone if it fails, so a caller
	// can fix the config and call New again on the same registry.
	tracked := &trackingRegisterer{Registerer: g.registerer}
	g.registerer = tracked
	defer func() {
		if err != nil {
			if g.rdb != nil {
				_ = g.rdb.Close()
			}
			if g.transport != nil {
				g.transport.CloseIdleConnections()
			}
			tracked.unregisterAll()
		}
	}()
	m, err := newMetrics(g.registerer, cfg.Region, g.decisionBounds())
	if err != nil {
		return nil, fmt.Errorf("gateway %s: register metrics: %w", cfg.Region, err)
	}
	g.m = m
	if g.obs, err = newObserver(g.registerer, m, &g.cfg, g.log, g.now, g.trusted); err != nil {
		return nil, fmt.Errorf("gateway %s: register metrics: %w", cfg.Region, err)
	}
	g.tenants = newTenantTracker(m, cfg.Region, cfg.Metrics.MaxTenants, g.pairShare)

	if err := g.newLimiter(); err != nil {
		return nil, err
	}
	g.identityHeaders = []string{hdrTenant, g.cfg.Auth.KeyHeader}
	if g.cfg.Auth.Bearer {
		g.identityHeaders = append(g.identityHeaders, "Authorization")
	}
	g.problems = newKeyProblems(g.cfg.Auth)
	if err := g.newRoutes(); err != nil {
		return nil, err
	}
	g.admin = g.newAdminHandler()

	if cfg.Standalone() {
		s, err := standaloneSnapshot(&g.cfg, g.now())
		if err != nil {
			return nil, &ConfigError{File: cfg.file, Key: "tenants", Reason: err.Error()}
		}
		g.setSnapshot(s)
	}
	return g, nil
}

// Handler is the proxy: routing, authentication, limiting, headers, forwarding.
func (g *Gateway) Handler() http.Handler { return g.handler }

// AdminHandler serves /metrics, /healthz and /readyz.
func (g *Gateway) AdminHandler() http.Handler { return g.admin }

// Config is the validated configuration with defaults filled in.
func (g *Gateway) Config() Config { return g.cfg }

// InstanceID is this instance's heartbeat id.
func (g *Gateway) InstanceID() string { return g.instanceID }

// Ready reports whether a snapshot is loaded and the gateway is not draining.
func (g *Gateway) Ready() bool { return g.snap.Load() != nil && !g.draining.Load() }

func (g *Gateway) newLimiter() error {
	if !g.cfg.Redis.enabled() {
		l, err := limiter.NewLocal(limiter.LocalOptions{Region: g.cfg.Region, Registerer: g.registerer})
		if err != nil {
			return fmt.Errorf("gateway %s: local limiter: %w", g.cfg.Region, err)
		}
		g.lim = l
		return nil
	}
	rdb, err := g.newRedisClient()
	if err != nil {
		return err
	}
	g.rdb = rdb
	opts := limiter.Options{
		Region:    g.cfg.Region,
		Timeout:   g.cfg.Redis.Timeout,
		KeyPrefix: g.cfg.Redis.KeyPrefix,
		Breaker: limiter.BreakerOptions{
			Failures:    g.cfg.Redis.Breaker.Failures,
			FailureSpan: g.cfg.Redis.Breaker.FailureSpan,
			OpenFor:     g.cfg.Redis.Breaker.OpenFor,
		},
		Instances:         g.fallbackInstances,
		ExpectedInstances: g.cfg.ExpectedInstances,
		ChangedAt:         g.changedAt,
		Registerer:        g.registerer,
		Logger:            g.log,
	}
	setLeases(&opts, g.cfg.Leases)
	l, err := limiter.NewRedis(g.rdb, opts)
	if err != nil {
		return fmt.Errorf("gateway %s: redis limiter: %w", g.cfg.Region, err) // New closes g.rdb
	}
	g.lim = l
	g.loadScripts = l.Load
	g.checkEviction = l.CheckEviction
	g.fallback = l.FallbackActive
	return nil
}

// setLeases maps the leases config onto the limiter's options; zero values take the
// limiter's defaults, a zero threshold leaves leases off.
func setLeases(o *limiter.Options, l LeasesConfig) {
	o.Leases.Threshold = l.Threshold
	o.Leases.Fraction = l.Fraction
	o.Leases.TTL = l.TTL
}

// warmConns connections are kept open to Redis (per node of a cluster), one per pipeline
// the limiter may have in flight, so the first burst after a start or an idle spell
// does not pay for dials within the decision timeout (and get fallback decisions).
const warmConns = limiter.DefaultPipelineInFlight

// newRedisClient is the client of redis.url: one server, or a Redis Cluster's client with
// redis.cluster. Either way a dead Redis must not hold a request past the decision
// timeout: the limiter bounds every call by its own timeout through the context, and
// these keep a connection attempt or a pool slot from lasting long either.
func (g *Gateway) newRedisClient() (redis.UniversalClient, error) {
	dial := max(10*g.cfg.Redis.Timeout, 100*time.Millisecond)
	if g.cfg.Redis.Sentinel.configured() {
		return g.newSentinelClient(dial)
	}
	if g.cfg.Redis.Cluster {
		co, err := redis.ParseClusterURL(g.cfg.Redis.URL)
		if err != nil {
			return nil, &ConfigError{File: g.cfg.file, Key: "redis.url", Reason: redactedReason(err, g.cfg.Redis.URL)}
		}
		co.ContextTimeoutEnabled = true
		co.DialTimeout = dial
		co.MaxRetries = -1 // a retry would double the latency bound; the fallback answers instead
		if co.MinIdleConns == 0 {
			co.MinIdleConns = warmConns
		}
		if co.MaxRedirects == 0 {
			// A MOVED or ASK answer costs a round trip within the decision timeout; after
			// one the client reloads the slot map, so two is plenty.
			co.MaxRedirects = 2
		}
		if co.TLSConfig != nil {
			if err := g.cfg.Redis.TLS.apply(co.TLSConfig); err != nil {
				return nil, &ConfigError{File: g.cfg.file, Key: "redis.tls", Reason: err.Error()}
			}
		}
		return redis.NewClusterClient(co), nil
	}
	ro, err := redis.ParseURL(g.cfg.Redis.URL)
	if err != nil {
		return nil, &ConfigError{File: g.cfg.file, Key: "redis.url", Reason: redactedReason(err, g.cfg.Redis.URL)}
	}
	ro.ContextTimeoutEnabled = true
	ro.DialTimeout = dial
	ro.MaxRetries = -1 // a retry would double the latency bound; the fallback answers instead
	if ro.MinIdleConns == 0 {
		ro.MinIdleConns = warmConns
	}
	if ro.TLSConfig != nil {
		if err := g.cfg.Redis.TLS.apply(ro.TLSConfig); err != nil {
			return nil, &ConfigError{File: g.cfg.file, Key: "redis.tls", Reason: err.Error()}
		}
	}
	return redis.NewClient(ro), nil
}

// liveInstances is the fallback divisor: live gateways of this region, 0 when unknown.
func (g *Gateway) liveInstances() int {
	if s := g.snap.Load(); s != nil {
		return s.LiveInstances(g.cfg.Region)
	}
	return 0
}

// pairShare is a tracked (tenant, route) pair's effective share, for the share gauge.
func (g *Gateway) pairShare(tenant, route string) (float64, bool) {
	s := g.snap.Load()
	if s == nil {
		return 0, false
	}
	v, _ := s.Share(g.cfg.Region, tenant, route)
	return v, true
}

// setSnapshot swaps in a new snapshot and updates the gauges that describe it.
func (g *Gateway) setSnapshot(s *regions.Snapshot) {
	// Which tenants' capacities may have been raised since the last snapshot, and when:
	// the limiter's fallback starts a bucket it holds nothing for from the raise, not
	// full at the new size (regions.Snapshot.Since).
	s = s.Since(g.snap.Load(), g.now())
	g.snap.Store(s)
	g.m.rulesLoaded.Set(float64(s.RuleCount()))
	g.m.lastReload.SetToCurrentTime()
	g.m.instances.Set(float64(s.LiveInstances(g.cfg.Region)))
	share, _ := s.Share(g.cfg.Region, regions.Wildcard, regions.Wildcard)
	g.m.shareRatio.WithLabelValues(regions.Wildcard).Set(share)
	g.tenants.refreshShares()
	g.readyMu.Lock()
	if !g.draining.Load() {
		g.m.ready.Set(1)
	}
	g.readyMu.Unlock()
}

// startDraining marks the gateway not ready, for good.
func (g *Gateway) startDraining() {
	g.readyMu.Lock()
	g.draining.Store(true)
	g.m.ready.Set(0)
	g.readyMu.Unlock()
}

// standaloneSnapshot builds the snapshot of a gateway without a database: one region
// (so its share is 1), the default rule, and the tenants' keys and rules. No instances
// are known, so the fallback divides by expected_instances.
func standaloneSnapshot(c *Config, now time.Time) (*regions.Snapshot, error) {
	d := regions.SnapshotData{
		Regions:  []string{c.Region},
		LoadedAt: now,
		Rules: []regions.Rule{{
			Tenant: regions.Wildcard, Route: regions.Wildcard,
			Capacity: c.DefaultRule.Capacity, RefillPerSecond: c.DefaultRule.RefillPerSecond,
			Shadow: c.DefaultRule.Shadow, Shards: c.DefaultRule.Shards,
		}},
	}
	var id int64
	for _, t := range c.Tenants {
		for _, k := range t.Keys {
			h, err := k.hash()
			if err != nil {
				return nil, err // normalize has checked every key
			}
			id++
			d.Keys = append(d.Keys, regions.APIKey{ID: id, Hash: h, Tenant: t.ID, CreatedAt: now})
		}
		for _, r := range t.Rules {
			d.Rules = append(d.Rules, regions.Rule{
				Tenant: t.ID, Route: r.Route, Capacity: r.Capacity, RefillPerSecond: r.RefillPerSecond,
				Shadow: r.Shadow, Shards: r.Shards, UpdatedAt: now,
			})
		}
	}
	return regions.NewSnapshot(d)
}

// defaultInstanceID is host-pid-random, trimmed to a valid id.
func defaultInstanceID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}, host)
	if host == "" {
		host = "gateway"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
	if len(host)+len(suffix) > 64 {
		host = host[:64-len(suffix)]
	}
	return host + suffix
}

// Run serves the proxy on listen and the admin endpoints on admin_listen, reloads the
// snapshot (database mode) and heartbeats, until ctx ends; then it stops accepting,
// lets in-flight requests finish (up to drain_timeout), removes its heartbeat and
// returns after every goroutine it started has exited. A database or Redis that is down
// is not an error: the gateway reports not ready (no snapshot yet) or falls back.
func (g *Gateway) Run(ctx context.Context) error {
	defer g.closeClients()
	if !g.cfg.Standalone() {
		st, err := store.Open(ctx, g.cfg.DatabaseURL) // parses the URL; connects on first use
		if err != nil {
			return fmt.Errorf("gateway %s: %w", g.cfg.Region, err)
		}
		g.store = st
	}
	ln, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway %s: listen: %w", g.cfg.Region, err)
	}
	aln, err := net.Listen("tcp", g.cfg.AdminListen)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("gateway %s: admin listen: %w", g.cfg.Region, err)
	}
	if g.cfg.RLSListen != "" {
		if g.rlsLn, err = net.Listen("tcp", g.cfg.RLSListen); err != nil {
			_ = ln.Close()
			_ = aln.Close()
			return fmt.Errorf("gateway %s: rls listen: %w", g.cfg.Region, err)
		}
	}
	return g.run(ctx, ln, aln)
}

// run is Run on listeners already open; it closes them.
func (g *Gateway) run(ctx context.Context, ln, aln net.Listener) error {
	g.log.Info("gateway starting", "region", g.cfg.Region, "instance", g.instanceID,
		"listen", ln.Addr().String(), "admin_listen", aln.Addr().String(),
		"mode", g.cfg.Mode, "mode_source", g.cfg.modeSource)
	if g.rdb == nil {
		g.log.Warn("no redis configured: limits are enforced per instance, not per region",
			"region", g.cfg.Region)
	} else {
		g.warmRedis(ctx)
	}

	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	if !g.cfg.Standalone() {
		rl := store.NewReloader(store.ReloaderOptions{
			Load: func(ctx context.Context) (*regions.Snapshot, error) {
				return g.store.LoadSnapshot(ctx, g.instanceTTL())
			},
			ListenURL:  g.cfg.DatabaseURL,
			Interval:   g.cfg.ReloadInterval,
			Logger:     g.log,
			Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"region": g.cfg.Region}, g.registerer),
			OnReload:   g.onReload,
			OnError: func(error) {
				g.m.reloadErrors.Inc()
			},
		})
		wg.Go(func() {
			if err := rl.Run(bg); err != nil {
				g.log.Error("snapshot reloader stopped", "region", g.cfg.Region, "err", err)
			}
		})
		wg.Go(func() { g.heartbeat(bg) })
	}
	wg.Go(func() { g.rotateTenants(bg) })
	if g.checkEviction != nil {
		wg.Go(func() { g.watchRedisPolicy(bg) })
	}

	if g.rlsLn != nil {
		rls, rctx := g.newRLSServer(), g.drainCtx(bg)
		g.log.Info("rate limit service listening", "region", g.cfg.Region, "rls_listen", g.rlsLn.Addr().String())
		wg.Go(func() {
			// The RLS door drains with the proxy: it stops when the gateway starts draining.
			if err := g.serveRLS(rctx, rls, g.rlsLn); err != nil {
				g.log.Error("rate limit service stopped", "region", g.cfg.Region, "err", err)
			}
		})
	}

	srv := g.newServer()
	adm := &http.Server{Handler: g.admin, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 2)
	go func() { errc <- serve(srv, ln) }()
	go func() { errc <- serve(adm, aln) }()

	var runErr error
	received := 0 // results taken from errc; both servers send exactly one
	select {
	case <-ctx.Done():
	case err := <-errc:
		received++
		runErr = fmt.Errorf("gateway %s: serve: %w", g.cfg.Region, err)
	}
	g.startDraining()
	if g.drain != nil {
		g.drain()
	}
	g.log.Info("gateway draining", "region", g.cfg.Region, "drain_timeout", g.cfg.DrainTimeout.String())
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.DrainTimeout)
	if err := srv.Shutdown(dctx); err != nil {
		g.log.Warn("drain incomplete; closing remaining connections", "region", g.cfg.Region, "err", err)
		_ = srv.Close()
	}
	cancel()
	stopBG()
	wg.Wait()
	if !g.cfg.Standalone() {
		g.removeInstance(ctx)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	_ = adm.Shutdown(actx)
	cancel()
	// Both Serve calls have returned by now (Shutdown waits for the listener to close);
	// take the results not taken yet, or Run would wait for a value never sent.
	for ; received < 2; received++ {
		if err := <-errc; err != nil && runErr == nil {
			runErr = fmt.Errorf("gateway %s: serve: %w", g.cfg.Region, err)
		}
	}
	g.log.Info("gateway stopped", "region", g.cfg.Region)
	return runErr
}

// drainCtx is a context of parent that also ends when the gateway starts draining.
func (g *Gateway) drainCtx(parent context.Context) context.Context {
	ctx, cancel := context.WithCancel(parent)
	g.drain = cancel
	return ctx
}

// newServer is the proxy's http.Server: header size and read timeouts bound what one
// connection can hold (a larger header block is answered 431, a slow one is closed).
func (g *Gateway) newServer() *http.Server {
	return &http.Server{
		Handler:           g.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    g.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
}

// decisionBounds are extra decision-histogram bounds at the Redis timeout and 1 ms past
// it, so "p99 of decisions <= timeout + 1 ms" can be read off the histogram exactly.
func (g *Gateway) decisionBounds() []float64 {
	if !g.cfg.Redis.enabled() {
		return nil
	}
	return []float64{g.cfg.Redis.Timeout.Seconds(), (g.cfg.Redis.Timeout + time.Millisecond).Seconds()}
}

// warmRedis dials Redis and loads the bucket scripts before the first request, so the
// first decisions need neither a dial nor an EVAL within the decision timeout. A Redis
// that is down is not fatal: the limiter falls back until it answers.
func (g *Gateway) warmRedis(ctx context.Context) {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := g.loadScripts(wctx); err != nil {
		g.log.Warn("redis not reachable at start; the local fallback decides until it is",
			"region", g.cfg.Region, "err", err)
	}
}

// changedAt is the limiter's Options.ChangedAt: when the snapshot in force first saw a
// change that may have raised tenant's capacity in this region.
func (g *Gateway) changedAt(tenant string) time.Time {
	if s := g.snap.Load(); s != nil {
		return s.ChangedAt(g.cfg.Region, tenant)
	}
	return time.Time{}
}

// watchRedisPolicy re-reads Redis's maxmemory-policy every reload_interval, so that a
// policy changed with CONFIG SET (or a Redis restarted with another configuration)
// shows in ratelimit_redis_evicting_policy and the log without a gateway restart.
func (g *Gateway) watchRedisPolicy(ctx context.Context) {
	every(ctx, g.cfg.ReloadInterval, func() {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		g.checkEviction(cctx)
	})
}

// every runs f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// closeClients closes the database pool, the upstream connections, the limiter's
// background script reload if one is running, and the Redis client.
func (g *Gateway) closeClients() {
	if g.store != nil {
		g.store.Close()
	}
	g.transport.CloseIdleConnections()
	if g.lim != nil {
		g.lim.Close()
	}
	if g.rdb != nil {
		_ = g.rdb.Close()
	}
}

// serve is Serve with the normal shutdown result mapped to nil.
func serve(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// instanceTTL: an instance unseen for store.MissedHeartbeats heartbeat periods is dead.
func (g *Gateway) instanceTTL() time.Duration { return store.InstanceTTL(g.cfg.HeartbeatInterval) }

func (g *Gateway) onReload(s *regions.Snapshot) {
	if !g.acceptSnapshot(s) {
		return
	}
	known := false
	for _, r := range s.Regions() {
		known = known || r == g.cfg.Region
	}
	if !known {
		g.log.Warn("this region is not in the database; limits use an equal split of the known regions",
			"region", g.cfg.Region)
	}
	g.setSnapshot(s)
	g.log.Debug("snapshot loaded", "region", g.cfg.Region, "rules", s.RuleCount(),
		"instances", s.LiveInstances(g.cfg.Region))
}

// heartbeat records this instance alive every heartbeat_interval. Failures are counted,
// and logged when the state changes.
func (g *Gateway) heartbeat(ctx context.Context) {
	t := time.NewTicker(g.cfg.HeartbeatInterval)
	defer t.Stop()
	failing := false
	for {
		err := g.beat(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			g.m.heartbeatErrs.Inc()
			if !failing {
				g.log.Warn("heartbeat failed", "region", g.cfg.Region, "instance", g.instanceID, "err", err)
			}
			failing = true
		case failing:
			g.log.Info("heartbeat recovered", "region", g.cfg.Region, "instance", g.instanceID)
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *Gateway) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(g.cfg.HeartbeatInterval, time.Second))
	defer cancel()
	return g.store.Heartbeat(ctx, g.instanceID, g.cfg.Region)
}

// removeInstance deletes the heartbeat on shutdown so the others' fallback shares grow
// at once rather than after the TTL.
func (g *Gateway) removeInstance(ctx context.Context) {
	st := g.store
	if st == nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := st.RemoveInstance(rctx, g.instanceID); err != nil {
		g.log.Warn("remove heartbeat failed", "region", g.cfg.Region, "instance", g.instanceID, "err", err)
	}
}

// rotateTenants lets the busiest untracked pairs into the per-tenant series.
func (g *Gateway) rotateTenants(ctx context.Context) {
	every(ctx, g.cfg.Metrics.TenantInterval, g.tenants.rotate)
}
