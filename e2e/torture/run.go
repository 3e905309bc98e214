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

	// regionMu is held while a region is removed: a share override cannot be written
	// then (it must name every region), so share changes wait.
	regionMu sync.Mutex

	mu       sync.Mutex
	log      []string
	ran      []ran
	restarts map[string][]Span
	// kills are, per region, the spans from each Redis kill to its restart's end.
	kills     map[string][]Span
	outages   []Span
	errs      []error
	deleted   map[string]bool               // tenant -> its rule deleted (RuleDelete), not written since
	overrides map[string]map[string]float64 // tenant -> its share override, as last written
	extra     map[string][]string           // region -> the gateways its ScaleOut started
}

// NewExecutor prepares to run events; rules are the tenants' rules as written.
func NewExecutor(env *Env, load *Load, rules map[string]regions.Rule) *Executor {
	return &Executor{env: env, load: load, rules: rules, restarts: map[string][]Span{}, kills: map[string][]Span{}, deleted: map[string]bool{},
		overrides: map[string]map[string]float64{}, extra: map[string][]string{}}
}

// Run runs the events at their times after start, each track's in order: faults on one,
// fleet events on another, changes on a third; it returns when every track is done or
// ctx ends. Every fault is healed before Run returns, and a region scaled out is scaled
// in again.
func (x *Executor) Run(ctx context.Context, start time.Time, events []Event) {
	var faults, fleet, changes []Event
	for _, e := range events {
		switch {
		case e.Kind.Fault():
			faults = append(faults, e)
		case e.Kind.Fleet():
			fleet = append(fleet, e)
		default:
			changes = append(changes, e)
		}
	}
	var wg sync.WaitGroup
	for _, track := range [][]Event{faults, fleet, changes} {
		wg.Go(func() {
			for _, e := range track {
				if !waitFor(ctx, start.Add(e.At)) {
					return
				}
				x.Do(ctx, start, e)
			}
		})
	}
	wg.Wait()
	hctx, cancel := healCtx()
	defer cancel()
	for _, r := range x.env.Regions {
		if err := x.scaleIn(hctx, r); err != nil {
			x.mu.Lock()
			x.errs = append(x.errs, fmt.Errorf("scale %s in at the end: %w", r, err))
			x.mu.Unlock()
		}
	}
}

// Do runs one event now and logs it (its time after start) with how long it took;
// Errors has it if it could not be carried out.
func (x *Executor) Do(ctx context.Context, start time.Time, e Event) {
	began := time.Now()
	err := x.do(ctx, e)
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ran = append(x.ran, ran{e, began, time.Now()})
	line := fmt.Sprintf("%8.3fs %s (took %v)", began.Sub(start).Seconds(), e, time.Since(began).Round(time.Millisecond))
	if err != nil {
		line += " ERROR " + err.Error()
		x.errs = append(x.errs, fmt.Errorf("%s: %w", e, err))
	}
	x.log = append(x.log, line)
}

// ran is an event and when it began and ended.
type ran struct {
	Event
	began, ended time.Time
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

// RedisFaults are the spans of the Redis faults that ran (stalls, kills, black holes,
// latency), from when each began to when it was healed.
func (x *Executor) RedisFaults() []Span {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []Span
	for _, r := range x.ran {
		if r.Kind.redisFault() {
			out = append(out, Span{r.began, r.ended})
		}
	}
	return out
}

// Log is what ran, when, and how long it took.
// Quotas are the calendar-quota bands of the tenants' rules.
func (x *Executor) Quotas() []Quota {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []Quota
	for _, id := range sortedKeys(x.rules) {
		for _, b := range x.rules[id].Bands {
			if b.Quota() {
				out = append(out, Quota{Tenant: id, Band: b})
			}
		}
	}
	return out
}

func (x *Executor) Log() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.log...)
}

func (x *Executor) logf(format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.log = append(x.log, "          "+fmt.Sprintf(format, args...))
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

// RedisKills are, per region, the spans from each kill of its Redis to the end of its
// restart (empty).
func (x *Executor) RedisKills() map[string][]Span {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string][]Span{}
	for r, s := range x.kills {
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
		killed := time.Now()
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
		x.kills[e.Region] = append(x.kills[e.Region], Span{From: killed, To: time.Now()})
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
	case GatewayRestart, GatewayKill:
		return x.restart(ctx, e.Gateway, e.Kind == GatewayKill)
	case RollingRestart:
		var errs []error
		for range 2 {
			for _, g := range x.env.LiveOf(e.Region) {
				errs = append(errs, x.restart(ctx, g.ID, false))
			}
		}
		return errors.Join(errs...)
	case ScaleOut:
		return x.scaleOut(ctx, e.Region, e.Gateways)
	case ScaleIn:
		return x.scaleIn(ctx, e.Region)
	case RegionRemove:
		return x.removeRegion(ctx, e)
	}
	return x.change(ctx, e)
}

