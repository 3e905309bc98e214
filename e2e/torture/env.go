package torture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/e2e/stack"
	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// The gateways' settings the bound depends on (e2e/stack's gateway config).
const (
	// ReloadInterval is the gateways' reload_interval: a change whose NOTIFY is lost is
	// loaded by then.
	ReloadInterval = 5 * time.Second
	// PollInterval is how often the checker reads the rules and shares in force.
	PollInterval = 200 * time.Millisecond
	// Lag is how long after the checker observed a change the old limit may still be
	// enforced: one reload, the observation's interval, and a second for the reload
	// itself on a loaded machine. It is the "one reload lag" slack of the invariant,
	// and covers a share change in flight and a gateway's count of live instances (the
	// fallback's N) the same way.
	Lag = ReloadInterval + PollInterval + time.Second
	// QuotaSync is the gateways' quota_sync_interval (I): the checker's calendar-quota
	// bound allows admissions within 2·I + QuotaSyncMargin of a period's last one.
	QuotaSync = time.Second
	// QuotaSyncMargin is the time a sync itself may take (report, then read back), on
	// top of 2·I: the tracker runs each Sync under a timeout of one interval.
	QuotaSyncMargin = time.Second
	// Expected is the gateways' expected_instances (e2e/stack: the gateways per region
	// at the start), the floor of the fallback's N.
	Expected = 2
)

// Env is the running stack with a proxy between every gateway and its Redis, an nginx in
// front of the /v1/check door of each gateway the stack started with, and the record of
// every gateway process's life.
type Env struct {
	*stack.Stack
	// Proxies, by gateway id, sit between the gateway and its region's Redis.
	Proxies *testenv.Proxies
	seq     int

	mu sync.Mutex
	// gateways are every gateway the environment ever ran, running or not, by id, and
	// lives their processes.
	gateways map[string]*stack.Gateway
	lives    map[string][]Life
	// nginx, by gateway id, runs the shipped deploy/nginx config in front of the
	// gateway's /v1/check.
	nginx map[string]*testenv.Process
}

// Options configure Start.
type Options struct {
	// RedisTimeout is the gateways' redis.timeout; 0 keeps the product's default (5 ms).
	RedisTimeout time.Duration
	BinDir       string
	Logger       *slog.Logger
}

