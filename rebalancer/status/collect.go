package status

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/rebalancer/status/figures"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// Status is everything the page shows; /status.json serves it as is, so its JSON field
// names are stable. Figures read from Prometheus are null when unknown.
type Status struct {
	GeneratedAt        time.Time `json:"generated_at"`
	InstanceTTLSeconds float64   `json:"instance_ttl_seconds"`
	RateWindowSeconds  float64   `json:"rate_window_seconds"`
	ChartRangeSeconds  float64   `json:"chart_range_seconds"`
	Prometheus         PromState `json:"prometheus"`
	// LastRun is the rebalancer's last tick; null when unknown or before the first.
	LastRun *Run `json:"last_run"`
	// Stale: the rebalancer's last tick is older than StaleAfterSeconds (or there was
	// none for that long): it is not deciding, and the shares shown may be old.
	Stale             bool     `json:"stale"`
	StaleAfterSeconds float64  `json:"stale_after_seconds"`
	Regions           []Region `json:"regions"`
	// TenantShares are the tenant scopes whose effective shares differ most from the
	// default ones, largest difference first; TenantScopes counts every tenant scope
	// with a share of its own.
	TenantShares []ScopeShares `json:"tenant_shares"`
	TenantScopes int           `json:"tenant_scopes"`
	// Changes are the most recent share changes, newest first.
	Changes []Change `json:"changes"`
	Charts  Charts   `json:"charts"`
	// Quotas are the calendar-quota periods running with the most usage, most first (at
	// most TopScopes); QuotasRead is false (and Quotas empty) when the usage could not be
	// read.
	Quotas     []QuotaUse `json:"quotas"`
	QuotasRead bool       `json:"quotas_read"`
}

// QuotaUse is one period of a calendar quota band (a rule's band with a period) as the
// gateways last reported it: the fleet's usage and each region's. Its budget and the
// regions' allowances: ratectl status --tenant.
type QuotaUse struct {
	Tenant      string    `json:"tenant"`
	Route       string    `json:"route"`
	Band        string    `json:"band"`
	PeriodStart time.Time `json:"period_start"`
	Used        int64     `json:"used"`
	// ByRegion is each region's usage, in the order of Status.Regions.
	ByRegion  []int64   `json:"by_region"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PromState says whether the live figures could be read.
type PromState struct {
	// Configured is false when the page was given no Prometheus.
	Configured bool `json:"configured"`
	// Reachable is true when every configured server answered every query.
	Reachable bool `json:"reachable"`
	// Unreachable lists the servers that failed: "*" for a server of every region, else
	// the region of a per-region server.
	Unreachable []string `json:"unreachable"`
}

// Run is the outcome of the rebalancer's last tick.
type Run struct {
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`   // run or check
	Result  string    `json:"result"` // ok, skipped_prometheus, skipped_database, error, not_leader
	Written int       `json:"written"`
	DryRun  bool      `json:"dry_run"`
}

// Region is one region's gateways, default share and live rates.
type Region struct {
	Name         string    `json:"name"`
	LiveGateways int       `json:"live_gateways"`
	Gateways     []Gateway `json:"gateways"`
	// Dark: no gateway of the region heartbeated within the instance TTL, cleanly
	// stopped ones included (store.RegionDark, as the rebalancer decides it).
	Dark bool `json:"dark"`
	// Share is the region's effective share of scope "*"; ShareSource is override,
	// rebalancer, or default (no stored share: an equal split).
	Share       float64    `json:"share"`
	ShareSource string     `json:"share_source"`
	ShareReason string     `json:"share_reason"`
	ShareSetAt  *time.Time `json:"share_updated_at"`
	// OverrideExpiresAt is when an override share stops applying; null if never.
	OverrideExpiresAt *time.Time `json:"override_expires_at"`
	// Requests per second over the rate window, summed over the region's gateways.
	// Offered = allowed + throttled + shadow_throttled.
	OfferedRPS   *float64 `json:"offered_rps"`
	AllowedRPS   *float64 `json:"allowed_rps"`
	ThrottledRPS *float64 `json:"throttled_rps"`
	// ThrottleRatio is throttled / offered; null without traffic.
	ThrottleRatio *float64 `json:"throttle_ratio"`
}

// Gateway is one gateway instance that heartbeats into a region.
type Gateway struct {
	ID       string    `json:"id"`
	LastSeen time.Time `json:"last_seen"`
	Live     bool      `json:"live"`
}

