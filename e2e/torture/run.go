package torture

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/e2e/faults"
	"github.com/quotaplane/quotaplane/e2e/stack"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// Executor runs a schedule's events against the environment and the load, and records
// when each ran and when a Redis came back empty.
type Executor struct {
	env   *Env
	load  *Load
	rules map[string]regions.Rule // tenant -> its rule as last written

	mu       sync.Mutex
	log      []string
	ran      []ran
	restarts map[string][]Span
	faults   map[string][]Span // region -> Redis faults (stall, kill, black hole, latency)
	outages  []Span
	errs     []error
}

// NewExecutor prepares to run events; rules are the tenants' rules as written.
func NewExecutor(env *Env, load *Load, rules map[string]regions.Rule) *Executor {
	return &Executor{env: env, load: load, rules: rules, restarts: map[string][]Span{}, faults: map[string][]Span{}}
}

// Run runs the events at their times after start: faults in order on one track, changes
// in order on another; it returns when both tracks are done or ctx ends. Every fault is
// healed before Run returns.
func (x *Executor) Run(ctx context.Context, start time.Time, events []Event) {
	var faults, changes []Event
	for _, e := range events {
		if e.Kind.Fault() {
			faults = append(faults, e)
		} else {
			changes = append(changes, e)
		}
	}
	var wg sync.WaitGroup
	for _, track := range [][]Event{faults, changes} {
		wg.Go(func() {
			for _, e := range track {
				if !waitFor(ctx, start.Add(e.At)) {
					return
				}
				began := time.Now()
				err := x.do(ctx, e)
				x.mu.Lock()
				x.ran = append(x.ran, ran{e, began})
				switch e.Kind {
				case RedisStall, RedisKill, BlackHole, Latency:
					x.faults[e.Region] = append(x.faults[e.Region], Span{From: began, To: time.Now()})
				}
				line := fmt.Sprintf("%8.3fs %s (took %v)", began.Sub(start).Seconds(), e, time.Since(began).Round(time.Millisecond))
				if err != nil {
					line += " ERROR " + err.Error()
					x.errs = append(x.errs, fmt.Errorf("%s: %w", e, err))
				}
				x.log = append(x.log, line)
				x.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// ran is an event and when it began.
type ran struct {
	Event
	began time.Time
}

// Began are the times at which the events of kind for tenant began.
func (x *Executor) Began(kind Kind, tenant string) []time.Time {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []time.Time
	for _, r := range x.ran {
		if r.Kind == kind && r.Tenant == tenant {
			out = append(out, r.began)
		}
	}
	return out
}

// Log is what ran, when, and how long it took.
func (x *Executor) Log() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.log...)
}

// Errors are the events that could not be carried out.
func (x *Executor) Errors() []error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]error(nil), x.errs...)
}

// RedisRestarts are the spans in which a region's Redis came back empty.
func (x *Executor) RedisRestarts() map[string][]Span {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string][]Span{}
	for r, s := range x.restarts {
		out[r] = append([]Span(nil), s...)
	}
	return out
}

// RedisFaults are, per region, the spans in which its Redis (or one gateway's way to it)
// was stalled, killed, black-holed or slowed.
func (x *Executor) RedisFaults() map[string][]Span {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string][]Span{}
	for r, s := range x.faults {
		out[r] = append([]Span(nil), s...)
	}
	return out
}

// Outages are the spans in which PostgreSQL was down.
func (x *Executor) Outages() []Span {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]Span(nil), x.outages...)
}

func waitFor(ctx context.Context, t time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(t)):
		return true
	}
}

// hold waits d; a fault is healed even when ctx ends meanwhile.
func hold(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// healCtx is for healing: it outlives a cancelled run by a bounded time.
func healCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 90*time.Second)
}

