package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
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
}

// regionStatus is one region's live figures; a field is null when Prometheus has no series
// for it.
type regionStatus struct {
	Region             string   `json:"region"`
	AllowedPerSecond   *float64 `json:"allowed_per_second"`
	ThrottledPerSecond *float64 `json:"throttled_per_second"`
	// shadowThrottled is the rate a shadow rule would have refused but let through; it
	// is offered traffic, counted in the ratio, not shown on its own.
	shadowThrottled *float64
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
	// State is "ok", or a comma-separated list of: "no-data", "fallback", "stale-rules".
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
With a database URL, regions that have no series at all are listed as no-data.`,
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
	if len(a.prometheusURLs) == 0 {
		return usagef("no Prometheus: set --prometheus-url or %s", envPrometheusURL)
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
	res, err := a.queryAllStatus(ctx, sources, o, at)
	if err != nil {
		return err
	}
	var known []string
	if a.databaseURL != "" {
		// Regions in the database with no series at all show as no-data (a dark region).
		err := a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
			known, err = st.Regions(ctx)
			return err
		})
		if err != nil {
			a.warnf("regions without metrics are not shown: %s", oneLine(err, a.secrets()))
		}
	}
	// With one Prometheus per region, a region without a URL of its own has no figures.
	var noURL []string
	if perRegion := sources[0].Region != ""; perRegion {
		has := map[string]bool{}
		for _, s := range sources {
			has[s.Region] = true
			known = append(known, s.Region)
		}
		for _, r := range known {
			if !has[r] {
				noURL = append(noURL, r)
			}
		}
		if len(noURL) > 0 {
			sort.Strings(noURL)
			a.warnf("no --prometheus-url %s=URL given: %s shown as no-data", noURL[0], strings.Join(noURL, ", "))
		}
	}
	rep := buildStatus(res, known, o, at)
	if o.tenant != "" && !hasRequests(rep.Total) {
		a.warnf("tenant %s has no series of its own in the window (gateways export only the busiest tenants; the rest count as _other)", o.tenant)
	}
	return a.render(cmd, rep, func(w io.Writer) { statusTable(w, rep) })
}

// queryAllStatus queries every source, a regional one for its region's series only, and
// merges the figures. A regional Prometheus that fails leaves its region no-data with a
// warning; the command fails only when every source does.
func (a *app) queryAllStatus(ctx context.Context, sources []demand.Source, o statusOptions, at time.Time) (map[string]map[string]float64, error) {
	type answer struct {
		res map[string]map[string]float64
		err error
	}
	answers := make([]answer, len(sources))
	var wg sync.WaitGroup
	for i, s := range sources {
		client, err := api.NewClient(api.Config{Address: s.URL})
		if err != nil { // ruled out by demand.ParseSources; the error would show the URL
			return nil, usagef("--prometheus-url %s: not a client address", s)
		}
		wg.Go(func() {
			res, err := queryStatus(ctx, promv1.NewAPI(client), o, s.Region, at)
			if err != nil {
				if isConnectError(err) {
					err = unreachableError{"prometheus", urlHostPort(s.URL, "9090"), rootCause(err)}
				} else {
					err = fmt.Errorf("query prometheus: %w", err)
				}
			}
			answers[i] = answer{res, err}
		})
	}
	wg.Wait()
	out := map[string]map[string]float64{}
	var failed []error
	for i, ans := range answers {
		if ans.err != nil {
			failed = append(failed, ans.err)
			if len(sources) > 1 {
				a.warnf("region %s shown as no-data: %s", sources[i].Region, oneLine(ans.err, a.secrets()))
			}
			continue
		}
		for fig, byRegion := range ans.res {
			if out[fig] == nil {
				out[fig] = map[string]float64{}
			}
			for r, v := range byRegion {
				out[fig][r] = v
			}
		}
	}
	if len(failed) == len(sources) {
		return nil, failed[0]
	}
	return out, nil
}

// figOffered names the request-rate query; its result is split by decision into the
// figures demand.DecisionAllowed, DecisionThrottled and DecisionShadowThrottled.
const figOffered = "offered"

// statusQueries are the PromQL queries behind status, by figure, each "by (region)"
// except figOffered, the rebalancer's own offered-demand query (by region and decision,
// with --tenant also by route). Region "" reads every region, else only that one's series.
func statusQueries(o statusOptions, region string) map[string]string {
	offered := demand.RegionOfferedQuery(o.window, region)
	sel := func(matchers string) string {
		if region != "" {
			if matchers != "" {
				matchers += ","
			}
			matchers += "region=" + strconv.Quote(region)
		}
		return "{" + matchers + "}"
	}
	share := `avg by (region) (ratelimit_region_share_ratio` + sel(`scope="*"`) + `)`
	if o.tenant != "" {
		offered = demand.TenantOfferedQuery(o.window, region, o.tenant)
		// The tenant's own scopes (TENANT, TENANT/ROUTE) when the gateways export them.
		t := strings.ReplaceAll(regexp.QuoteMeta(o.tenant), `\`, `\\`) // "." is the only metacharacter an id may hold
		share = `avg by (region) (ratelimit_region_share_ratio` + sel(`scope=~"`+t+`|`+t+`/.*"`) + `) or ` + share
	}
	return map[string]string{
		figOffered: offered,
		"fallback": `max by (region) (ratelimit_fallback_active` + sel("") + `)`,
		"gateways": `max by (region) (ratelimit_gateway_instances` + sel("") + `)`,
		"reload":   `time() - min by (region) (ratelimit_rules_last_reload_success_timestamp_seconds` + sel("") + `)`,
		"share":    share,
	}
}

// queryStatus runs the status queries concurrently and returns value by figure and region;
// the offered query gives one figure per decision, summed over routes.
func queryStatus(ctx context.Context, p promv1.API, o statusOptions, region string, at time.Time) (map[string]map[string]float64, error) {
	qs := statusQueries(o, region)
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		out  = make(map[string]map[string]float64, len(qs))
		errs []error
	)
	for name, q := range qs {
		wg.Go(func() {
			v, _, _, err := p.Query(ctx, q, at)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if !isConnectError(err) {
					err = fmt.Errorf("%s figures: %w", name, err)
				}
				errs = append(errs, err)
				return
			}
			vec, ok := v.(model.Vector)
			if !ok {
				errs = append(errs, fmt.Errorf("%s: unexpected result type %s", name, v.Type()))
				return
			}
			for _, s := range vec {
				r := string(s.Metric["region"])
				if r == "" {
					continue
				}
				fig := name
				if name == figOffered {
					fig = string(s.Metric["decision"])
				}
				if out[fig] == nil {
					out[fig] = map[string]float64{}
				}
				out[fig][r] += float64(s.Value)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
		return nil, errs[0]
	}
	return out, nil
}

func buildStatus(res map[string]map[string]float64, known []string, o statusOptions, at time.Time) statusReport {
	names := map[string]bool{}
	for _, r := range known {
		names[r] = true
	}
	for _, m := range res {
		for r := range m {
			names[r] = true
		}
	}
	rep := statusReport{At: at.UTC().Truncate(time.Millisecond), WindowSeconds: o.window.Seconds(), Tenant: o.tenant, Regions: []regionStatus{}}
	var totAllowed, totThrottled, totShadow *float64
	add := func(dst **float64, v *float64) {
		if v == nil {
			return
		}
		if *dst == nil {
			*dst = new(float64)
		}
		**dst = roundTo(**dst+*v, 3)
	}
	var anyFallback *bool
	var totGateways *int
	for _, r := range sortedKeys(names) {
		get := func(name string) *float64 {
			if v, ok := res[name][r]; ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
				v = roundTo(v, 3)
				return &v
			}
			return nil
		}
		st := regionStatus{
			Region:               r,
			AllowedPerSecond:     get(demand.DecisionAllowed),
			ThrottledPerSecond:   get(demand.DecisionThrottled),
			shadowThrottled:      get(demand.DecisionShadowThrottled),
			RuleReloadAgeSeconds: get("reload"),
			Share:                get("share"),
		}
		st.ThrottleRatio = throttleRatio(st)
		if v := get("fallback"); v != nil {
			b := *v > 0
			st.FallbackActive = &b
			if anyFallback == nil || b {
				anyFallback = &b
			}
		}
		if v := get("gateways"); v != nil {
			n := int(math.Round(*v))
			st.LiveGateways = &n
			if totGateways == nil {
				totGateways = new(int)
			}
			*totGateways += n
		}
		st.State = regionState(st, o.staleAfter)
		rep.Regions = append(rep.Regions, st)
		add(&totAllowed, st.AllowedPerSecond)
		add(&totThrottled, st.ThrottledPerSecond)
		add(&totShadow, st.shadowThrottled)
	}
	rep.Total = regionStatus{
		Region:             "total",
		AllowedPerSecond:   totAllowed,
		ThrottledPerSecond: totThrottled,
		shadowThrottled:    totShadow,
		FallbackActive:     anyFallback,
		LiveGateways:       totGateways,
	}
	rep.Total.ThrottleRatio = throttleRatio(rep.Total)
	rep.Total.State = "ok"
	for _, st := range rep.Regions {
		if st.State != "ok" {
			rep.Total.State = "degraded"
		}
	}
	return rep
}

// hasRequests reports whether st has any request rate (allowed, throttled or shadow).
func hasRequests(st regionStatus) bool {
	return st.AllowedPerSecond != nil || st.ThrottledPerSecond != nil || st.shadowThrottled != nil
}

// throttleRatio is throttled / offered (allowed + throttled + shadow_throttled).
func throttleRatio(st regionStatus) *float64 {
	if !hasRequests(st) {
		return nil
	}
	val := func(v *float64) float64 {
		if v == nil {
			return 0
		}
		return *v
	}
	t := val(st.ThrottledPerSecond)
	offered := val(st.AllowedPerSecond) + t + val(st.shadowThrottled)
	if offered <= 0 {
		return nil
	}
	r := roundTo(t/offered, 4)
	return &r
}

// roundTo rounds v to digits decimals, so JSON figures do not carry float noise.
func roundTo(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

func regionState(st regionStatus, staleAfter time.Duration) string {
	var s []string
	if !hasRequests(st) && st.LiveGateways == nil && st.RuleReloadAgeSeconds == nil {
		s = append(s, "no-data")
	}
	if st.FallbackActive != nil && *st.FallbackActive {
		s = append(s, "fallback")
	}
	if st.RuleReloadAgeSeconds != nil && *st.RuleReloadAgeSeconds > staleAfter.Seconds() {
		s = append(s, "stale-rules")
	}
	if len(s) == 0 {
		return "ok"
	}
	return strings.Join(s, ",")
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
