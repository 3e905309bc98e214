package job

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/rebalancer"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// Defaults filled in by New.
const (
	DefaultInterval      = 5 * time.Minute
	DefaultCheckInterval = time.Minute
	DefaultReloadWait    = 2 * time.Second
	// DefaultInstanceTTL matches the gateway's default heartbeat (store.DefaultInstanceTTL).
	DefaultInstanceTTL    = store.DefaultInstanceTTL
	DefaultMaxScopes      = 1000
	DefaultMaxShareSeries = 100
	DefaultActor          = "rebalancer"
	// DefaultExpireAfterRuns: a pair's rebalancer rows go after 3 full runs without demand.
	DefaultExpireAfterRuns = 3
	// DefaultStaleAfter is StaleAfter with the defaults: 3 check intervals plus the
	// reload wait.
	DefaultStaleAfter = 3*DefaultCheckInterval + DefaultReloadWait
)

// Store is what a tick needs from the control-plane store (store.Store).
type Store interface {
	Load(ctx context.Context, o store.LoadOptions) (*regions.Snapshot, error)
	WriteRebalancer(ctx context.Context, w store.RebalancerWrite) error
	// RegionsLastSeen is each region's newest gateway heartbeat, cleanly stopped
	// gateways included (store.RegionDark).
	RegionsLastSeen(ctx context.Context) (map[string]time.Time, error)
	// ExpireOverrides deletes the overrides past their expiry, recording each in the
	// share history and the audit log.
	ExpireOverrides(ctx context.Context, actor string) ([]regions.Share, error)
	// PruneUsage deletes the quota usage of periods that started before before.
	PruneUsage(ctx context.Context, before time.Time) (int64, error)
}

// usageKept is how long the quotas' usage rows are kept after their period started: the
// longest period and a week more (the gateways read back 32 days).
const usageKept = 40 * 24 * time.Hour

// epocher is an Elector that hands out a fencing token (*Elector does).
type epocher interface{ Epoch() int64 }

// leaseRepairer is an Elector that can tell a right fence (another leader took over) from
// a broken lease row, and repair the latter (*Elector does; see Elector.RepairLease).
type leaseRepairer interface {
	RepairLease(ctx context.Context) (bool, error)
}

// Hook points (Config.Hook).
const (
	// HookLoaded: the tick has loaded its snapshot and demand, and computed nothing yet.
	HookLoaded = "loaded"
	// HookDecreasesWritten: the decreases are committed and the reload wait is over; the
	// increases are next.
	HookDecreasesWritten = "decreases_written"
)

// DemandReader is what a tick needs from Prometheus (demand.Reader).
type DemandReader interface {
	Read(ctx context.Context, now time.Time) (demand.Demand, error)
}