// ScopeShares is one tenant scope's effective shares against the default ones.
type ScopeShares struct {
	Scope string `json:"scope"`
	// MaxDeviation is the largest |share - default share| over the regions.
	MaxDeviation float64       `json:"max_deviation"`
	Regions      []ScopeRegion `json:"regions"`
}

// ScopeRegion is one region's share in a tenant scope.
type ScopeRegion struct {
	Region string  `json:"region"`
	Share  float64 `json:"share"`
	// Source is override, rebalancer or default; an override of a wider scope ("*" or
	// the tenant) covers the scopes inside it.
	Source       string  `json:"source"`
	DefaultShare float64 `json:"default_share"`
	Deviation    float64 `json:"deviation"` // share - default share
}

// Change is one share change from the history.
type Change struct {
	At     time.Time `json:"at"`
	Scope  string    `json:"scope"`
	Region string    `json:"region"`
	Source string    `json:"source"`
	// Old is null when the share was created, New when it was deleted.
	Old       *float64   `json:"old_share"`
	New       *float64   `json:"new_share"`
	ExpiresAt *time.Time `json:"expires_at"`
	Actor     string     `json:"actor"`
	Reason    string     `json:"reason"`
	// Trigger is the rebalancer's reason from its inputs (interval, throttling, dark,
	// returned, ...), with the region behind a fast-path trigger; empty for overrides.
	Trigger       string `json:"trigger"`
	TriggerRegion string `json:"trigger_region"`
	Kind          string `json:"kind"` // run or check; empty for overrides
	// Demand holds the recorded inputs per region; empty for overrides.
	Demand []Demand `json:"demand"`
}

// Demand is one region's recorded inputs behind a rebalancer change (job.RegionInput).
type Demand struct {
	Region        string  `json:"region"`
	Status        string  `json:"status"`
	OfferedRPS    float64 `json:"offered_rps"`
	ThrottledRPS  float64 `json:"throttled_rps"`
	DemandRPS     float64 `json:"demand_rps"`
	PreviousShare float64 `json:"previous_share"`
	Share         float64 `json:"share"`
}

// Charts are the range series of the last ChartRange, one per region.
type Charts struct {
	StepSeconds  float64  `json:"step_seconds"`
	ThrottledRPS []Series `json:"throttled_rps"`
	Share        []Series `json:"share"`
}

// Series is one region's points, oldest first.
type Series struct {
	Region string  `json:"region"`
	Points []Point `json:"points"`
}

// Point is one sample of a Series.
type Point struct {
	T time.Time `json:"t"`
	V float64   `json:"v"`
}

// Collect reads everything the page shows. It fails (wrapping ErrStoreUnavailable) only
// when PostgreSQL cannot be read; a Prometheus failure leaves the live figures null and
// is reported in Status.Prometheus.
func (h *Handler) Collect(ctx context.Context) (*Status, error) {
	now := h.cfg.Now()
	pctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	promDone := make(chan promData, 1)
	go func() { promDone <- h.queryPrometheus(pctx, now) }()

	db, err := h.readStore(ctx)
	if err != nil {
		cancel()
		<-promDone
		if ctx.Err() != nil { // the client went away: nothing to say about PostgreSQL
			return nil, fmt.Errorf("status: %w", ctx.Err())
		}
		if h.storeFailing.CompareAndSwap(false, true) {
			h.log.Warn("status page cannot read postgresql", "err", err)
		}
		return nil, fmt.Errorf("status: %w: %w", ErrStoreUnavailable, err)
	}
	if h.storeFailing.CompareAndSwap(true, false) {
		h.log.Info("status page reads postgresql again")
	}
	pd := <-promDone
	if len(pd.failed) > 0 {
		if h.promFailing.CompareAndSwap(false, true) {
			h.log.Warn("status page cannot query prometheus", "err", pd.err, "servers", pd.failed)
		}
	} else if h.promFailing.CompareAndSwap(true, false) {
		h.log.Info("status page queries prometheus again")
	}
	return h.build(now, db, pd)
}

// storeData is what one view reads from PostgreSQL.
type storeData struct {
	regions   []string
	instances []regions.Instance
	shares    []regions.Share
	history   []store.HistoryEntry
	seen      map[string]time.Time // store.RegionsLastSeen
	quotas    []store.QuotaPeriod  // nil when they could not be read
}

