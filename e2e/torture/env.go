package torture

import (
	"context"
	"fmt"
	"log/slog"
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
	// and covers a share change in flight the same way.
	Lag = ReloadInterval + PollInterval + time.Second
	// Recovery is how long after a Redis fault ends a gateway's breaker may still be open
	// (redis.breaker.open_for, 1 s by default, and a second for a probe on a loaded
	// machine): the fallback overlap lasts that long.
	Recovery = 2 * time.Second
)

// Env is the running stack with a proxy between every gateway and its Redis.
type Env struct {
	*stack.Stack
	// Proxies, by gateway id, sit between the gateway and its region's Redis.
	Proxies *testenv.Proxies
	seq     int
}

// Options configure Start.
type Options struct {
	// RedisTimeout is the gateways' redis.timeout; 0 keeps the product's default (5 ms).
	RedisTimeout time.Duration
	BinDir       string
	Logger       *slog.Logger
}

// Start starts the stack: two regions, two gateways each, the rebalancer, and a
// testenv.SlowProxy in front of each gateway's Redis.
func Start(ctx context.Context, opts Options) (*Env, error) {
	e := &Env{Proxies: &testenv.Proxies{}}
	s, err := stack.Start(ctx, stack.Options{
		// A placeholder tenant: the runs add their own (AddTenant).
		Tenants:           []stack.Tenant{{ID: "idle", Capacity: 10, RefillPerSecond: 1}},
		RebalanceInterval: 4 * time.Second,
		RedisTimeout:      opts.RedisTimeout,
		BinDir:            opts.BinDir,
		Logger:            opts.Logger,
		GatewayRedisFront: func(id, _, addr string) (string, error) { return e.Proxies.Front(id, addr) },
	})
	if err != nil {
		e.Proxies.Close()
		return nil, err
	}
	e.Stack = s
	return e, nil
}

// Close stops the stack and the proxies.
func (e *Env) Close() {
	if e.Stack != nil {
		e.Stack.Close()
	}
	e.Proxies.Close()
}

// Targets are the gateways as load targets.
func (e *Env) Targets() []Target {
	var out []Target
	for _, g := range e.Gateways {
		out = append(out, Target{Gateway: g.ID, Region: g.Region, URL: g.URL})
	}
	return out
}

// instances is the gateways per region (the stack runs the same number in each).
func (e *Env) instances() int { return len(e.Gateways) / max(1, len(e.Regions)) }

// GatewaySpecs are the gateways for a schedule.
func (e *Env) GatewaySpecs() []GatewaySpec {
	var out []GatewaySpec
	for _, g := range e.Gateways {
		out = append(out, GatewaySpec{ID: g.ID, Region: g.Region})
	}
	return out
}

// AddTenant creates a tenant with a fresh id (prefix and a sequence number), its rule
// on route (stack.Route or stack.BulkRoute) and an API key, and returns the id and the
// key. Each run has tenants of its own, so runs on one stack do not share buckets.
func (e *Env) AddTenant(ctx context.Context, prefix, route string, capacity int64, refill float64) (id, key string, err error) {
	e.seq++
	id = fmt.Sprintf("%s-%d", prefix, e.seq)
	actx := store.WithAudit(ctx, "torture", "torture tenant")
	if err := e.Store.SetRule(actx, regions.Rule{Tenant: id, Route: route, Capacity: capacity, RefillPerSecond: refill, Shards: 1}); err != nil {
		return "", "", err
	}
	key, _, err = e.Store.CreateKey(actx, id, "torture")
	if err != nil {
		return "", "", err
	}
	return id, key, nil
}

// Observer reads the rules and shares in force every PollInterval and keeps, per tenant
// and region, each distinct regional limit with the time from which it may be in force:
// the previous successful read (a change observed now was made after it).
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
	for t, route := range o.routes {
		if o.states[t] == nil {
			o.states[t] = map[string][]State{}
		}
		for _, r := range o.regions {
			rule, lim, share := snap.RegionalRule(r, t, route)
			st := State{From: from, Capacity: float64(lim.Capacity), Refill: lim.RefillPerSecond, C: rule.Capacity, R: rule.RefillPerSecond, S: share, Shards: rule.Shards}
			prev := o.states[t][r]
			if n := len(prev); n > 0 {
				p := prev[n-1]
				if p.Capacity == st.Capacity && p.Refill == st.Refill && p.Shards == st.Shards {
					continue
				}
			}
			o.states[t][r] = append(prev, st)
		}
	}
	o.last = now
	return nil
}

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
