package faults

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/e2e/stack"
	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// The environment's tenants, both on stack.Route.
const (
	// HotTenant is loaded far above its limit from every gateway, so its admitted count
	// measures enforcement. Its shares are pinned 50/50 by an override, so its regional
	// limits do not move while faults make the rebalancer act.
	HotTenant = "hot"
	// CalmTenant is loaded well under its limit; its shares are the rebalancer's.
	CalmTenant = "calm"
)

// The gateways' settings the measurements depend on: e2e/stack configures its
// gateways with the default breaker and a 5 s reload interval.
const (
	BreakerOpenFor = time.Second
	ReloadInterval = 5 * time.Second
)

// DefaultRedisTimeout is Options.RedisTimeout when zero. The product's default is 5 ms;
// on the shared 2-core test machine (load average 6-8 from other jobs) a 5 ms timeout
// trips on scheduling stalls alone, and the breaker then spends most of its time open,
// which measures the machine rather than the faults. 10 ms keeps false trips rare and is
// still well under the 20 ms of the slow-Redis fault.
const DefaultRedisTimeout = 10 * time.Millisecond

// Options configure Start. Zero values take the defaults noted.
type Options struct {
	// HotRate and CalmRate are the requests per second each gateway is offered for the
	// two tenants (default 40 and 10).
	HotRate, CalmRate float64
	// HotCapacity and HotRefill are the hot tenant's global rule (default 100 and 50/s).
	HotCapacity int64
	HotRefill   float64
	// RebalanceInterval is the rebalancer's interval (default 4s; checks every half).
	RebalanceInterval time.Duration
	// RedisTimeout is the gateways' redis.timeout (default DefaultRedisTimeout).
	RedisTimeout time.Duration
	Logger       *slog.Logger
}

// Env is a running stack with a slow proxy in front of each region's Redis, the hot
// tenant's shares pinned, and a "load balancer" view of which gateways get traffic.
type Env struct {
	*stack.Stack
	// Proxies sit between each region's gateways and its Redis.
	Proxies *testenv.Proxies
	opts    Options
	routed  map[string]*atomic.Bool // gateway id -> in rotation
}

// Start starts the environment; Close stops it.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	if opts.HotRate <= 0 {
		opts.HotRate = 40
	}
	if opts.CalmRate <= 0 {
		opts.CalmRate = 10
	}
	if opts.HotCapacity <= 0 {
		opts.HotCapacity = 100
	}
	if opts.HotRefill <= 0 {
		opts.HotRefill = 50
	}
	if opts.RebalanceInterval <= 0 {
		opts.RebalanceInterval = 4 * time.Second
	}
	if opts.RedisTimeout <= 0 {
		opts.RedisTimeout = DefaultRedisTimeout
	}
	e := &Env{Proxies: &testenv.Proxies{}, opts: opts, routed: map[string]*atomic.Bool{}}
	s, err := stack.Start(ctx, stack.Options{
		Tenants: []stack.Tenant{
			{ID: HotTenant, Capacity: opts.HotCapacity, RefillPerSecond: opts.HotRefill},
			{ID: CalmTenant, Capacity: 400, RefillPerSecond: 200},
		},
		RebalanceInterval: opts.RebalanceInterval,
		RedisTimeout:      opts.RedisTimeout,
		Logger:            opts.Logger,
		RedisFront:        e.Proxies.Front,
	})
	if err != nil {
		e.Proxies.Close()
		return nil, err
	}
	e.Stack = s
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	for _, g := range s.Gateways {
		e.routed[g.ID] = &atomic.Bool{}
		e.routed[g.ID].Store(true)
	}
	if err := e.durableCommits(ctx); err != nil {
		return nil, err
	}
	half := map[string]float64{}
	for _, r := range s.Regions {
		half[r] = 1 / float64(len(s.Regions))
	}
	scope, err := regions.ParseScope(HotTenant)
	if err != nil {
		return nil, err
	}
	if err := s.Store.SetOverride(ctx, scope, half, "faults", "pin the hot tenant so admission bounds are exact", 0); err != nil {
		return nil, fmt.Errorf("pin %s: %w", HotTenant, err)
	}
	// Every gateway enforces the pinned share before anything is measured.
	want := strconv.FormatInt(max(1, int64(float64(opts.HotCapacity)*half[s.Regions[0]]+0.5)), 10)
	for _, g := range s.Gateways {
		if err := waitUntil(ctx, 20*time.Second, func() bool {
			return e.limitHeader(ctx, g, HotTenant) == want
		}); err != nil {
			return nil, fmt.Errorf("gateway %s never enforced the pinned share (X-RateLimit-Limit %s): %w", g.ID, want, err)
		}
	}
	return e, nil
}