func (h *Handler) readStore(ctx context.Context) (storeData, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	var (
		d   storeData
		err error
	)
	if d.regions, err = h.store.Regions(ctx); err != nil {
		return d, err
	}
	if d.instances, err = h.store.Instances(ctx); err != nil {
		return d, err
	}
	if d.seen, err = h.store.RegionsLastSeen(ctx); err != nil {
		return d, err
	}
	if d.shares, err = h.store.Shares(ctx); err != nil {
		return d, err
	}
	if h.cfg.HistoryLimit > 0 {
		if d.history, err = h.store.History(ctx, store.HistoryFilter{Limit: h.cfg.HistoryLimit}); err != nil {
			return d, err
		}
	}
	// The quotas' usage is one section: a failure to read it (a database not migrated
	// to it yet) leaves the section empty, not the page.
	if d.quotas, err = h.store.TopUsage(ctx, h.cfg.Now().Add(-regions.QuotaLookback), h.cfg.TopScopes); err != nil {
		h.log.Debug("status page cannot read quota usage", "err", err)
		d.quotas = nil
	} else if d.quotas == nil {
		d.quotas = []store.QuotaPeriod{}
	}
	return d, nil
}

// placeholderRule satisfies NewSnapshot's need for a default rule: the page uses the
// snapshot for share precedence and liveness only, never for rules.
var placeholderRule = regions.Rule{Tenant: regions.Wildcard, Route: regions.Wildcard, Capacity: 1, RefillPerSecond: 1, Shards: 1}

func (h *Handler) build(now time.Time, db storeData, pd promData) (*Status, error) {
	// The pure snapshot model resolves the shares exactly as the gateways do: overrides
	// before rebalancer values, most specific scope first, expired overrides ignored.
	snap, err := regions.NewSnapshot(regions.SnapshotData{
		Regions: db.regions, Rules: []regions.Rule{placeholderRule}, Shares: db.shares,
		Instances: db.instances, InstanceTTL: h.cfg.InstanceTTL, LoadedAt: now,
	})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	st := &Status{
		GeneratedAt:        now.UTC(),
		InstanceTTLSeconds: h.cfg.InstanceTTL.Seconds(),
		RateWindowSeconds:  h.cfg.RateWindow.Seconds(),
		ChartRangeSeconds:  h.cfg.ChartRange.Seconds(),
		Prometheus: PromState{Configured: len(h.cfg.Prometheus) > 0, Reachable: len(pd.failed) == 0,
			Unreachable: append([]string{}, pd.failed...)},
		Regions:      []Region{},
		TenantShares: []ScopeShares{},
		Changes:      []Change{},
		Charts: Charts{StepSeconds: chartStep(h.cfg.ChartRange).Seconds(),
			ThrottledRPS: seriesOf(db.regions, pd.throttled), Share: seriesOf(db.regions, pd.share)},
	}
	if h.cfg.LastRun != nil {
		st.StaleAfterSeconds = h.cfg.StaleAfter.Seconds()
		r := h.cfg.LastRun()
		last := r.At
		if !r.At.IsZero() {
			st.LastRun = &Run{At: r.At.UTC(), Kind: r.Kind, Result: r.Result, Written: r.Written, DryRun: r.DryRun}
		} else {
			last = h.started
		}
		st.Stale = now.Sub(last) > h.cfg.StaleAfter
	}

	gateways := map[string][]Gateway{}
	for _, in := range db.instances {
		gateways[in.Region] = append(gateways[in.Region], Gateway{ID: in.ID, LastSeen: in.LastSeen.UTC(),
			Live: now.Sub(in.LastSeen) <= h.cfg.InstanceTTL})
	}
	defaults := make(map[string]float64, len(db.regions))
	for _, name := range db.regions {
		rg := Region{Name: name, LiveGateways: snap.LiveInstances(name), Gateways: gateways[name]}
		if rg.Gateways == nil {
			rg.Gateways = []Gateway{}
		}
		// Dark as the rebalancer sees it: no gateway seen within the TTL, cleanly stopped
		// ones included (a restart is not dark).
		rg.Dark = store.RegionDark(db.seen, name, now, h.cfg.InstanceTTL)
		if sh, ok := snap.ScopeRow(name, regions.GlobalScope); ok {
			rg.Share, rg.ShareSource, rg.ShareReason = sh.Share, string(sh.Source), sh.Reason
			rg.ShareSetAt = timePtr(sh.UpdatedAt)
			if sh.Source == regions.SourceOverride {
				rg.OverrideExpiresAt = timePtr(sh.ExpiresAt)
			}
		} else {
			v, src := snap.Share(name, regions.Wildcard, regions.Wildcard)
			rg.Share, rg.ShareSource = v, string(src)
		}
		defaults[name] = rg.Share
		if r := pd.live.Region(name).Rates; r != nil {
			offered := r.Offered()
			rg.OfferedRPS, rg.AllowedRPS, rg.ThrottledRPS = &offered, &r.Allowed, &r.Throttled
			if ratio, ok := figures.ThrottleRatio(*r); ok {
				rg.ThrottleRatio = &ratio
			}
		}
		st.Regions = append(st.Regions, rg)
	}

	st.TenantShares, st.TenantScopes = tenantShares(snap, db, defaults, now, h.cfg.TopScopes)
	st.Quotas, st.QuotasRead = []QuotaUse{}, db.quotas != nil
	if db.quotas != nil {
		for _, q := range db.quotas {
			u := QuotaUse{Tenant: q.Tenant, Route: q.Route, Band: q.Band, PeriodStart: time.Unix(q.Start, 0).UTC(),
				Used: q.Total, ByRegion: make([]int64, len(st.Regions)), UpdatedAt: q.UpdatedAt.UTC()}
			for i, r := range st.Regions {
				u.ByRegion[i] = q.Used[r.Name]
			}
			st.Quotas = append(st.Quotas, u)
		}
	}
	for _, e := range db.history {
		st.Changes = append(st.Changes, change(e, h.log))
	}
	return st, nil
}

