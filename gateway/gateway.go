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
	"github.com/quotaplane/quotaplane/gateway/usage"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// decider is the limiter as the gateway uses it: *limiter.Redis or *limiter.Local.
type decider interface {
	Decide(ctx context.Context, r limiter.Request) (limiter.Decision, error)
	// Settle charges (delta > 0, into debt) or gives back (delta < 0) the difference
	// between a request's real cost and the estimate r, as decided, took.
	Settle(ctx context.Context, r limiter.Request, delta int64) error
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

// Gateway is one region gateway: its doors (the reverse proxy with /v1/check, and
// the RLS service), the one admission and decision path they share, and, in Run, the
// snapshot reloader and heartbeats.
type Gateway struct {
	cfg        Config
	log        *slog.Logger
	registerer prometheus.Registerer
	now        func() time.Time
	m          *metrics
	tenants    *tenantTracker

	snap atomic.Pointer[regions.Snapshot]
	// snapAt is when snap was stored, in ns since origin (the monotonic clock): a
	// snapshot's raise markers age from the store's clock at load plus that.
	snapAt atomic.Int64
	origin time.Time
	// countedFrom is when the region's other gateways count this one in N (its first
	// heartbeat plus a heartbeat and a reload), in ns since origin; 0 until the first
	// heartbeat.
	countedFrom atomic.Int64
	ready       readiness
	// emptySnapshot: the last database snapshot had no region rows (acceptSnapshot).
	emptySnapshot atomic.Bool

	lim     decider
	settler *settler              // the proxy's settles of real costs after the response (settle.go)
	redis   redisBackend          // the Redis limiter's upkeep; nil without Redis
	rdb     redis.UniversalClient // *redis.Client, or *redis.ClusterClient with redis.cluster

	// What admission needs beyond the snapshot: the guard (nil when
	// unauthenticated_limit is disabled), the proxies whose X-Forwarded-For is believed,
	// the routes, and how an HTTP request presents its key.
	guard   *clientGuard
	trusted trustedProxies
	routes  *routeTable
	auth    httpAuth

	obs       *observer       // proxy metrics, upstream error log, access log (observe.go)
	transport *http.Transport // to the upstreams
	handler   http.Handler
	admin     http.Handler

	store *store.Store // database mode: opened by Run (it dials on first use)
	// usage reports this region's quota counters and reads the fleet's (database mode;
	// nil standalone: a Local counts its quotas alone).
	usage *usage.Tracker
}

// redisBackend is what the gateway does with the Redis limiter besides deciding
// (*limiter.Redis): load its scripts before the first request, and re-read Redis's
// eviction policy.
type redisBackend interface {
	Load(ctx context.Context) error
	CheckEviction(ctx context.Context)
	Flush(ctx context.Context) (charged, lost int64)
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
		now:        opts.Now,
		origin:     time.Now(),
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
	gatherer := opts.Gatherer
	if gatherer == nil {
		ga, ok := g.registerer.(prometheus.Gatherer)
		if !ok {
			return nil, fmt.Errorf("gateway %s: Options.Gatherer is required: the Registerer (%T) is not a prometheus.Gatherer", cfg.Region, g.registerer)
		}
		gatherer = ga
	}
	if g.cfg.InstanceID == "" {
		g.cfg.InstanceID = defaultInstanceID()
	} else if err := regions.ValidateID("instance", g.cfg.InstanceID); err != nil {
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
	m, err := newMetrics(g.registerer, cfg.Region, decisionBounds(&g.cfg.Redis))
	if err != nil {
		return nil, fmt.Errorf("gateway %s: register metrics: %w", cfg.Region, err)
	}
	g.m = m
	g.ready.gauge = m.ready
	if g.obs, err = newObserver(g.registerer, m, &g.cfg, g.log, g.now, g.trusted); err != nil {
		return nil, fmt.Errorf("gateway %s: register metrics: %w", cfg.Region, err)
	}
	g.tenants = newTenantTracker(m, cfg.Region, cfg.Metrics.MaxTenants, g.pairShare)

	if err := g.newLimiter(); err != nil {
		return nil, err
	}
	g.settler = newSettler(g.cfg.Redis.Timeout)
	g.auth = newHTTPAuth(g.cfg.Auth)
	if err := g.newRoutes(); err != nil {
		return nil, err
	}
	g.admin = g.newAdminHandler(gatherer)

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
func (g *Gateway) InstanceID() string { return g.cfg.InstanceID }

// Ready reports whether a snapshot is loaded and the gateway is not draining.
func (g *Gateway) Ready() bool { return g.snap.Load() != nil && !g.ready.isDraining() }

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
		g.usage, err = usage.New(g.cfg.Region, st, usage.Options{Now: g.now, Logger: g.log,
			Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"region": g.cfg.Region}, g.registerer)})
		if err != nil {
			return fmt.Errorf("gateway %s: %w", g.cfg.Region, err)
		}
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
	var rln net.Listener
	if g.cfg.RLSListen != "" {
		if rln, err = net.Listen("tcp", g.cfg.RLSListen); err != nil {
			_ = ln.Close()
			_ = aln.Close()
			return fmt.Errorf("gateway %s: rls listen: %w", g.cfg.Region, err)
		}
	}
	return g.run(ctx, ln, aln, rln)
}