// Start starts the stack: two regions, two gateways each, the rebalancer, a
// testenv.SlowProxy in front of each gateway's Redis and an nginx in front of each
// gateway's check door.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	e := &Env{Proxies: &testenv.Proxies{}, gateways: map[string]*stack.Gateway{}, lives: map[string][]Life{}, nginx: map[string]*testenv.Process{}}
	began := time.Now()
	s, err := stack.Start(ctx, stack.Options{
		// A placeholder tenant: the runs add their own (AddTenant).
		Tenants:           []stack.Tenant{{ID: "idle", Capacity: 10, RefillPerSecond: 1}},
		Rules:             []regions.Rule{RouteDefault},
		GatewaysPerRegion: Expected,
		RebalanceInterval: 4 * time.Second,
		RedisTimeout:      opts.RedisTimeout,
		QuotaSyncInterval: QuotaSync,
		BinDir:            opts.BinDir,
		Logger:            opts.Logger,
		GatewayRedisFront: func(id, _, addr string) (string, error) { return e.Proxies.Front(id, addr) },
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
	for _, g := range s.GatewayList() {
		e.gateways[g.ID] = g
		e.lives[g.ID] = []Life{{Span: Span{From: began}}}
		if err := e.startNginx(ctx, g); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// startNginx runs deploy/nginx/quotaplane.conf in front of g, as shipped but for its
// three addresses, and with its check subrequests sent from stack.TrustedProxy
// (proxy_bind), the one address whose X-Forwarded-For the gateways believe.
func (e *Env) startNginx(ctx context.Context, g *stack.Gateway) error {
	root, err := testenv.ModuleRoot(ctx)
	if err != nil {
		return err
	}
	conf, err := os.ReadFile(filepath.Join(root, "deploy", "nginx", "quotaplane.conf"))
	if err != nil {
		return fmt.Errorf("nginx for %s: %w", g.ID, err)
	}
	const check = "proxy_pass http://quotaplane_gateway/v1/check;"
	if !strings.Contains(string(conf), check) {
		return fmt.Errorf("nginx for %s: deploy/nginx/quotaplane.conf has no %q to bind to %s", g.ID, check, stack.TrustedProxy)
	}
	site := strings.NewReplacer(
		"127.0.0.1:8080", strings.TrimPrefix(g.URL, "http://"),
		"127.0.0.1:9000", strings.TrimPrefix(e.Upstream, "http://"),
		"127.0.0.1:8000", "127.0.0.1:{{PORT}}",
		check, check+"\n        proxy_bind "+stack.TrustedProxy+";",
	).Replace(string(conf))
	dir := filepath.Join(filepath.Dir(g.Process.Dir), "nginx-"+g.ID)
	p, err := testenv.StartNginx(ctx, testenv.NginxOptions{Dir: dir, HTTP: site})
	if err != nil {
		return fmt.Errorf("nginx for %s: %w", g.ID, err)
	}
	e.mu.Lock()
	e.nginx[g.ID] = p
	e.mu.Unlock()
	return nil
}

// NginxErrors are the last lines of each nginx's error log other than its notes of a
// check that refused (429, 400, 401: the config turns those into the client's answer),
// for a run that saw a 5xx through nginx.
func (e *Env) NginxErrors() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, id := range sortedKeys(e.nginx) {
		b, err := os.ReadFile(e.nginx[id].LogPath())
		if err != nil {
			out = append(out, id+": "+err.Error())
			continue
		}
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if l == "" || strings.Contains(l, "auth request unexpected status: 4") {
				continue
			}
			lines = append(lines, id+": "+l)
		}
		out = append(out, lines[max(0, len(lines)-10):]...)
	}
	return out
}

// Close stops the stack, the nginx servers and the proxies.
func (e *Env) Close() {
	e.mu.Lock()
	for _, p := range e.nginx {
		_ = p.Stop()
	}
	e.mu.Unlock()
	if e.Stack != nil {
		e.Stack.Close()
	}
	e.Proxies.Close()
}

// Live are the gateways running now, in order of their start.
func (e *Env) Live() []*stack.Gateway {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*stack.Gateway
	for _, g := range e.GatewayList() {
		if l := e.lives[g.ID]; len(l) > 0 && !l[len(l)-1].Stopped {
			out = append(out, g)
		}
	}
	return out
}

// LiveOf are the gateways of region running now.
func (e *Env) LiveOf(region string) []*stack.Gateway {
	var out []*stack.Gateway
	for _, g := range e.Live() {
		if g.Region == region {
			out = append(out, g)
		}
	}
	return out
}

// Gateway is the gateway id, running or not, or nil.
func (e *Env) Gateway(id string) *stack.Gateway {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gateways[id]
}

// Target is g as a load target: its proxy, the nginx in front of its check door (if it
// has one) and its RLS door.
func (e *Env) Target(g *stack.Gateway) Target {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := Target{Gateway: g.ID, Region: g.Region, URL: g.URL, RLS: g.RLS}
	if p := e.nginx[g.ID]; p != nil {
		t.Check = "http://" + p.Addr()
	}
	return t
}

// Targets are the running gateways as load targets.
func (e *Env) Targets() []Target {
	var out []Target
	for _, g := range e.Live() {
		out = append(out, e.Target(g))
	}
	return out
}

// GatewaySpecs are the gateways for a schedule: those the stack started with.
func (e *Env) GatewaySpecs() []GatewaySpec {
	var out []GatewaySpec
	for _, g := range e.Live() {
		e.mu.Lock()
		_, front := e.nginx[g.ID]
		e.mu.Unlock()
		if front {
			out = append(out, GatewaySpec{ID: g.ID, Region: g.Region})
		}
	}
	return out
}

// stopped records that id's process stopped now; owing says it still owed fallback
// debts by its last scrape.
func (e *Env) stopped(id string, owing bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.lives[id]
	if len(l) == 0 || l[len(l)-1].Stopped {
		return
	}
	l[len(l)-1].To, l[len(l)-1].Stopped, l[len(l)-1].Owing = time.Now(), true, owing
}

// started records that a process of g starts now.
func (e *Env) started(g *stack.Gateway) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gateways[g.ID] = g
	e.lives[g.ID] = append(e.lives[g.ID], Life{Span: Span{From: time.Now()}})
}

// StopGateway stops gateway id (SIGTERM, or SIGKILL when kill) and keeps it in the
// stack, to be started again by StartGateway.
func (e *Env) StopGateway(id string, kill, owing bool) error {
	g := e.Gateway(id)
	if g == nil {
		return fmt.Errorf("no gateway %s", id)
	}
	stop := g.Process.Stop
	if kill {
		stop = g.Process.Kill
	}
	err := stop()
	e.stopped(id, owing)
	return err
}