// durableCommits turns synchronous_commit on for the stack's database (internal/testenv runs
// PostgreSQL with it off, for speed) and ends every session so that each reconnects with
// it: a commit acknowledged before a PostgreSQL kill must survive it, or "no row lost"
// could not be checked. Ending the sessions is itself a small fault the gateways, the
// rebalancer and the store ride out.
func (e *Env) durableCommits(ctx context.Context) error {
	pool := e.Store.Pool()
	if _, err := pool.Exec(ctx, `ALTER DATABASE quotaplane SET synchronous_commit = on`); err != nil {
		return fmt.Errorf("synchronous_commit: %w", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = 'quotaplane' AND pid <> pg_backend_pid()`); err != nil {
		return fmt.Errorf("end sessions: %w", err)
	}
	pool.Reset() // the store's own connections, too
	return waitUntil(ctx, 20*time.Second, func() bool {
		var on string
		err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&on)
		return err == nil && on == "on"
	})
}

// limitHeader is X-RateLimit-Limit of one request of tenant through g ("" on failure).
func (e *Env) limitHeader(ctx context.Context, g *stack.Gateway, tenant string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/orders", nil)
	if err != nil {
		return ""
	}
	req.Header.Set("X-Api-Key", e.Keys[tenant])
	resp, err := probeClient.Do(req)
	if err != nil {
		return ""
	}
	resp.Body.Close()
	return resp.Header.Get("X-RateLimit-Limit")
}

var probeClient = &http.Client{Timeout: 5 * time.Second}

// Close stops the stack and the proxies.
func (e *Env) Close() {
	if e.Stack != nil {
		e.Stack.Close()
	}
	e.Proxies.Close()
}

// Opts are the options the environment runs with, defaults filled in.
func (e *Env) Opts() Options { return e.opts }

// Gateway finds a gateway by id.
func (e *Env) Gateway(id string) *stack.Gateway {
	for _, g := range e.Gateways {
		if g.ID == id {
			return g
		}
	}
	return nil
}

// StreamName is the load stream of tenant through gateway id.
func StreamName(id, tenant string) string { return id + "/" + tenant }

// Streams are the steady load: each tenant through each gateway in rotation, at its rate.
func (e *Env) Streams() []loadgen.Stream {
	var out []loadgen.Stream
	for _, g := range e.Gateways {
		if !e.routed[g.ID].Load() {
			continue
		}
		for tenant, rate := range map[string]float64{HotTenant: e.opts.HotRate, CalmTenant: e.opts.CalmRate} {
			out = append(out, loadgen.Stream{
				Name: StreamName(g.ID, tenant), Method: http.MethodPost, URL: g.URL + "/orders",
				Header: http.Header{"X-Api-Key": []string{e.Keys[tenant]}},
				Rate:   loadgen.Constant(rate),
			})
		}
	}
	return out
}

// Load is the running steady load. Taking a gateway out of rotation or back (Route)
// restarts the load generator with the streams of the gateways in rotation, as a load
// balancer follows readiness; the counts carry on.
type Load struct {
	Live  *loadgen.Counts
	env   *Env
	ctx   context.Context
	until time.Time

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan error
	results []loadgen.Result
}

// StartLoad runs the steady load until Stop, for at most limit.
func (e *Env) StartLoad(ctx context.Context, limit time.Duration) *Load {
	l := &Load{Live: &loadgen.Counts{}, env: e, ctx: ctx, until: time.Now().Add(limit)}
	l.start()
	return l
}

func (l *Load) start() {
	ctx, cancel := context.WithCancel(l.ctx)
	done := make(chan error, 1)
	streams, d := l.env.Streams(), time.Until(l.until)
	go func() {
		if len(streams) == 0 || d <= 0 {
			<-ctx.Done()
			done <- nil
			return
		}
		res, err := loadgen.Run(ctx, streams, d, l.Live)
		l.results = res
		done <- err
	}()
	l.cancel, l.done = cancel, done
}

// stopRun ends the current run; called with mu held.
func (l *Load) stopRun() error {
	l.cancel()
	return <-l.done
}

// Route takes gateway id out of rotation (on false) or puts it back, and restarts the
// load with the gateways in rotation.
func (l *Load) Route(id string, on bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.env.routed[id].Store(on)
	err := l.stopRun()
	l.start()
	return err
}

// Stop ends the load and returns the results of the whole load (every run).
func (l *Load) Stop() ([]loadgen.Result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.stopRun()
	return l.results, err
}

// waitUntil polls cond every 50 ms until it holds, ctx ends or limit passes. Polling a
// running system for an eventual state: there is no clock to inject.
func waitUntil(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// WaitUntil is waitUntil for callers outside the package.
func WaitUntil(ctx context.Context, limit time.Duration, cond func() bool) error {
	return waitUntil(ctx, limit, cond)
}
