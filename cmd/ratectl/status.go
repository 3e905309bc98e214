package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/status/figures"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// statusReport is the JSON of `ratectl status`.
type statusReport struct {
	At            time.Time      `json:"at"`
	WindowSeconds float64        `json:"window_seconds"`
	Tenant        string         `json:"tenant,omitempty"`
	Regions       []regionStatus `json:"regions"`
	Total         regionStatus   `json:"total"`
	// Bands, with --tenant and a database, are the bands of the tenant's rules: each
	// calendar quota's usage of its period, what is left and each region's allowance.
	Bands []bandStatus `json:"bands,omitempty"`
}

// regionStatus is one region's live figures (figures.Region, rounded); a field is null
// when Prometheus has no series for it. The request rates are known together: with any
// request series of the region, a decision without one of its own is 0.
type regionStatus struct {
	Region             string   `json:"region"`
	AllowedPerSecond   *float64 `json:"allowed_per_second"`
	ThrottledPerSecond *float64 `json:"throttled_per_second"`
	// ThrottleRatio is throttled / offered, offered being allowed + throttled +
	// shadow_throttled as the rebalancer counts it; null without traffic.
	ThrottleRatio *float64 `json:"throttle_ratio"`
	// FallbackActive: at least one gateway of the region decides locally (Redis down).
	FallbackActive *bool `json:"fallback_active"`
	LiveGateways   *int  `json:"live_gateways"`
	// RuleReloadAgeSeconds is the age of the oldest last successful rule reload among the
	// region's gateways.
	RuleReloadAgeSeconds *float64 `json:"rule_reload_age_seconds"`
	// Share is the region's effective share of the default scope "*" (with --tenant: the
	// mean over the tenant's scopes, TENANT and TENANT/ROUTE, that the gateways export,
	// else of "*").
	Share *float64 `json:"share"`
	// State is "ok", or a comma-separated list of: "no-data", "fallback", "stale-rules"
	// (figures.State); the total's is "ok" or "degraded".
	State string `json:"state"`
}

type statusOptions struct {
	tenant     string
	window     time.Duration
	staleAfter time.Duration
	at         string
}

func newStatusCmd(a *app) *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Live per-region figures from Prometheus: allowed/s, throttled/s, fallback, gateways, reloads, shares",
		Long: `Live per-region figures from Prometheus, from the gateways' metrics:
allowed and throttled requests per second over --window, the throttled percentage of
the offered traffic (allowed + throttled + shadow_throttled, as the rebalancer counts it),
whether any gateway is on its local fallback (Redis unreachable), the live gateways,
the age of the oldest successful rule reload, and the effective share of the default
scope. With --tenant, the request figures are that tenant's (ratelimit_tenant_requests_total).
With a database URL, regions that have no series at all are listed as no-data.

With --tenant and a database URL, the bands of the tenant's rules follow: for each
calendar quota, its period, what the fleet has used of it as the gateways last reported
(every quota_sync_interval), what is left, when it resets, and each region's usage and
allowance; for each token bucket its limit (its tokens now: ratectl bucket inspect). Without
a Prometheus URL only the bands are shown.`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error { return a.status(cmd, o) }),
	}
	f := cmd.Flags()
	f.StringVar(&o.tenant, "tenant", "", "show one tenant's traffic")
	o.window, o.staleAfter = time.Minute, 2*time.Minute
	f.Var((*durationValue)(&o.window), "window", "rate window")
	f.Var((*durationValue)(&o.staleAfter), "stale-after", "a rule reload older than this marks the region stale-rules")
	f.StringVar(&o.at, "at", "", "evaluate at this time (RFC 3339) instead of now")
	return cmd
}