// owes scrapes gateway g before it stops and reports whether its fallback still owes
// (ratelimit_fallback_debt_tokens: an outage in progress included). The gateway flushes
// its debts as it stops; what it cannot is lost with the process, so the checker counts
// the lost-debt slack for it. A scrape that fails counts as owing.
func (x *Executor) owes(ctx context.Context, g *stack.Gateway) bool {
	sc, err := faults.ScrapeURL(ctx, g.Admin)
	if err != nil {
		x.logf("%s stops unscraped (%v): counted as owing", g.ID, err)
		return true
	}
	open := sc.Sum("ratelimit_fallback_debt_tokens")
	x.logf("%s stops owing %.0f fallback tokens", g.ID, open)
	return open >= 1
}

// restart takes gateway id out of the load, drains it, stops it (SIGTERM, or SIGKILL
// when kill), starts it again and puts it back.
func (x *Executor) restart(ctx context.Context, id string, kill bool) error {
	g := x.env.Gateway(id)
	if g == nil {
		return fmt.Errorf("no gateway %s", id)
	}
	derr := x.load.Drain(id, 15*time.Second)
	serr := x.env.StopGateway(id, kill, x.owes(ctx, g))
	hctx, cancel := healCtx()
	defer cancel()
	err := x.env.StartGateway(hctx, id)
	x.load.Route(id)
	return errors.Join(derr, serr, err)
}