// StartGateway starts a gateway StopGateway stopped, on the same ports, and waits until
// it is ready.
func (e *Env) StartGateway(ctx context.Context, id string) error {
	g := e.Gateway(id)
	if g == nil {
		return fmt.Errorf("no gateway %s", id)
	}
	e.started(g)
	return g.Process.Restart(ctx)
}

// AddGateway starts a new gateway in region (a scale-out) and returns it once ready.
func (e *Env) AddGateway(ctx context.Context, region string) (*stack.Gateway, error) {
	from := time.Now()
	g, err := e.Stack.AddGateway(ctx, region)
	if g != nil {
		e.mu.Lock()
		e.gateways[g.ID] = g
		e.lives[g.ID] = append(e.lives[g.ID], Life{Span: Span{From: from}})
		e.mu.Unlock()
	}
	return g, err
}

// RemoveGateway stops gateway id for good (a scale-in).
func (e *Env) RemoveGateway(ctx context.Context, id string, owing bool) error {
	_, err := e.Stack.RemoveGateway(ctx, id)
	e.stopped(id, owing)
	return err
}

// GatewayRuns are every gateway's lives and breaker-open spans up to end, for Check: the
// spans from each gateway's own log (the stack runs them with log_level info).
func (e *Env) GatewayRuns(end time.Time) ([]GatewayRun, error) {
	e.mu.Lock()
	ids := make([]string, 0, len(e.gateways))
	for id := range e.gateways {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	type item struct {
		g     *stack.Gateway
		lives []Life
	}
	items := make([]item, 0, len(ids))
	for _, id := range ids {
		lives := slices.Clone(e.lives[id])
		if n := len(lives); n > 0 && !lives[n-1].Stopped {
			lives[n-1].To = end
		}
		items = append(items, item{e.gateways[id], lives})
	}
	e.mu.Unlock()
	var out []GatewayRun
	var errs []error
	for _, it := range items {
		f, err := os.Open(it.g.Process.LogPath())
		if err != nil {
			errs = append(errs, fmt.Errorf("gateway %s: %w", it.g.ID, err))
			continue
		}
		events, err := ParseBreakerLog(f)
		f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("gateway %s log: %w", it.g.ID, err))
			continue
		}
		out = append(out, GatewayRun{ID: it.g.ID, Region: it.g.Region, Lives: it.lives, Open: BreakerSpans(events, it.lives)})
	}
	return out, errors.Join(errs...)
}

// AddTenant creates a tenant with a fresh id (prefix and a sequence number), its rule
// on route (stack.Route, stack.BulkRoute, stack.ValueRoute or stack.IPRoute) and an API
// key, and returns the id and the key. Each run has tenants of its own, so runs on one
// stack do not share buckets.
func (e *Env) AddTenant(ctx context.Context, prefix, route string, capacity int64, refill float64, bands ...regions.Band) (id, key string, err error) {
	e.seq++
	id = fmt.Sprintf("%s-%d", prefix, e.seq)
	actx := store.WithAudit(ctx, "torture", "torture tenant")
	if err := e.Store.SetRule(actx, regions.Rule{Tenant: id, Route: route, Capacity: capacity, RefillPerSecond: refill, Shards: 1, Bands: bands}); err != nil {
		return "", "", err
	}
	key, _, err = e.Store.CreateKey(actx, id, "torture")
	if err != nil {
		return "", "", err
	}
	return id, key, nil
}

// RouteDefault is the stack's rule for stack.Route of every tenant without one of its
// own ("*" / orders): larger than any tenant's own rule on it, at a small refill, so a
// tenant whose own rule is deleted gets a larger limit (issue 21) and a fallback that
// hands out the new capacity shows as a breach.
var RouteDefault = regions.Rule{Tenant: regions.Wildcard, Route: stack.Route, Capacity: 200, RefillPerSecond: 0.05, Shards: 1}

// Observer reads the rules and shares in force every PollInterval and keeps, per tenant
// and region, each distinct regional limit with the time from which it may be in force:
// the previous successful read (a change observed now was made after it). A region that
// is not in the database (removed) has no limit: its gateways are stopped before it is
// removed.
type Observer struct {
	store   *store.Store
	regions []string
	routes  map[string]string // tenant -> the route it is loaded on

	mu     sync.Mutex
	states map[string]map[string][]State
	last   time.Time // previous successful read
	errs   int
	cancel context.CancelFunc
	done   chan struct{}
}