func (a *app) status(cmd *cobra.Command, o statusOptions) error {
	if len(a.prometheusURLs) == 0 && o.tenant != "" && a.databaseURL != "" {
		return a.statusBands(cmd, o)
	}
	if len(a.prometheusURLs) == 0 {
		return usagef("no Prometheus: set --prometheus-url or %s (or, for a tenant's bands only, --tenant and a database URL)", envPrometheusURL)
	}
	sources, err := demand.ParseSources(a.prometheusURLs)
	if err != nil {
		return usagef("--prometheus-url: %s", strings.TrimPrefix(err.Error(), regions.ErrInvalid.Error()+" "))
	}
	if o.tenant != "" {
		if err := checkID("tenant", o.tenant); err != nil {
			return err
		}
	}
	if o.window < time.Second {
		return usagef("--window %v: must be at least 1s", o.window)
	}
	if o.staleAfter <= 0 {
		return usagef("--stale-after %v: must be > 0", o.staleAfter)
	}
	at := a.now()
	if o.at != "" {
		t, err := time.Parse(time.RFC3339, o.at)
		if err != nil {
			return usagef("--at %q: want an RFC 3339 time such as 2025-01-02T15:04:05Z", o.at)
		}
		at = t
	}
	ctx, cancel := a.withTimeout(cmd.Context())
	defer cancel()
	res, err := a.readFigures(ctx, sources, figures.Options{Window: o.window, Tenant: o.tenant, At: at})
	if err != nil {
		return err
	}
	var known []string
	if a.databaseURL != "" {
		// Regions in the database with no series at all show as no-data.
		err := a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
			known, err = st.Regions(ctx)
			return err
		})
		if err != nil {
			a.warnf("regions without metrics are not shown: %s", oneLine(err, a.secrets()))
		}
	}
	// With one Prometheus per region, a region without a URL of its own has no figures.
	if sources[0].Region != "" {
		var noURL []string
		for _, r := range known {
			if !slices.ContainsFunc(sources, func(s demand.Source) bool { return s.Region == r }) {
				noURL = append(noURL, r)
			}
		}
		if len(noURL) > 0 {
			slices.Sort(noURL)
			a.warnf("no --prometheus-url %s=URL given: %s shown as no-data", noURL[0], strings.Join(noURL, ", "))
		}
	}
	rep, total := buildStatus(res.Regions(known...), o, at)
	if o.tenant != "" && total.Rates == nil {
		a.warnf("tenant %s has no series of its own in the window (gateways export only the busiest tenants; the rest count as _other)", o.tenant)
	}
	var bandsAt time.Time
	if o.tenant != "" && a.databaseURL != "" {
		err := a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
			rep.Bands, bandsAt, err = a.tenantBands(ctx, st, o.tenant)
			return err
		})
		if err != nil {
			a.warnf("the tenant's bands are not shown: %s", oneLine(err, a.secrets()))
		}
	}
	return a.render(cmd, rep, func(w io.Writer) {
		statusTable(w, rep)
		if rep.Bands != nil {
			fmt.Fprintln(w)
			bandsTable(w, o.tenant, bandsAt, rep.Bands)
		}
	})
}

// statusBands is `ratectl status --tenant T` without Prometheus: the tenant's bands only.
func (a *app) statusBands(cmd *cobra.Command, o statusOptions) error {
	if err := checkID("tenant", o.tenant); err != nil {
		return err
	}
	var (
		bs []bandStatus
		at time.Time
	)
	err := a.withStore(cmd, func(ctx context.Context, st *store.Store) (err error) {
		bs, at, err = a.tenantBands(ctx, st, o.tenant)
		return err
	})
	if err != nil {
		return err
	}
	if bs == nil {
		bs = []bandStatus{}
	}
	rep := struct {
		At     time.Time    `json:"at"`
		Tenant string       `json:"tenant"`
		Bands  []bandStatus `json:"bands"`
	}{at.UTC().Truncate(time.Millisecond), o.tenant, bs}
	return a.render(cmd, rep, func(w io.Writer) { bandsTable(w, o.tenant, at, bs) })
}

// readFigures reads the figures from every source (figures.Read), a regional one for its
// region's series only. A regional Prometheus that fails leaves its region no-data with a
// warning; the command fails only when every source does.
func (a *app) readFigures(ctx context.Context, sources []demand.Source, o figures.Options) (figures.Result, error) {
	srcs := make([]figures.Source, len(sources))
	for i, s := range sources {
		p, err := s.API(nil)
		if err != nil { // ruled out by demand.ParseSources
			return figures.Result{}, usagef("--prometheus-url %s: not a client address", s)
		}
		srcs[i] = figures.Source{Region: s.Region, API: p}
	}
	res := figures.Read(ctx, srcs, o)
	var failed []error
	for i, err := range res.Errors {
		if err == nil {
			continue
		}
		if isConnectError(err) {
			err = unreachableError{"prometheus", urlHostPort(sources[i].URL, "9090"), rootCause(err)}
		} else {
			err = fmt.Errorf("query prometheus: %w", err)
		}
		failed = append(failed, err)
		if len(sources) > 1 {
			a.warnf("region %s shown as no-data: %s", sources[i].Region, oneLine(err, a.secrets()))
		}
	}
	if len(failed) == len(sources) {
		return figures.Result{}, failed[0]
	}
	return res, nil
}