// scaleOut starts gateways in region, all at once, until it runs n, and adds them to the
// load as they become ready.
func (x *Executor) scaleOut(ctx context.Context, region string, n int) error {
	more := n - len(x.env.LiveOf(region))
	errs := make([]error, more)
	var wg sync.WaitGroup
	for i := range more {
		wg.Go(func() {
			g, err := x.env.AddGateway(ctx, region)
			if g != nil {
				x.mu.Lock()
				x.extra[region] = append(x.extra[region], g.ID)
				x.mu.Unlock()
				err = errors.Join(err, x.load.AddTarget(x.env.Target(g)))
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// scaleIn stops, one after the other, the gateways scaleOut started in region: each is
// taken out of the load and drained first.
func (x *Executor) scaleIn(ctx context.Context, region string) error {
	x.mu.Lock()
	ids := x.extra[region]
	delete(x.extra, region)
	x.mu.Unlock()
	var errs []error
	for _, id := range ids {
		derr := x.load.RemoveTarget(id, 15*time.Second)
		owing := false
		if g := x.env.Gateway(id); g != nil {
			owing = x.owes(ctx, g)
		}
		errs = append(errs, derr, x.env.RemoveGateway(ctx, id, owing))
	}
	return errors.Join(errs...)
}

// removeRegion stops every gateway of the region (drained first, as an operator takes a
// region out of DNS before deleting it), removes the region (its shares go to the
// others, store.DropShares), adds it back after e.Hold, writes the share overrides as
// they were (an added region gets 0 of every override), and starts the gateways again.
// Share changes wait meanwhile.
func (x *Executor) removeRegion(ctx context.Context, e Event) error {
	x.regionMu.Lock()
	defer x.regionMu.Unlock()
	var errs []error
	var stopped []string
	for _, g := range x.env.LiveOf(e.Region) {
		errs = append(errs, x.load.Drain(g.ID, 15*time.Second))
		errs = append(errs, x.env.StopGateway(g.ID, false, x.owes(ctx, g)))
		stopped = append(stopped, g.ID)
	}
	actx := store.WithAudit(ctx, "torture", "torture region-remove")
	hctx, cancel := healCtx()
	defer cancel()
	rerr := retry(hctx, func() error {
		err := x.env.Store.RemoveRegion(actx, e.Region, store.DropShares)
		if errors.Is(err, store.ErrNotFound) {
			return nil // an earlier try went through
		}
		return err
	})
	errs = append(errs, rerr)
	if rerr == nil {
		hold(ctx, e.Hold)
	}
	errs = append(errs, retry(hctx, func() error {
		err := x.env.Store.AddRegion(store.WithAudit(hctx, "torture", "torture region-add"), e.Region)
		if errors.Is(err, store.ErrExists) {
			return nil
		}
		return err
	}))
	x.mu.Lock()
	overrides := map[string]map[string]float64{}
	for t, sh := range x.overrides {
		overrides[t] = sh
	}
	x.mu.Unlock()
	for _, t := range sortedKeys(overrides) {
		errs = append(errs, retry(hctx, func() error {
			return x.env.Store.SetOverride(store.WithAudit(hctx, "torture", "torture region-add"), regions.Scope{Tenant: t, Route: regions.Wildcard}, overrides[t], "torture", "override as before the region was removed", 0)
		}))
	}
	for _, id := range stopped {
		errs = append(errs, x.env.StartGateway(hctx, id))
		x.load.Route(id)
	}
	return errors.Join(errs...)
}

// retry runs f until it succeeds or ctx ends, every half second: the database may be
// down (a PostgreSQL kill on the fault track).
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil || ctx.Err() != nil {
			return err
		}
		hold(ctx, 500*time.Millisecond)
	}
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
		for _, g := range x.env.LiveOf(region) {
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
	r, deleted := x.rules[e.Tenant], x.deleted[e.Tenant]
	x.mu.Unlock()
	bad := r
	bad.Capacity, bad.RefillPerSecond = e.Capacity, e.Refill
	actx := store.WithAudit(ctx, "torture", e.Kind.String())
	if err := x.env.Store.SetRule(actx, bad); !errors.Is(err, regions.ErrInvalid) {
		return fmt.Errorf("store.SetRule(%+v) = %v, want a regions.ErrInvalid", bad, err)
	}
	_, err := x.env.Store.Pool().Exec(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant_id, route_id) DO UPDATE SET capacity = EXCLUDED.capacity, refill_per_second = EXCLUDED.refill_per_second`,
		bad.Tenant, bad.Route, bad.Capacity, bad.RefillPerSecond)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" { // check_violation
		return fmt.Errorf("a write of capacity %d, refill %g: %v, want a check violation", bad.Capacity, bad.RefillPerSecond, err)
	}
	got, err := x.env.Store.Rules(ctx, r.Tenant, r.Route)
	if err != nil {
		return err
	}
	if deleted {
		if len(got) != 0 {
			return fmt.Errorf("after a refused rule for a deleted one the database holds %+v, want none", got)
		}
		return nil
	}
	if len(got) != 1 || got[0].Capacity != r.Capacity || got[0].RefillPerSecond != r.RefillPerSecond {
		return fmt.Errorf("after a refused rule the database holds %+v, want capacity %d refill %g", got, r.Capacity, r.RefillPerSecond)
	}
	return nil
}

// change writes a change to the database, retrying for a few seconds (a PostgreSQL
// just restarted may refuse the first connection). Share changes wait while a region
// is removed.
func (x *Executor) change(ctx context.Context, e Event) error {
	actx := store.WithAudit(ctx, "torture", e.Kind.String())
	scope := regions.Scope{Tenant: e.Tenant, Route: regions.Wildcard}
	if e.Kind == ShareSet || e.Kind == ShareClear {
		x.regionMu.Lock()
		defer x.regionMu.Unlock()
	}
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
			if err := x.env.Store.SetOverride(actx, scope, e.Shares, "torture", "torture share-set", 0); err != nil {
				return err
			}
			x.mu.Lock()
			x.overrides[e.Tenant] = e.Shares
			x.mu.Unlock()
			return nil
		case ShareClear:
			err := x.env.Store.ClearOverride(actx, scope, "torture", "torture share-clear")
			if err != nil && !isNotFound(err) {
				return err
			}
			x.mu.Lock()
			delete(x.overrides, e.Tenant)
			x.mu.Unlock()
			return nil
		case RuleDelete:
			err := x.env.Store.DeleteRule(actx, r.Tenant, r.Route)
			if err != nil && !isNotFound(err) { // not found: an earlier try went through
				return err
			}
			x.mu.Lock()
			x.deleted[e.Tenant] = true
			x.mu.Unlock()
			return nil
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
		x.deleted[e.Tenant] = false
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
