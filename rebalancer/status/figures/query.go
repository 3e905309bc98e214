package figures

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
)

// The gauges the gateways export, by region, next to demand's request counters.
const (
	FallbackMetric  = "ratelimit_fallback_active"                             // 1 while deciding locally
	InstancesMetric = "ratelimit_gateway_instances"                           // live gateways of the region by heartbeat
	ReloadMetric    = "ratelimit_rules_last_reload_success_timestamp_seconds" // last good rule reload
	ShareMetric     = "ratelimit_region_share_ratio"                          // effective share, by scope
)

// Prometheus is the part of the Prometheus HTTP API that Read queries (promv1.API).
type Prometheus interface {
	Query(ctx context.Context, query string, ts time.Time, opts ...promv1.Option) (model.Value, promv1.Warnings, promv1.Infos, error)
}

// Source is one Prometheus server. Region "" means it holds the series of every region;
// otherwise it speaks for that region only (one Prometheus per region, as
// --prometheus-url REGION=URL): its queries select region="REGION" and an answer about
// another region is ignored.
type Source struct {
	Region string
	API    Prometheus
}

// Owns reports whether an answer of s about region counts.
func (s Source) Owns(region string) bool {
	return region != "" && (s.Region == "" || s.Region == region)
}

// Options says what Read reads.
type Options struct {
	// Window is the rate() window of the request rates (callers check it is >= 1 s).
	Window time.Duration
	// Tenant "" reads every tenant's traffic (demand.RequestsMetric) and the share of the
	// default scope "*". A tenant id reads that tenant's own series
	// (demand.TenantRequestsMetric, summed over its routes) and the mean share of its
	// own scopes (TENANT, TENANT/ROUTE) where the gateways export them, else of "*".
	Tenant string
	// At is the evaluation time.
	At time.Time
	// RatesOnly reads the request rates alone (the status page, which shows nothing
	// else of a region's figures): a failing query of a figure nobody shows must not
	// drop the rates.
	RatesOnly bool
}

// query is one instant query of Read and how its samples fill a Region.
type query struct {
	name   string // for errors: "offered", "fallback", ...
	promql string
	fill   func(r *Region, s *model.Sample)
}

// selector is the label matchers, with region="REGION" added for a regional source; ""
// when there are none.
func selector(region string, matchers ...string) string {
	if region != "" {
		matchers = append(matchers, "region="+strconv.Quote(region))
	}
	if len(matchers) == 0 {
		return ""
	}
	return "{" + strings.Join(matchers, ",") + "}"
}

// OfferedQuery is the PromQL of the request rates by region and decision (with a tenant,
// also by route): demand.RegionOfferedQuery, or demand.TenantOfferedQuery of the tenant.
func OfferedQuery(window time.Duration, region, tenant string) string {
	if tenant != "" {
		return demand.TenantOfferedQuery(window, region, tenant)
	}
	return demand.RegionOfferedQuery(window, region)
}

// ThrottledQuery is the PromQL of the throttled rate per region (the page's chart): the
// throttled part of OfferedQuery alone.
func ThrottledQuery(window time.Duration, region string) string {
	return `sum by (region) (rate(` + demand.RequestsMetric + selector(region, `decision="`+demand.DecisionThrottled+`"`) +
		`[` + model.Duration(window).String() + `]))`
}