// buildStatus is the report of the regions' figures, rounded so that JSON figures do not
// carry float noise, and their total, which adds up the figures shown.
func buildStatus(rs []figures.Region, o statusOptions, at time.Time) (statusReport, figures.Region) {
	rep := statusReport{At: at.UTC().Truncate(time.Millisecond), WindowSeconds: o.window.Seconds(), Tenant: o.tenant, Regions: []regionStatus{}}
	shown := make([]figures.Region, 0, len(rs))
	states := make([]string, 0, len(rs))
	for _, r := range rs {
		r = rounded(r)
		state := figures.State(r, o.staleAfter)
		shown, states = append(shown, r), append(states, state)
		rep.Regions = append(rep.Regions, regionRow(r, state))
	}
	total := rounded(figures.Total("total", shown))
	rep.Total = regionRow(total, figures.TotalState(states))
	return rep, total
}

// regionRow is one row of the report.
func regionRow(r figures.Region, state string) regionStatus {
	st := regionStatus{Region: r.Name, FallbackActive: r.Fallback, LiveGateways: r.Gateways,
		RuleReloadAgeSeconds: r.ReloadAge, Share: r.Share, State: state}
	if r.Rates != nil {
		st.AllowedPerSecond, st.ThrottledPerSecond = &r.Rates.Allowed, &r.Rates.Throttled
		if v, ok := figures.ThrottleRatio(*r.Rates); ok {
			v = roundTo(v, 4)
			st.ThrottleRatio = &v
		}
	}
	return st
}

// rounded is r with its rates, reload age and share rounded to 3 decimals.
func rounded(r figures.Region) figures.Region {
	round := func(v *float64) *float64 {
		if v == nil {
			return nil
		}
		x := roundTo(*v, 3)
		return &x
	}
	if r.Rates != nil {
		r.Rates = &demand.Rates{Allowed: roundTo(r.Rates.Allowed, 3), Throttled: roundTo(r.Rates.Throttled, 3),
			ShadowThrottled: roundTo(r.Rates.ShadowThrottled, 3)}
	}
	r.ReloadAge, r.Share = round(r.ReloadAge), round(r.Share)
	return r
}

// roundTo rounds v to digits decimals, so JSON figures do not carry float noise.
func roundTo(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

func statusTable(w io.Writer, rep statusReport) {
	title := "all tenants"
	if rep.Tenant != "" {
		title = "tenant " + rep.Tenant
	}
	fmt.Fprintf(w, "# %s, rates over %s, at %s\n", title, time.Duration(rep.WindowSeconds*float64(time.Second)), timeCell(rep.At))
	row(w, "REGION", "ALLOWED/S", "THROTTLED/S", "THROTTLED%", "FALLBACK", "GATEWAYS", "RELOAD AGE", "SHARE", "STATE")
	for _, st := range append(rep.Regions, rep.Total) {
		row(w, st.Region, optRate(st.AllowedPerSecond), optRate(st.ThrottledPerSecond), optPercent(st.ThrottleRatio),
			optBool(st.FallbackActive), optInt(st.LiveGateways), optAge(st.RuleReloadAgeSeconds), optShare(st.Share), st.State)
	}
}

func optRate(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64)
}

func optPercent(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v*100, 'f', 1, 64) + "%"
}

func optBool(v *bool) string {
	if v == nil {
		return "-"
	}
	return boolCell(*v)
}

func optInt(v *int) string {
	if v == nil {
		return "-"
	}
	return strconv.Itoa(*v)
}

func optAge(v *float64) string {
	if v == nil {
		return "-"
	}
	return time.Duration(math.Round(*v) * float64(time.Second)).String()
}

func optShare(v *float64) string {
	if v == nil {
		return "-"
	}
	return shareCell(*v)
}