// Observe reads, for each tenant, the limit of the route it is loaded on (routes: tenant
// -> route) once (it must succeed: the run starts from a known state) and then every
// PollInterval until Stop.
func (e *Env) Observe(ctx context.Context, routes map[string]string) (*Observer, error) {
	o := &Observer{store: e.Store, regions: e.Regions, routes: routes, states: map[string]map[string][]State{}, done: make(chan struct{})}
	before := time.Now()
	if err := o.read(ctx, before); err != nil {
		return nil, fmt.Errorf("observe: %w", err)
	}
	ctx, o.cancel = context.WithCancel(ctx)
	go func() {
		defer close(o.done)
		t := time.NewTicker(PollInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := o.read(ctx, time.Now()); err != nil {
				o.mu.Lock()
				o.errs++ // PostgreSQL down: nothing can change meanwhile
				o.mu.Unlock()
			}
		}
	}()
	return o, nil
}

func (o *Observer) read(ctx context.Context, now time.Time) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	snap, err := o.store.LoadSnapshot(rctx, 3*time.Second)
	if err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	from := o.last
	if from.IsZero() {
		from = now
	}
	known := snap.Regions()
	for t, route := range o.routes {
		if o.states[t] == nil {
			o.states[t] = map[string][]State{}
		}
		for _, r := range o.regions {
			rule, lim, share := snap.RegionalRule(r, t, route)
			st := State{From: from, Capacity: float64(lim.Capacity), Refill: lim.RefillPerSecond, C: rule.Capacity, R: rule.RefillPerSecond, S: share, Shards: rule.Shards}
			if !slices.Contains(known, r) {
				st = State{From: from, C: rule.Capacity, R: rule.RefillPerSecond, Shards: rule.Shards}
			}
			prev := o.states[t][r]
			if n := len(prev); n > 0 {
				p := prev[n-1]
				if p.Capacity == st.Capacity && p.Refill == st.Refill && p.Shards == st.Shards {
					continue
				}
			}
			o.states[t][r] = append(prev, st)
			// Each further band of the rule is checked as a bucket of its own: the
			// tenant's admissions against the band's regional limit (BandKey). A band
			// the rule no longer has (deleted, so a default applies) limits nothing
			// until it is back: unbounded meanwhile.
			// A calendar quota is one budget for the fleet, not a bucket per region: it is
			// checked per period (CheckQuotas), not here.
			has := map[string]bool{}
			for _, b := range rule.Bands {
				if !b.Quota() {
					has[BandKey(t, b.Name)] = true
				}
			}
			for bk, byRegion := range o.states {
				if prev := byRegion[r]; !has[bk] && strings.HasPrefix(bk, t+"#") && len(prev) > 0 && prev[len(prev)-1].Capacity != regions.MaxCapacity {
					byRegion[r] = append(prev, State{From: from, Capacity: regions.MaxCapacity, Refill: regions.MaxRefillPerSecond, Shards: 1})
				}
			}
			for _, b := range rule.Bands {
				if b.Quota() {
					continue
				}
				bk := BandKey(t, b.Name)
				if o.states[bk] == nil {
					o.states[bk] = map[string][]State{}
				}
				bl := b.Limit().Scale(share)
				bst := State{From: from, Capacity: float64(bl.Capacity), Refill: bl.RefillPerSecond, C: b.Capacity, R: b.RefillPerSecond, S: share, Shards: 1}
				if !slices.Contains(known, r) {
					bst = State{From: from, C: b.Capacity, R: b.RefillPerSecond, Shards: 1}
				}
				bprev := o.states[bk][r]
				if n := len(bprev); n > 0 && bprev[n-1].Capacity == bst.Capacity && bprev[n-1].Refill == bst.Refill {
					continue
				}
				o.states[bk][r] = append(bprev, bst)
			}
		}
	}
	o.last = now
	return nil
}

// BandKey is the key under which the states of a tenant's further band (regions.Band)
// are kept and checked: "tenant#band" (ids never hold '#').
func BandKey(tenant, band string) string { return tenant + "#" + band }

// Stop ends the reads, reads once more (bounded) and returns the states.
func (o *Observer) Stop(ctx context.Context) map[string]map[string][]State {
	o.cancel()
	<-o.done
	for range 25 { // PostgreSQL may be coming back
		if o.read(ctx, time.Now()) == nil {
			break
		}
		time.Sleep(PollInterval)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.states
}

// Latest is the last observed state of tenant in region.
func (o *Observer) Latest(tenant, region string) State {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.states[tenant][region]
	if len(s) == 0 {
		return State{}
	}
	return s[len(s)-1]
}