// ShareQuery is the PromQL of the share the region's gateways enforce, averaged over
// them: of the default scope "*"; with a tenant, of its own scopes where exported, else
// of "*".
func ShareQuery(region, tenant string) string {
	q := `avg by (region) (` + ShareMetric + selector(region, `scope="*"`) + `)`
	if tenant != "" {
		// "." is the only metacharacter an id may hold; the backslash is escaped again
		// for the PromQL string.
		t := strings.ReplaceAll(regexp.QuoteMeta(tenant), `\`, `\\`)
		q = `avg by (region) (` + ShareMetric + selector(region, `scope=~"`+t+`|`+t+`/.*"`) + `) or ` + q
	}
	return q
}

// queries are Read's instant queries of one source.
func queries(o Options, region string) []query {
	sel := selector(region)
	qs := []query{
		{"offered", OfferedQuery(o.Window, region, o.Tenant), func(r *Region, s *model.Sample) {
			var add demand.Rates
			if s.Value < 0 || s.Value > maxFigure {
				return
			}
			if !add.Add(string(s.Metric["decision"]), float64(s.Value)) {
				return
			}
			if r.Rates == nil {
				r.Rates = &demand.Rates{}
			}
			r.Rates.Allowed += add.Allowed
			r.Rates.Throttled += add.Throttled
			r.Rates.ShadowThrottled += add.ShadowThrottled
		}},
		{"fallback", `max by (region) (` + FallbackMetric + sel + `)`, func(r *Region, s *model.Sample) {
			b := s.Value > 0
			r.Fallback = &b
		}},
		{"gateways", `max by (region) (` + InstancesMetric + sel + `)`, func(r *Region, s *model.Sample) {
			if s.Value < 0 || s.Value > maxFigure {
				return
			}
			n := int(math.Round(float64(s.Value)))
			r.Gateways = &n
		}},
		{"reload", `time() - min by (region) (` + ReloadMetric + sel + `)`, func(r *Region, s *model.Sample) {
			v := float64(s.Value)
			if v < -maxFigure || v > maxFigure {
				return
			}
			v = max(v, 0) // a gateway's clock ahead of Prometheus's
			r.ReloadAge = &v
		}},
		{"share", ShareQuery(region, o.Tenant), func(r *Region, s *model.Sample) {
			v := float64(s.Value)
			if v < 0 || v > 1 {
				return
			}
			r.Share = &v
		}},
	}
	if o.RatesOnly {
		return qs[:1]
	}
	return qs
}

// Result is what Read found.
type Result struct {
	// Errors holds each source's failure, in the order of the sources; nil when it
	// answered every query. A source that failed any query contributes no figures.
	Errors []error
	// regions holds the figures of every region some source has a series of, and an
	// empty Region for each regional source's region.
	regions map[string]Region
}

// Region is the figures of region name; every figure is nil when no source has them.
func (r Result) Region(name string) Region {
	if rg, ok := r.regions[name]; ok {
		return rg
	}
	return Region{Name: name}
}

// Regions lists, by name, every region some source has a series of, each regional
// source's region, and every region of known (the database's), with or without figures.
func (r Result) Regions(known ...string) []Region {
	names := make([]string, 0, len(r.regions)+len(known))
	for n := range r.regions {
		names = append(names, n)
	}
	for _, n := range known {
		if n != "" {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	out := make([]Region, 0, len(names))
	for _, n := range names {
		out = append(out, r.Region(n))
	}
	return out
}

// Read runs the figures' queries on every source concurrently and merges the answers.
// It never fails as a whole: a source that fails is reported in Result.Errors, and the
// caller decides what a partial answer is worth.
func Read(ctx context.Context, sources []Source, o Options) Result {
	got := make([]map[string]Region, len(sources))
	res := Result{Errors: make([]error, len(sources)), regions: map[string]Region{}}
	var wg sync.WaitGroup
	for i, src := range sources {
		wg.Go(func() { got[i], res.Errors[i] = readSource(ctx, src, o) })
	}
	wg.Wait()
	for i, src := range sources {
		if src.Region != "" {
			res.regions[src.Region] = Region{Name: src.Region}
		}
		if res.Errors[i] != nil {
			continue
		}
		// Sources own disjoint regions (one plain source, or one per region).
		for name, rg := range got[i] {
			res.regions[name] = rg
		}
	}
	return res
}

// readSource runs the queries on one source; on any failure it returns the first error
// by message, so the same failure reads the same every time.
func readSource(ctx context.Context, src Source, o Options) (map[string]Region, error) {
	qs := queries(o, src.Region)
	vecs := make([]model.Vector, len(qs))
	errs := make([]error, len(qs))
	var wg sync.WaitGroup
	for i, q := range qs {
		wg.Go(func() {
			v, _, _, err := src.API.Query(ctx, q.promql, o.At)
			if err != nil {
				errs[i] = fmt.Errorf("%s figures: %w", q.name, err)
				return
			}
			vec, ok := v.(model.Vector)
			if !ok {
				errs[i] = fmt.Errorf("%s figures: unexpected result type %s", q.name, v.Type())
				return
			}
			vecs[i] = vec
		})
	}
	wg.Wait()
	if errs = slices.DeleteFunc(errs, func(e error) bool { return e == nil }); len(errs) > 0 {
		return nil, slices.MinFunc(errs, func(a, b error) int { return cmp.Compare(a.Error(), b.Error()) })
	}
	out := map[string]Region{}
	for i, q := range qs {
		for _, s := range vecs[i] {
			name := string(s.Metric["region"])
			if !src.Owns(name) || !finite(float64(s.Value)) {
				continue
			}
			rg := out[name]
			rg.Name = name
			q.fill(&rg, s)
			out[name] = rg
		}
	}
	return out, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// maxFigure bounds every figure read (a rate, a gateway count, an age in seconds): a
// sample beyond it, or a negative count, rate or share, is a broken exporter or
// Prometheus, shown as no data rather than as -9223372036854775808 gateways or a share
// that JSON cannot hold.
const maxFigure = 1e12