// Config configures a Job. Zero fields take the defaults above.
type Config struct {
	// Interval is the full run's period; the demand's long window should equal it.
	Interval time.Duration
	// CheckInterval is the fast-path check's period.
	CheckInterval time.Duration
	// ReloadWait is the pause between writing decreases and increases: at least one
	// gateway reload (NOTIFY makes that well under a second; 2 s by default).
	ReloadWait time.Duration
	// InstanceTTL: a gateway unseen for longer is not live; a region with none is dark.
	InstanceTTL time.Duration
	// DryRun computes and logs, and writes nothing.
	DryRun bool
	// Actor names the writer in the share history.
	Actor string
	// Allocation returns the allocation tuning for a scope over n regions; nil means
	// rebalancer.DefaultConfig.
	Allocation func(nRegions int) rebalancer.Config
	// MaxScopes caps the tenant/route pairs rebalanced per tick (the busiest first).
	MaxScopes int
	// MaxShareSeries caps the pairs exported in ratelimit_rebalancer_share_ratio.
	MaxShareSeries int
	// ExpireAfterRuns: the rebalancer rows of a tenant/route pair that was not rebalanced
	// (no demand sample in any region, or not among the MaxScopes busiest) for this many
	// consecutive full runs are deleted, so the pair falls back to the tenant's or "*"'s
	// share instead of keeping a frozen split forever. Runs whose demand is incomplete (a
	// region's Prometheus unreachable, or a live region without region totals) do not
	// count, nor break the sequence; a pair under an operator override keeps its rows
	// while the override is in force. 0 means DefaultExpireAfterRuns; negative never
	// expires.
	ExpireAfterRuns int
	// Elector decides which rebalancer acts (an *Elector in production); nil means this
	// one always does. Used by Run only.
	Elector gocron.Elector
	// NoRetry, in tests, keeps a tick that lost a race (ResultConflict) from being
	// decided again at once, so the half-written state can be looked at.
	NoRetry bool
	// Hook, in tests, is called at the Hook* points of every tick that gets there, so a
	// test can interleave other writers step by step. nil in production.
	Hook func(ctx context.Context, point string)
	// Now is the clock behind the allocation's peak state; nil means time.Now.
	Now        func() time.Time
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Job is the rebalancer. Its methods are safe for concurrent use; ticks never overlap.
type Job struct {
	cfg    Config
	store  Store
	demand DemandReader
	log    *slog.Logger
	m      *metrics

	mu     sync.Mutex // one tick at a time; guards states, absent and exported
	states map[regions.Scope]rebalancer.State
	// absent counts, for each pair with rebalancer rows that was not rebalanced, the
	// consecutive full runs without it (see Config.ExpireAfterRuns). Only scopes with rows
	// are kept, so it is bounded by the share table.
	absent map[regions.Scope]int
	// exported holds the {region, scope} label sets of the share series now exported.
	exported map[[2]string]bool
	// seen and seenAt are the current tick's store.RegionsLastSeen and the database
	// time of its snapshot (store.RegionDark).
	seen   map[string]time.Time
	seenAt time.Time

	lastMu sync.Mutex
	last   Report

	// lockDBDown: the elector last failed to reach PostgreSQL (for logging once).
	lockDBDown atomic.Bool
	// lastTick is when the last tick ended (Unix ns; 0: none yet), and overdue whether
	// the watchdog has reported the current overdue stretch (Run).
	lastTick atomic.Int64
	overdue  atomic.Bool
	// leading: the elector's last answer was yes (Run).
	leading atomic.Bool
}

// New validates cfg and fills defaults. It starts nothing and dials nothing.
func New(cfg Config, store Store, dem DemandReader) (*Job, error) {
	if store == nil || dem == nil {
		return nil, fmt.Errorf("%w job: a store and a demand reader are required", regions.ErrInvalid)
	}
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.CheckInterval = cmp.Or(cfg.CheckInterval, DefaultCheckInterval)
	cfg.ReloadWait = cmp.Or(cfg.ReloadWait, DefaultReloadWait)
	cfg.InstanceTTL = cmp.Or(cfg.InstanceTTL, DefaultInstanceTTL)
	cfg.MaxScopes = cmp.Or(cfg.MaxScopes, DefaultMaxScopes)
	cfg.MaxShareSeries = cmp.Or(cfg.MaxShareSeries, DefaultMaxShareSeries)
	cfg.Actor = cmp.Or(cfg.Actor, DefaultActor)
	cfg.ExpireAfterRuns = cmp.Or(cfg.ExpireAfterRuns, DefaultExpireAfterRuns)
	if cfg.Allocation == nil {
		cfg.Allocation = rebalancer.DefaultConfig
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for name, d := range map[string]time.Duration{"interval": cfg.Interval, "check interval": cfg.CheckInterval,
		"reload wait": cfg.ReloadWait, "instance ttl": cfg.InstanceTTL} {
		if d < 0 {
			return nil, fmt.Errorf("%w job: %s %s must be > 0", regions.ErrInvalid, name, d)
		}
	}
	if cfg.MaxScopes < 0 || cfg.MaxShareSeries < 0 {
		return nil, fmt.Errorf("%w job: max scopes %d and max share series %d must be > 0", regions.ErrInvalid, cfg.MaxScopes, cfg.MaxShareSeries)
	}
	if err := regions.ValidateID("actor", cfg.Actor); err != nil {
		return nil, fmt.Errorf("job: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("job: %w", err)
	}
	return &Job{
		cfg: cfg, store: store, demand: dem, log: orDiscard(cfg.Logger), m: m,
		states: map[regions.Scope]rebalancer.State{}, absent: map[regions.Scope]int{},
	}, nil
}

// Report is the outcome of one tick, for logs and the status page.
type Report struct {
	At     time.Time
	Kind   string // "run" or "check"
	Result string // one of the Result* constants
	Err    error
	DryRun bool
	// Scopes lists every scope considered, "*" first.
	Scopes []ScopeReport
	// Written is the number of region shares written (deletions not included).
	Written int
	// Expired lists the tenant/route pairs whose rebalancer rows the run deleted (a dry
	// run: would have deleted) after Config.ExpireAfterRuns runs without demand.
	Expired []regions.Scope
	// Retried is the result of a first attempt that lost a race (ResultConflict: a
	// region or share changed between the read and a write) when this report is of the
	// full run decided again at once from a fresh read; "" otherwise.
	Retried string
}

// ScopeReport is one scope's decision.
type ScopeReport struct {
	Inputs ScopeInputs
	// Written says whether its shares were written; Skipped why not ("" when written).
	// Inputs.Regions[i].Share is the computed share either way.
	Written bool
	Skipped string
}

// ScopeInputs is what the history row of every change in a scope holds: enough for
// `ratectl shares history` to explain the change.
type ScopeInputs struct {
	Scope string `json:"scope"`
	// Reason is why the shares changed (or not): interval, throttling, dark, returned,
	// hysteresis, no_trigger, override, or expired (the rows were deleted; see
	// ReasonExpired).
	Reason string `json:"reason"`
	// Region names the region behind a fast-path reason.
	Region string `json:"region,omitempty"`
	Kind   string `json:"kind"` // run or check
	// Split is how the shares were computed: SplitWaterfill for a tenant/route pair (one
	// bucket), SplitProportional for "*" (many buckets; see Job).
	Split string `json:"split,omitempty"`
	// RefillPerSecond and Capacity are the scope's rule: for "*" the default rule, which
	// every tenant without a rule of its own gets.
	RefillPerSecond float64       `json:"refill_per_second"`
	Capacity        int64         `json:"capacity"`
	Regions         []RegionInput `json:"regions"`
	// AbsentRuns, for an expiry, is the number of consecutive full runs the pair was not
	// rebalanced.
	AbsentRuns int `json:"absent_runs,omitempty"`
}

// ReasonExpired is the ScopeInputs.Reason of a pair's deleted rows: it was not rebalanced
// for Config.ExpireAfterRuns full runs. Its regions' Previous is the deleted share, Share
// the one the pair falls back to (its tenant's or "*"'s, as loaded by the run).
const ReasonExpired = "expired"

// Values of ScopeInputs.Split.
const (
	SplitWaterfill    = "waterfill"
	SplitProportional = "proportional"
)

// RegionInput is one region's inputs and result in one scope.
type RegionInput struct {
	Region string            `json:"region"`
	Status rebalancer.Status `json:"status"`
	// Offered rates (requests per second) over the long and short windows; allowed and
	// throttled over the long window. Zero unless status is ok. Requests a shadow rule
	// would have rejected were forwarded: they count as allowed (offered, not throttled).
	// For "*" the rates are the region's traffic outside the pairs with a scope of their
	// own.
	OfferedLong  float64 `json:"offered_long_rps"`
	OfferedShort float64 `json:"offered_short_rps"`
	Allowed      float64 `json:"allowed_rps"`
	Throttled    float64 `json:"throttled_rps"`
	// Demand is what the allocation used, Peak its decayed peak.
	Demand   float64          `json:"demand_rps"`
	Peak     float64          `json:"peak_rps"`
	Previous float64          `json:"previous_share"`
	Share    float64          `json:"share"`
	Basis    rebalancer.Basis `json:"basis,omitempty"`
}

// Last returns the report of the last tick (zero before the first).
func (j *Job) Last() Report {
	j.lastMu.Lock()
	defer j.lastMu.Unlock()
	return j.last
}

type kind int

const (
	kindRun kind = iota
	kindCheck
)

func (k kind) String() string {
	if k == kindRun {
		return "run"
	}
	return "check"
}

// tick is the rebalancer's name for the kind.
func (k kind) tick() rebalancer.Tick {
	if k == kindRun {
		return rebalancer.FullRun
	}
	return rebalancer.CheckTick
}

// RunOnce runs one full tick now, whoever leads (--once takes the lock itself).
func (j *Job) RunOnce(ctx context.Context) (Report, error) { return j.tick(ctx, kindRun) }

// Check runs one fast-path check now: it writes only the scopes whose trigger fires.
func (j *Job) Check(ctx context.Context) (Report, error) { return j.tick(ctx, kindCheck) }

// tick reads, allocates and writes; the error is the Report's Err.
func (j *Job) tick(ctx context.Context, k kind) (Report, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	rep := j.timedTick(ctx, k)
	if rep.Result == ResultConflict && !j.cfg.NoRetry && ctx.Err() == nil {
		// A write lost a race with a region or share change: what committed (the
		// decreases, perhaps rescaled by a region removal) may sum to 1 yet not be what a
		// correct run writes. Decide again at once, as a full run, from a fresh read: it
		// writes the correct shares, or nothing when the hysteresis finds them close.
		j.log.Warn("rebalancer write lost a race with a region or share change; deciding again from a fresh read",
			"kind", k.String(), "err", rep.Err)
		j.m.retries.WithLabelValues(ResultConflict).Inc()
		rep = j.timedTick(ctx, kindRun)
		rep.Retried = ResultConflict
	}
	if r, ok := j.cfg.Elector.(leaseRepairer); ok && rep.Result == ResultFenced && ctx.Err() == nil {
		// Fenced although this process may still hold the lock: a lease row edited, reset
		// or deleted would fence the only leader for ever. Repair it (the lock proves
		// nobody else leads), say so loudly, and decide again.
		switch repaired, err := r.RepairLease(ctx); {
		case err != nil:
			j.m.leaseRepairs.WithLabelValues("failed").Inc()
			j.log.Error("rebalancer lease is broken and could not be repaired; writes stay fenced", "err", err)
		case repaired:
			j.m.leaseRepairs.WithLabelValues("repaired").Inc()
			if !j.cfg.NoRetry {
				retried := rep.Result
				rep = j.timedTick(ctx, kindRun)
				rep.Retried = retried
			}
		}
	}
	level := slog.LevelInfo
	if rep.Result != ResultOK {
		level = slog.LevelWarn
	}
	if rep.Result != ResultOK || rep.Written > 0 || k == kindRun {
		j.log.Log(ctx, level, "rebalancer tick", "kind", rep.Kind, "result", rep.Result, "retried", rep.Retried,
			"scopes", len(rep.Scopes), "shares_written", rep.Written, "scopes_expired", len(rep.Expired),
			"dry_run", rep.DryRun, "err", rep.Err)
	}
	j.lastMu.Lock()
	j.last = rep
	j.lastMu.Unlock()
	end := time.Now()
	j.lastTick.Store(end.UnixNano())
	j.m.lastTick.Set(float64(end.UnixNano()) / 1e9)
	if j.overdue.Swap(false) {
		j.log.Info("rebalancer ticks again", "kind", rep.Kind, "result", rep.Result)
	}
	return rep, rep.Err
}

// StaleAfter is how long this rebalancer may go without ending a tick before it is
// overdue: 3 of its shorter tick periods (interval, check interval) plus the reload
// wait a tick may spend between its writes. The status page shows it stale then.
func (j *Job) StaleAfter() time.Duration {
	return 3*min(j.cfg.Interval, j.cfg.CheckInterval) + j.cfg.ReloadWait
}

// watchOverdue reports, once per stretch, a leader whose ticks stopped ending: a tick
// hung (a database call without an answer), or the scheduler stopped. It logs, counts
// ratelimit_rebalancer_overdue_total and keeps ratelimit_rebalancer_last_tick_timestamp_
// seconds as it is, for an alert on time() minus it. A replica that does not lead is
// never overdue (it does not tick). started is when Run began.
func (j *Job) watchOverdue(now, started time.Time, leading bool) {
	last := started
	if ns := j.lastTick.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	late := now.Sub(last)
	if !leading || late <= j.StaleAfter() || j.overdue.Swap(true) {
		return
	}
	j.m.overdue.Inc()
	j.log.Warn("rebalancer tick overdue: no tick ended within its bound", "since_last_tick", late.Round(time.Millisecond),
		"bound", j.StaleAfter())
}

// timedTick is one tickLocked, timed and counted.
func (j *Job) timedTick(ctx context.Context, k kind) Report {
	start := time.Now()
	rep := j.tickLocked(ctx, k)
	j.m.duration.WithLabelValues(k.String()).Observe(time.Since(start).Seconds())
	j.m.count(k, rep.Result)
	if rep.Result == ResultOK && k == kindRun {
		j.m.lastSuccess.Set(float64(rep.At.UnixNano()) / 1e9)
	}
	return rep
}

func (j *Job) tickLocked(ctx context.Context, k kind) Report {
	now := j.cfg.Now()
	rep := Report{At: now, Kind: k.String(), DryRun: j.cfg.DryRun}
	fail := func(result string, err error) Report {
		rep.Result, rep.Err = result, err
		return rep
	}
	// The fencing token is taken before anything is read: every write of this tick lands
	// only while the leadership that read it lasts.
	var epoch int64
	if el, ok := j.cfg.Elector.(epocher); ok && !j.cfg.DryRun {
		if epoch = el.Epoch(); epoch == 0 {
			return fail(ResultNotLeader, fmt.Errorf("rebalance: %w: no leadership epoch", ErrNotLeader))
		}
	}
	if !j.cfg.DryRun {
		// Every override's end leaves a history and audit row (the gateways stopped
		// applying it at its expiry, with or without this).
		gone, err := j.store.ExpireOverrides(ctx, j.cfg.Actor)
		if err != nil {
			return fail(ResultSkippedDatabase, fmt.Errorf("rebalance: %w", err))
		}
		for _, sh := range gone {
			j.log.Info("operator override expired", "scope", sh.Scope.String(), "region", sh.Region,
				"share", sh.Share, "expired_at", sh.ExpiresAt)
		}
		j.m.overridesExpired.Add(float64(len(gone)))
		if k == kindRun {
			// The usage of quota periods long over: nothing reads it any more.
			if n, err := j.store.PruneUsage(ctx, now.Add(-usageKept)); err != nil {
				j.log.Warn("quota usage not pruned", "err", err)
			} else if n > 0 {
				j.log.Info("quota usage pruned", "rows", n)
			}
		}
	}
	snap, err := j.store.Load(ctx, store.LoadOptions{InstanceTTL: j.cfg.InstanceTTL, WithoutKeys: true})
	if err != nil {
		return fail(ResultSkippedDatabase, fmt.Errorf("rebalance: %w", err))
	}
	if j.seen, err = j.store.RegionsLastSeen(ctx); err != nil {
		return fail(ResultSkippedDatabase, fmt.Errorf("rebalance: %w", err))
	}
	j.seenAt = snap.LoadedAt()
	d, err := j.demand.Read(ctx, now)
	if err != nil {
		return fail(ResultSkippedPrometheus, fmt.Errorf("rebalance: %w", err))
	}
	for region, err := range d.Unreachable {
		j.log.Warn("prometheus of region unreachable; its demand is unknown", "region", region, "err", err)
	}
	j.at(ctx, HookLoaded)

	regs := snap.Regions()
	var first, second []store.ShareChange
	var allocErrs []error
	if len(regs) >= 2 {
		pairs := j.pairScopes(d)
		live := make(map[regions.Scope]bool, len(pairs))
		for _, sc := range pairs {
			live[sc] = true
		}
		// The pairs first: "*" governs exactly the traffic of the pairs that have no rows
		// of their own after this run (globalDemand), so it must know which get some now.
		written := map[regions.Scope]bool{}
		rep.Scopes = append(rep.Scopes, ScopeReport{})
		for _, sc := range pairs {
			sr, f, s, err := j.decide(snap, d, regs, sc, k, now)
			if err != nil {
				allocErrs = append(allocErrs, err)
			}
			written[sc] = sr.Skipped == "" && len(f)+len(s) > 0
			rep.Scopes = append(rep.Scopes, sr)
			first, second = append(first, f...), append(second, s...)
		}
		sr, f, s, err := j.decide(snap, globalDemand(snap, d, written), regs, regions.GlobalScope, k, now)
		if err != nil {
			allocErrs = append(allocErrs, err)
		}
		rep.Scopes[0] = sr
		first, second = append(f, first...), append(s, second...)
		if k == kindRun {
			maps.DeleteFunc(j.states, func(sc regions.Scope, _ rebalancer.State) bool {
				return sc != regions.GlobalScope && !live[sc]
			})
			var del []store.ShareChange
			del, rep.Expired = j.expire(snap, d, regs, live)
			first = append(first, del...)
		}
	}

	switch {
	case j.cfg.DryRun:
		for _, c := range append(first, second...) {
			if c.Delete {
				j.log.Info("dry run: would delete share", "scope", c.Scope.String(), "region", c.Region,
					"old", c.Old, "reason", c.Reason)
				continue
			}
			j.log.Info("dry run: would write share", "scope", c.Scope.String(), "region", c.Region,
				"old", c.Old, "new", c.New, "reason", c.Reason)
		}
		for i := range rep.Scopes {
			if rep.Scopes[i].Skipped == "" {
				rep.Scopes[i].Skipped = SkipDryRun
				j.m.writesSkipped.WithLabelValues(SkipDryRun).Inc()
			}
		}
	case len(first)+len(second) > 0:
		firstDone, err := j.write(ctx, snap, regs, epoch, first, second)
		if !firstDone {
			rep.Expired = nil // they go with the first write, so the next run retries them
		} else {
			// The first write (the decreases) committed, whatever befalls the second:
			// count its rows now, or a fenced second write would hide them.
			for _, c := range first {
				if !c.Delete && c.New != c.Old { // not a region's current share made a row
					rep.Written++
				}
			}
			j.m.shareWrites.Add(float64(rep.Written))
		}
		j.expired(rep.Expired)
		if err != nil {
			// A write refused because this rebalancer no longer leads, or because the rows
			// changed under it, abandons the run: the next check reads again and heals a
			// scope left summing below 1 by a committed decrease.
			// PostgreSQL down is a skipped run; a write it refuses as invalid, or one cut
			// short by shutdown, is an error.
			switch {
			case errors.Is(err, store.ErrFenced):
				j.m.writesRefused.WithLabelValues(ResultFenced).Inc()
				return fail(ResultFenced, err)
			case errors.Is(err, store.ErrConflict):
				j.m.writesRefused.WithLabelValues(ResultConflict).Inc()
				return fail(ResultConflict, err)
			case errors.Is(err, regions.ErrInvalid) || ctx.Err() != nil:
				return fail(ResultError, err)
			}
			return fail(ResultSkippedDatabase, err)
		}
		rep.Written += len(second)
		j.m.shareWrites.Add(float64(len(second)))
		for i := range rep.Scopes {
			rep.Scopes[i].Written = rep.Scopes[i].Skipped == ""
		}
	}
	if k == kindRun {
		j.exportShares(rep.Scopes)
	}
	rep.Result = ResultOK
	if len(allocErrs) > 0 {
		// The other scopes were decided (and written); the run still failed at its job.
		rep.Result, rep.Err = ResultError, fmt.Errorf("rebalance: %w", errors.Join(allocErrs...))
	}
	return rep
}

// expire counts, for every tenant/route pair with rebalancer rows, the consecutive full
// runs in which it was not rebalanced (not in live: no demand sample in any region, or
// cut by MaxScopes), and returns Delete changes for every row of the pairs that reached
// Config.ExpireAfterRuns, with those pairs. A run whose demand is incomplete — a region's
// Prometheus unreachable, or a live region without region totals, so a pair's absence may
// only be missing metrics — neither counts nor resets. A pair under an operator override
// keeps its rows (the override decides it anyway) and its count, and goes once the
// override ends. Counters of scopes without rows are dropped, so they stay bounded.
func (j *Job) expire(snap *regions.Snapshot, d demand.Demand, regs []string, live map[regions.Scope]bool) ([]store.ShareChange, []regions.Scope) {
	if j.cfg.ExpireAfterRuns < 0 {
		return nil, nil
	}
	complete := len(d.Unreachable) == 0
	for _, r := range regs {
		if _, fresh := d.Sample(regions.GlobalScope, r); (!fresh || !scraped(snap, d, r)) && j.live(r) {
			complete = false
		}
	}
	var (
		changes []store.ShareChange
		expired []regions.Scope
	)
	withRows := map[regions.Scope]bool{}
	for _, sc := range snap.RebalancerScopes() {
		if sc.Tenant == regions.Wildcard || sc.Route == regions.Wildcard {
			continue // "*" and tenant scopes are not pairs
		}
		withRows[sc] = true
		if live[sc] {
			delete(j.absent, sc)
			continue
		}
		if !complete {
			continue
		}
		j.absent[sc]++
		n := j.absent[sc]
		if n < j.cfg.ExpireAfterRuns {
			continue
		}
		overridden := false
		for _, r := range regs {
			if _, src := snap.Share(r, sc.Tenant, sc.Route); src == regions.SourceOverride {
				overridden = true
			}
		}
		if overridden {
			j.log.Debug("pair without demand keeps its shares under an override", "tenant", sc.Tenant, "route", sc.Route, "absent_runs", n)
			continue
		}
		c := j.expiry(snap, regs, sc, n)
		if len(c) > 0 {
			changes, expired = append(changes, c...), append(expired, sc)
		}
	}
	maps.DeleteFunc(j.absent, func(sc regions.Scope, _ int) bool { return !withRows[sc] })
	return changes, expired
}

// expired records pairs whose rows were deleted.
func (j *Job) expired(scopes []regions.Scope) {
	for _, sc := range scopes {
		j.log.Info("rebalancer shares of pair expired", "tenant", sc.Tenant, "route", sc.Route,
			"absent_runs", j.absent[sc])
		delete(j.absent, sc)
	}
	j.m.expiredScopes.Add(float64(len(scopes)))
}

// expiry is the Delete change of every rebalancer row of pair sc, absent for n runs.
func (j *Job) expiry(snap *regions.Snapshot, regs []string, sc regions.Scope, n int) []store.ShareChange {
	rule := snap.Rule(sc.Tenant, sc.Route)
	in := ScopeInputs{Scope: sc.String(), Reason: ReasonExpired, Kind: kindRun.String(), Split: SplitWaterfill,
		RefillPerSecond: rule.RefillPerSecond, Capacity: rule.Capacity, AbsentRuns: n}
	var rows []regions.Share
	for _, r := range regs {
		sh, ok := snap.ScopeRow(r, sc)
		if !ok || sh.Source != regions.SourceRebalancer {
			continue
		}
		rows = append(rows, sh)
		in.Regions = append(in.Regions, RegionInput{Region: r,
			Status:   rebalancer.RegionStatus(j.live(r), false),
			Previous: sh.Share, Share: fallbackShare(snap, r, sc, len(regs))})
	}
	reason := fmt.Sprintf("%s: no demand for %d runs", ReasonExpired, n)
	out := make([]store.ShareChange, 0, len(rows))
	for _, sh := range rows {
		out = append(out, store.ShareChange{Scope: sc, Region: sh.Region, Old: sh.Share, Delete: true, Reason: reason, Inputs: in})
	}
	return out
}

// fallbackShare is the share pair sc gets in region once its own rows are gone: its
// tenant's, else "*"'s, else the equal split (rows as loaded by the run).
func fallbackShare(snap *regions.Snapshot, region string, sc regions.Scope, n int) float64 {
	for _, wider := range [...]regions.Scope{{Tenant: sc.Tenant, Route: regions.Wildcard}, regions.GlobalScope} {
		if sh, ok := snap.ScopeRow(region, wider); ok {
			return sh.Share
		}
	}
	return 1 / float64(n)
}

// pairScopes lists the busiest MaxScopes tenant/route pairs with demand.
func (j *Job) pairScopes(d demand.Demand) []regions.Scope {
	pairs := d.PairScopes()
	if len(pairs) > j.cfg.MaxScopes {
		offered := func(sc regions.Scope) float64 {
			sum := 0.0
			for _, s := range d.Scopes[sc] {
				sum += s.Long.Offered()
			}
			return sum
		}
		slices.SortStableFunc(pairs, func(a, b regions.Scope) int { return cmp.Compare(offered(b), offered(a)) })
		pairs = pairs[:j.cfg.MaxScopes]
	}
	return pairs
}

// globalDemand returns d with the "*" samples replaced by the traffic "*" governs: in
// each region, the region total minus every pair with a share of its own there — a share
// row (rebalancer or override) for the pair or its tenant in that region, or rows this run
// writes (written). What remains is the traffic of exactly the tenants that follow "*"
// (the folded _other included): new tenants, single-region tenants whose pair is never
// written (their other region is a missing series, unknown, so the pair keeps the shares
// it follows), tenants past the tracked set. A pair that is merely rebalanced without a
// write still follows "*", so its traffic stays in (issue 22: subtracting it left "*"
// with a new tenant's first request only, and moved it to that tenant's region).
func globalDemand(snap *regions.Snapshot, d demand.Demand, written map[regions.Scope]bool) demand.Demand {
	own := func(sc regions.Scope, region string) bool {
		if written[sc] {
			return true
		}
		_, pair := snap.ScopeRow(region, sc)
		_, tenant := snap.ScopeRow(region, regions.Scope{Tenant: sc.Tenant, Route: regions.Wildcard})
		return pair || tenant
	}
	totals := d.Scopes[regions.GlobalScope]
	g := make(map[string]demand.Sample, len(totals))
	for region, total := range totals {
		for sc, byRegion := range d.Scopes {
			smp, ok := byRegion[region]
			if sc == regions.GlobalScope || !ok || !own(sc, region) {
				continue
			}
			total.Long, total.Short = minus(total.Long, smp.Long), minus(total.Short, smp.Short)
		}
		g[region] = total
	}
	out := d
	out.Scopes = maps.Clone(d.Scopes)
	out.Scopes[regions.GlobalScope] = g
	return out
}

// minus is a - b per decision. A difference within rounding of 0 (rates of equal
// counters) is 0, and it is never below 0 (the two metrics may be scraped apart).
func minus(a, b demand.Rates) demand.Rates {
	sub := func(x, y float64) float64 {
		if v := x - y; v > max(1e-6, 1e-9*x) {
			return v
		}
		return 0
	}
	return demand.Rates{
		Allowed:         sub(a.Allowed, b.Allowed),
		Throttled:       sub(a.Throttled, b.Throttled),
		ShadowThrottled: sub(a.ShadowThrottled, b.ShadowThrottled),
	}
}

// allocationRates are the rates the allocation sees. A request a shadow rule would have
// rejected was forwarded: it is offered demand, and allowed — counting it as throttled
// would fire the fast path and the hysteresis' "throttled" gain although nothing was
// rejected.
func allocationRates(r demand.Rates) rebalancer.Rates {
	return rebalancer.Rates{Allowed: r.Allowed + r.ShadowThrottled, Throttled: r.Throttled}
}

// decide builds one scope's inputs and runs the allocation; it returns the scope's report
// and its changes split into decreases (first) and increases (second). The error is the
// allocation refusing its input (the scope is then skipped).
//
// A tenant/route pair is one token bucket: its global refill is water-filled between the
// regions (rebalancer.Decide). "*" is different: its share scales every tenant without a
// share of its own, many independent buckets, so there is no single refill to fill and
// "demand fits the limit" means nothing for it (the region totals are not one tenant's
// demand). "*" is split in proportion to the offered traffic it governs (globalDemand):
// the allocation is charged with a refill equal to the ok regions' total demand, no
// headroom and no peaks, so it always ends in its first stage, the demand-weighted split
// (floors protected): headroom, peak reserve and equal rest are empty by construction.
// Dark, unknown, overrides, the fast path and the hysteresis work as for a pair.
func (j *Job) decide(snap *regions.Snapshot, d demand.Demand, regs []string, sc regions.Scope, k kind, now time.Time) (ScopeReport, []store.ShareChange, []store.ShareChange, error) {
	rule := snap.Rule(sc.Tenant, sc.Route)
	limit := regions.Limit{Capacity: rule.Capacity, RefillPerSecond: rule.RefillPerSecond}
	global := sc == regions.GlobalScope
	sr := ScopeReport{Inputs: ScopeInputs{Scope: sc.String(), Kind: k.String(), Split: SplitWaterfill,
		RefillPerSecond: limit.RefillPerSecond, Capacity: limit.Capacity}}
	if global {
		sr.Inputs.Split = SplitProportional
	}
	skip := func(reason string, err error) (ScopeReport, []store.ShareChange, []store.ShareChange, error) {
		sr.Skipped = reason
		if sr.Inputs.Reason == "" {
			sr.Inputs.Reason = reason
		}
		j.m.writesSkipped.WithLabelValues(reason).Inc()
		return sr, nil, nil, err
	}

	in := make([]rebalancer.RegionInput, 0, len(regs))
	overridden, anyOK, total := false, false, 0.0
	for _, r := range regs {
		share, o := currentShare(snap, r, sc, len(regs))
		overridden = overridden || o
		smp, fresh := d.Sample(sc, r)
		if !fresh && !global && d.KnownZero(sc, r) {
			// No series of its own and nothing folded in this region: the pair offers
			// nothing here (known, not unknown), so a single-region tenant's pair is
			// split by its demand and gets rows of its own (issue 22).
			smp, fresh = demand.Sample{}, true
		}
		fresh = fresh && scraped(snap, d, r)
		ri := rebalancer.RegionInput{Region: r, Share: share, Status: j.status(d, r, fresh),
			DarkFloor: darkFloor(snap, r, sc)}
		if ri.Status == rebalancer.StatusOK {
			ri.Long, ri.Short = allocationRates(smp.Long), allocationRates(smp.Short)
			anyOK, total = true, total+ri.Short.Offered()
		}
		in = append(in, ri)
	}
	unchanged := func() {
		for _, ri := range in {
			sr.Inputs.Regions = append(sr.Inputs.Regions, RegionInput{Region: ri.Region, Status: ri.Status,
				OfferedLong: ri.Long.Offered(), OfferedShort: ri.Short.Offered(), Allowed: ri.Long.Allowed,
				Throttled: ri.Long.Throttled, Previous: ri.Share, Share: ri.Share})
		}
	}
	if overridden {
		unchanged()
		return skip(SkipOverride, nil)
	}
	cfg, st := j.cfg.Allocation(len(regs)), j.states[sc]
	noDemand := false
	if global {
		// No headroom, no peak reserve. Demand below the minimum of the default rule's
		// refill (rebalancer.Quiet, as for any scope: a trickle, a new tenant's first
		// requests), or none at all (every request belongs to a pair with its own shares),
		// moves nothing: the ok regions keep their shares and the hysteresis writes only
		// to shrink a dark region.
		cfg.Headroom, st = 0, withoutPeaks(st)
		noDemand = anyOK && (total <= 0 || rebalancer.Quiet(cfg, limit.RefillPerSecond, in))
		if !noDemand {
			limit.RefillPerSecond = total
		}
	}

	// A scope whose shares do not sum to 1 (a run's decreases committed, its increases
	// refused) is healed by the next tick, check or run: decide it as a full run would.
	sum := 0.0
	for _, ri := range in {
		sum += ri.Share
	}
	heal := math.Abs(sum-1) > regions.ShareTolerance
	tick := k.tick()
	if heal {
		tick = rebalancer.FullRun
	}
	dec, err := rebalancer.Decide(cfg, limit, now, in, st, tick)
	if err != nil {
		unchanged()
		return skip(SkipError, fmt.Errorf("allocate %s: %w", sc, err))
	}
	j.states[sc] = dec.Allocation.State
	sr.Inputs.Reason, sr.Inputs.Region = dec.Reason, dec.Region
	byRegion := make(map[string]rebalancer.RegionAllocation, len(dec.Allocation.Regions))
	for _, ra := range dec.Allocation.Regions {
		if global && ra.Basis == rebalancer.BasisWaterfill {
			ra.Basis = BasisProportional
		}
		byRegion[ra.Region] = ra
	}
	for _, ri := range in {
		ra := byRegion[ri.Region]
		sr.Inputs.Regions = append(sr.Inputs.Regions, RegionInput{
			Region: ri.Region, Status: ri.Status,
			OfferedLong: ri.Long.Offered(), OfferedShort: ri.Short.Offered(),
			Allowed: ri.Long.Allowed, Throttled: ri.Long.Throttled,
			Demand: ra.Demand, Peak: ra.Peak, Previous: ri.Share, Share: ra.Share, Basis: ra.Basis,
		})
	}
	if !dec.Write {
		if noDemand {
			sr.Inputs.Reason = SkipNoDemand
			return skip(SkipNoDemand, nil)
		}
		return skip(dec.Reason, nil)
	}
	reason := dec.Reason
	if dec.Region != "" {
		reason += ": " + dec.Region
	}
	// A dark region's row at the floor says so whatever the tick (darkFloor reads it when
	// the region is back).
	rowReason := func(region string) string {
		if ra := byRegion[region]; ra.Status == rebalancer.StatusDark && ra.Basis == rebalancer.BasisFloor {
			return darkReason(region)
		}
		return reason
	}
	changes := func(m map[string]float64) []store.ShareChange {
		var out []store.ShareChange
		for _, ri := range in {
			if v, ok := m[ri.Region]; ok {
				out = append(out, store.ShareChange{Scope: sc, Region: ri.Region, Old: ri.Share, New: v, Reason: rowReason(ri.Region), Inputs: sr.Inputs})
			}
		}
		return out
	}
	first, second := changes(dec.First), changes(dec.Second)
	// Every region gets a row of the scope with the first write: a region without one
	// (it had the equal split, or a wider scope's share) gets its current share, so the
	// scope's rows name every region between the two writes too — a region removed
	// meanwhile renormalises what the regions really have.
	for _, ri := range in {
		if _, ok := snap.ScopeShareOf(ri.Region, sc, regions.SourceRebalancer); ok {
			continue
		}
		if _, dec := dec.First[ri.Region]; dec {
			continue
		}
		first = append(first, store.ShareChange{Scope: sc, Region: ri.Region, Old: ri.Share, New: ri.Share, Reason: rowReason(ri.Region), Inputs: sr.Inputs})
	}
	return sr, first, second, nil
}

// withoutPeaks is st with every peak at 0 (the "*" scope has no peak reserve).
func withoutPeaks(st rebalancer.State) rebalancer.State {
	out := rebalancer.State{At: st.At, Regions: make(map[string]rebalancer.RegionState, len(st.Regions))}
	for r, rs := range st.Regions {
		rs.Peak = 0
		out.Regions[r] = rs
	}
	return out
}

// currentShare is region's share in force for scope, and whether an operator override
// decides it (then the rebalancer leaves the scope alone). For "*" it is the scope's own
// row, else the equal split; for a pair it is what the gateways enforce for it
// (Share), so an override at the tenant or "*" covers the pair too.
func currentShare(snap *regions.Snapshot, region string, sc regions.Scope, n int) (float64, bool) {
	if sc == regions.GlobalScope {
		sh, ok := snap.ScopeRow(region, sc)
		if !ok {
			return 1 / float64(n), false
		}
		return sh.Share, sh.Source == regions.SourceOverride
	}
	share, src := snap.Share(region, sc.Tenant, sc.Route)
	return share, src == regions.SourceOverride
}

// write stores the decreases (and expired pairs' deletions), waits one gateway reload
// period, then stores the increases, so the shares gateways enforce never sum above 1.
// firstDone says whether the first write was committed, even when err is not nil.
//
// Both writes are fenced (epoch) and compare-and-set: each lands only if the region set
// is still regs and every rebalancer row of the scopes it touches still holds what the
// run read from snap — or, for the second write, what the first wrote. Otherwise it is
// refused (store.ErrConflict) and the run abandoned; history records the replaced values.
func (j *Job) write(ctx context.Context, snap *regions.Snapshot, regs []string, epoch int64, first, second []store.ShareChange) (firstDone bool, err error) {
	// The rows as read, for every scope either write touches.
	expect := map[[2]string]*float64{}
	scopes := map[regions.Scope]bool{}
	for _, c := range append(slices.Clone(first), second...) {
		scopes[c.Scope] = true
	}
	for sc := range scopes {
		for _, r := range regs {
			var v *float64
			if sh, ok := snap.ScopeShareOf(r, sc, regions.SourceRebalancer); ok {
				v = &sh.Share
			}
			expect[[2]string{sc.String(), r}] = v
		}
	}
	expectList := func() []store.ExpectedShare {
		out := make([]store.ExpectedShare, 0, len(expect))
		for sc := range scopes {
			for _, r := range regs {
				out = append(out, store.ExpectedShare{Scope: sc, Region: r, Source: regions.SourceRebalancer, Share: expect[[2]string{sc.String(), r}]})
			}
		}
		return out
	}
	w := func(changes []store.ShareChange) error {
		return j.store.WriteRebalancer(ctx, store.RebalancerWrite{Changes: changes, Actor: j.cfg.Actor,
			Epoch: epoch, Regions: regs, Expect: expectList()})
	}
	if len(first) > 0 {
		if err := w(first); err != nil {
			return false, fmt.Errorf("rebalance: write decreases: %w", err)
		}
		for _, c := range first {
			var v *float64
			if !c.Delete {
				v = &c.New
			}
			expect[[2]string{c.Scope.String(), c.Region}] = v
		}
		if len(second) > 0 {
			t := time.NewTimer(j.cfg.ReloadWait)
			select {
			case <-ctx.Done():
				t.Stop()
				return true, fmt.Errorf("rebalance: increases not written (decreases were): %w", ctx.Err())
			case <-t.C:
			}
			j.at(ctx, HookDecreasesWritten)
		}
	}
	if len(second) > 0 {
		if err := w(second); err != nil {
			return true, fmt.Errorf("rebalance: write increases (decreases were written): %w", err)
		}
	}
	return true, nil
}

func (j *Job) at(ctx context.Context, point string) {
	if j.cfg.Hook != nil {
		j.cfg.Hook(ctx, point)
	}
}

// scraped says whether d holds the traffic of every running gateway of region: at least
// as many fresh scrape targets as live heartbeats. A region that lost a scrape target
// reads lower than it is (half, with one of two gateways unscraped: issue 22), and its
// demand is unknown until the target is back or its gateway is gone — missing is
// unknown, not zero. A reader that does not count targets (nil) is trusted.
func scraped(snap *regions.Snapshot, d demand.Demand, region string) bool {
	return d.Targets == nil || d.Targets[region] >= snap.LiveInstances(region)
}

// status classifies region for one scope from its live heartbeats and whether the scope
// has a fresh sample of all its gateways there (fresh). Whether a region whose gateways
// are scraped but cannot heartbeat (cut off from PostgreSQL) should be unknown rather
// than dark is open: counting its scrape targets kept a region whose gateways had
// stopped from ever going dark in 2 of 4 fault-suite runs, so it is dark again, and a
// quiet scope heals when it returns (rebalancer healReturned).
func (j *Job) status(d demand.Demand, region string, fresh bool) rebalancer.Status {
	return rebalancer.RegionStatus(j.live(region), fresh)
}

// darkReason is the reason of the row of a region set to the floor because it was dark.
func darkReason(region string) string { return rebalancer.ReasonDark + ": " + region }

// darkFloor says region's own rebalancer row of sc was set to the floor because region
// was dark (its reason, darkReason): the memory, which survives a restart or a new
// leader, behind the heal of a quiet scope when the region is back
// (rebalancer.RegionInput.DarkFloor).
func darkFloor(snap *regions.Snapshot, region string, sc regions.Scope) bool {
	sh, ok := snap.ScopeShareOf(region, sc, regions.SourceRebalancer)
	return ok && sh.Reason == darkReason(region)
}

// live says whether region has a gateway seen within the instance TTL, one that stopped
// cleanly included (a restart is not a dark region), in this tick.
func (j *Job) live(region string) bool {
	return !store.RegionDark(j.seen, region, j.seenAt, j.cfg.InstanceTTL)
}

// exportShares sets ratelimit_rebalancer_share_ratio from a full run: "*" and the
// MaxShareSeries busiest pairs. Series of scopes no longer exported are deleted; the
// others are overwritten in place, so a scrape never sees one missing.
func (j *Job) exportShares(scopes []ScopeReport) {
	var pairs []ScopeReport
	next := map[[2]string]bool{}
	for _, s := range scopes {
		if s.Inputs.Scope == regions.Wildcard {
			setShares(j.m.shareRatio, s, next)
		} else {
			pairs = append(pairs, s)
		}
	}
	offered := func(s ScopeReport) float64 {
		sum := 0.0
		for _, r := range s.Inputs.Regions {
			sum += r.OfferedLong
		}
		return sum
	}
	slices.SortStableFunc(pairs, func(a, b ScopeReport) int {
		return cmp.Or(cmp.Compare(offered(b), offered(a)), strings.Compare(a.Inputs.Scope, b.Inputs.Scope))
	})
	for _, s := range pairs[:min(len(pairs), j.cfg.MaxShareSeries)] {
		setShares(j.m.shareRatio, s, next)
	}
	for ls := range j.exported {
		if !next[ls] {
			j.m.shareRatio.DeleteLabelValues(ls[0], ls[1])
		}
	}
	j.exported = next
}

// setShares exports the shares in force (the new ones when written, else the previous)
// and adds their label sets to exported.
func setShares(g *prometheus.GaugeVec, s ScopeReport, exported map[[2]string]bool) {
	for _, r := range s.Inputs.Regions {
		v := r.Previous
		if s.Written {
			v = r.Share
		}
		g.WithLabelValues(r.Region, s.Inputs.Scope).Set(v)
		exported[[2]string{r.Region, s.Inputs.Scope}] = true
	}
}