func (x *Executor) do(ctx context.Context, e Event) error {
	env := x.env
	switch e.Kind {
	case RedisStall:
		rd := env.Redis[e.Region]
		if err := rd.Pause(); err != nil {
			return err
		}
		hold(ctx, e.Hold)
		return rd.Resume()
	case RedisKill:
		rd := env.Redis[e.Region]
		if err := rd.Kill(); err != nil {
			return err
		}
		hold(ctx, e.Hold)
		hctx, cancel := healCtx()
		defer cancel()
		from := time.Now()
		err := rd.Restart(hctx)
		x.mu.Lock()
		x.restarts[e.Region] = append(x.restarts[e.Region], Span{From: from, To: time.Now()})
		x.mu.Unlock()
		return err
	case BlackHole:
		p := env.Proxies.Get(e.Gateway)
		p.SetBlackHole(true)
		hold(ctx, e.Hold)
		p.SetBlackHole(false)
		return nil
	case Latency:
		p := env.Proxies.Get(e.Gateway)
		p.SetDelay(e.Delay)
		hold(ctx, e.Hold)
		p.SetDelay(0)
		return nil
	case PostgresKill:
		from := time.Now()
		if err := env.Postgres.Kill(); err != nil {
			return err
		}
		hold(ctx, e.Hold)
		hctx, cancel := healCtx()
		defer cancel()
		err := env.Postgres.Restart(hctx)
		x.mu.Lock()
		x.outages = append(x.outages, Span{From: from, To: time.Now()})
		x.mu.Unlock()
		return err
	case RedisEvicting:
		return x.evicting(ctx, e)
	case GatewayRestart:
		var g *stack.Gateway
		for _, x := range env.Gateways {
			if x.ID == e.Gateway {
				g = x
			}
		}
		if g == nil {
			return fmt.Errorf("no gateway %s", e.Gateway)
		}
		derr := x.load.Drain(g.ID, 15*time.Second)
		if sc, err := faults.ScrapeURL(ctx, g.Admin); err == nil {
			// What its fallback admitted and no Redis reply has settled (still owed, or
			// voided by the fallback's own refill) is lost with the process.
			open := sc.Sum("ratelimit_fallback_owed_tokens_total") - sc.Sum("ratelimit_fallback_repaid_tokens_total") -
				sc.Sum("ratelimit_fallback_debt_written_off_tokens_total") - sc.Sum("ratelimit_fallback_debt_dropped_tokens_total")
			x.mu.Lock()
			x.log = append(x.log, fmt.Sprintf("          %s stops with %.0f fallback tokens not settled since its start", g.ID, open))
			x.mu.Unlock()
		}
		hctx, cancel := healCtx()
		defer cancel()
		err := g.Process.Restart(hctx)
		x.load.Route(g.ID)
		if derr != nil {
			return derr
		}
		return err
	}
	return x.change(ctx, e)
}

// evicting sets an evicting maxmemory-policy on a region's Redis for e.Hold, and checks
// that every gateway of the region reports it (ratelimit_redis_evicting_policy 1) within
// a reload interval and a second, and reports it gone as long after it is restored.
// Redis's maxmemory stays 0 (unlimited), so nothing is evicted: what is checked is the
// warning, since an evicted bucket has no bound (docs/reliability.md).
func (x *Executor) evicting(ctx context.Context, e Event) error {
	rdb := redis.NewClient(&redis.Options{Addr: x.env.Redis[e.Region].Addr()})
	defer rdb.Close()
	set := func(policy string) error {
		hctx, cancel := healCtx()
		defer cancel()
		return rdb.ConfigSet(hctx, "maxmemory-policy", policy).Err()
	}
	if err := set("allkeys-lru"); err != nil {
		return err
	}
	began := time.Now()
	seen := x.waitPolicy(ctx, e.Region, 1)
	hold(ctx, e.Hold-time.Since(began))
	if err := set("noeviction"); err != nil {
		return err
	}
	gone := x.waitPolicy(ctx, e.Region, 0)
	return errors.Join(seen, gone)
}