// tenantShares ranks the tenant scopes with an active share of their own by how far
// their effective shares are from the default ones, and keeps the top n that differ.
func tenantShares(snap *regions.Snapshot, db storeData, defaults map[string]float64, now time.Time, n int) ([]ScopeShares, int) {
	seen := map[regions.Scope]bool{}
	var scopes []regions.Scope
	for _, sh := range db.shares {
		if sh.Scope == regions.GlobalScope || !sh.Active(now) || seen[sh.Scope] {
			continue
		}
		seen[sh.Scope] = true
		scopes = append(scopes, sh.Scope)
	}
	out := []ScopeShares{}
	for _, sc := range scopes {
		ss := ScopeShares{Scope: sc.String()}
		for _, r := range db.regions {
			v, src := snap.Share(r, sc.Tenant, sc.Route)
			d := v - defaults[r]
			ss.Regions = append(ss.Regions, ScopeRegion{Region: r, Share: v, Source: string(src), DefaultShare: defaults[r], Deviation: d})
			ss.MaxDeviation = math.Max(ss.MaxDeviation, math.Abs(d))
		}
		if ss.MaxDeviation > regions.ShareTolerance {
			out = append(out, ss)
		}
	}
	slices.SortFunc(out, func(a, b ScopeShares) int {
		return cmp.Or(cmp.Compare(b.MaxDeviation, a.MaxDeviation), cmp.Compare(a.Scope, b.Scope))
	})
	if len(out) > n {
		out = out[:n]
	}
	return out, len(scopes)
}

// change converts a history row, with the demand figures of the rebalancer's inputs.
func change(e store.HistoryEntry, log *slog.Logger) Change {
	c := Change{At: e.At.UTC(), Scope: e.Scope.String(), Region: e.Region, Source: string(e.Source),
		Old: e.Old, New: e.New, ExpiresAt: timePtr(e.ExpiresAt), Actor: e.Actor, Reason: e.Reason, Demand: []Demand{}}
	if len(e.Inputs) == 0 {
		return c
	}
	var in job.ScopeInputs
	if err := json.Unmarshal(e.Inputs, &in); err != nil {
		log.Debug("status: history inputs not understood", "id", e.ID, "err", err)
		return c
	}
	c.Trigger, c.TriggerRegion, c.Kind = in.Reason, in.Region, in.Kind
	for _, r := range in.Regions {
		c.Demand = append(c.Demand, Demand{Region: r.Region, Status: string(r.Status), OfferedRPS: r.OfferedLong,
			ThrottledRPS: r.Throttled, DemandRPS: r.Demand, PreviousShare: r.Previous, Share: r.Share})
	}
	return c
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