// run is Run on listeners already open (rln nil without rls_listen); it closes them.
func (g *Gateway) run(ctx context.Context, ln, aln, rln net.Listener) error {
	g.log.Info("gateway starting", "region", g.cfg.Region, "instance", g.cfg.InstanceID,
		"listen", ln.Addr().String(), "admin_listen", aln.Addr().String(),
		"mode", g.cfg.Mode, "mode_source", g.cfg.modeSource)
	if g.rdb == nil {
		g.log.Warn("no redis configured: limits are enforced per instance, not per region",
			"region", g.cfg.Region)
	} else {
		// Load the scripts before the first request, so the first decisions need
		// neither a dial nor an EVAL within the decision timeout. A Redis that is down is
		// not fatal: the limiter falls back until it answers.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := g.redis.Load(wctx); err != nil {
			g.log.Warn("redis not reachable at start; the local fallback decides until it is",
				"region", g.cfg.Region, "err", err)
		}
		cancel()
	}
	var hb *heartbeats

	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	if !g.cfg.Standalone() {
		rl := store.NewReloader(store.ReloaderOptions{
			Load: func(ctx context.Context) (*regions.Snapshot, error) {
				return g.store.LoadSnapshot(ctx, store.InstanceTTL(g.cfg.HeartbeatInterval))
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
		hb = &heartbeats{store: g.store, id: g.cfg.InstanceID, region: g.cfg.Region,
			every: g.cfg.HeartbeatInterval, log: g.log, errs: g.m.heartbeatErrs,
			first: func() {
				// The others see this heartbeat in their snapshot within a reload (on a
				// timer: heartbeats send no NOTIFY), after the next heartbeat at worst.
				g.countedFrom.Store(int64(time.Since(g.origin) + g.cfg.HeartbeatInterval + g.cfg.ReloadInterval))
			},
			xmin: func() int64 {
				if s := g.snap.Load(); s != nil {
					return s.Xmin()
				}
				return 0
			}}
		wg.Go(func() { hb.run(bg) })
		if g.usage != nil {
			wg.Go(func() { g.usage.Run(bg, g.cfg.QuotaSyncInterval, min(g.cfg.QuotaSyncInterval, 5*time.Second)) })
		}
	}
	wg.Go(func() { g.rotateTenants(bg) })
	if g.redis != nil {
		// Re-read Redis's maxmemory-policy every reload_interval, so that a policy
		// changed with CONFIG SET (or a Redis restarted with another configuration)
		// shows in ratelimit_redis_evicting_policy and the log without a restart.
		wg.Go(func() {
			every(bg, g.cfg.ReloadInterval, func() {
				cctx, cancel := context.WithTimeout(bg, time.Second)
				defer cancel()
				g.redis.CheckEviction(cctx)
			})
		})
	}

	// The RLS door drains with the proxy: it stops when the gateway starts draining.
	rctx, drain := context.WithCancel(bg)
	defer drain()
	if rln != nil {
		rls := g.newRLSServer()
		g.log.Info("rate limit service listening", "region", g.cfg.Region, "rls_listen", rln.Addr().String())
		wg.Go(func() {
			if err := g.serveRLS(rctx, rls, rln); err != nil {
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
	drain()
	g.log.Info("gateway draining", "region", g.cfg.Region, "drain_timeout", g.cfg.DrainTimeout.String())
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.DrainTimeout)
	if err := srv.Shutdown(dctx); err != nil {
		g.log.Warn("drain incomplete; closing remaining connections", "region", g.cfg.Region, "err", err)
		_ = srv.Close()
	}
	cancel()
	stopBG()
	wg.Wait()
	// Settles still in flight finish (each within the Redis timeout) before the
	// fallback's debts, theirs included, are flushed.
	g.settler.close()
	if g.redis != nil {
		// What the fallback admitted and Redis was not charged yet goes with this process
		// unless it is charged now: tried for a bounded time, what fails is counted lost.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
		g.redis.Flush(fctx)
		cancel()
	}
	if hb != nil {
		hb.remove(ctx)
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

// rotateTenants lets the busiest untracked pairs into the per-tenant series.
func (g *Gateway) rotateTenants(ctx context.Context) {
	every(ctx, g.cfg.Metrics.TenantInterval, g.tenants.rotate)
}

// flushTimeout bounds the charge of the fallback's debts at shutdown (Redis.Flush).
const flushTimeout = 2 * time.Second