// waitPolicy polls the region's gateways until each reports
// ratelimit_redis_evicting_policy want, for at most a reload interval and a second.
func (x *Executor) waitPolicy(ctx context.Context, region string, want float64) error {
	deadline := time.Now().Add(ReloadInterval + time.Second)
	for {
		var missing []string
		for _, g := range x.env.GatewaysOf(region) {
			sc, err := faults.ScrapeURL(ctx, g.Admin)
			if err != nil || sc.Sum("ratelimit_redis_evicting_policy") != want {
				missing = append(missing, g.ID)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("ratelimit_redis_evicting_policy not %v on %v within %v", want, missing, ReloadInterval+time.Second)
		}
		hold(ctx, PollInterval)
	}
}

// refused tries a rule beyond the bounds for e.Tenant, through the store (which
// validates it) and straight into the table (whose CHECK constraints must refuse it too),
// and checks that the rule in the database is still the one last written.
func (x *Executor) refused(ctx context.Context, e Event) error {
	x.mu.Lock()
	r := x.rules[e.Tenant]
	x.mu.Unlock()
	bad := r
	bad.Capacity, bad.RefillPerSecond = e.Capacity, e.Refill
	actx := store.WithAudit(ctx, "torture", e.Kind.String())
	if err := x.env.Store.SetRule(actx, bad); !errors.Is(err, regions.ErrInvalid) {
		return fmt.Errorf("store.SetRule(%+v) = %v, want a regions.ErrInvalid", bad, err)
	}
	_, err := x.env.Store.Pool().Exec(ctx, `UPDATE rate_limit_rule SET capacity = $3, refill_per_second = $4 WHERE tenant_id = $1 AND route_id = $2`,
		bad.Tenant, bad.Route, bad.Capacity, bad.RefillPerSecond)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" { // check_violation
		return fmt.Errorf("an UPDATE to capacity %d, refill %g: %v, want a check violation", bad.Capacity, bad.RefillPerSecond, err)
	}
	got, err := x.env.Store.Rules(ctx, r.Tenant, r.Route)
	if err != nil {
		return err
	}
	if len(got) != 1 || got[0].Capacity != r.Capacity || got[0].RefillPerSecond != r.RefillPerSecond {
		return fmt.Errorf("after a refused rule the database holds %+v, want capacity %d refill %g", got, r.Capacity, r.RefillPerSecond)
	}
	return nil
}

// change writes a change to the database, retrying for a few seconds (a PostgreSQL
// just restarted may refuse the first connection).
func (x *Executor) change(ctx context.Context, e Event) error {
	actx := store.WithAudit(ctx, "torture", e.Kind.String())
	scope := regions.Scope{Tenant: e.Tenant, Route: regions.Wildcard}
	write := func() error {
		x.mu.Lock()
		r := x.rules[e.Tenant]
		x.mu.Unlock()
		switch e.Kind {
		case RuleChange:
			r.Capacity, r.RefillPerSecond = e.Capacity, e.Refill
		case ShardChange:
			r.Shards = e.Shards
		case ShareSet:
			return x.env.Store.SetOverride(actx, scope, e.Shares, "torture", "torture share-set", 0)
		case ShareClear:
			err := x.env.Store.ClearOverride(actx, scope, "torture", "torture share-clear")
			if err != nil && isNotFound(err) {
				return nil
			}
			return err
		case RuleRefused:
			return x.refused(ctx, e)
		default:
			return fmt.Errorf("unknown event kind %v", e.Kind)
		}
		if err := x.env.Store.SetRule(actx, r); err != nil {
			return err
		}
		x.mu.Lock()
		x.rules[e.Tenant] = r
		x.mu.Unlock()
		return nil
	}
	var err error
	for range 10 {
		if err = write(); err == nil {
			return nil
		}
		hold(ctx, 500*time.Millisecond)
	}
	return err
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
