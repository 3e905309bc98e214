package demand

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/internal/redact"
	"github.com/quotaplane/quotaplane/regions"
)

// The metric names and labels this package reads; the gateway's metrics contract.
const (
	RequestsMetric       = "ratelimit_requests_total"        // {region,route,decision,source}
	TenantRequestsMetric = "ratelimit_tenant_requests_total" // {region,tenant,route,decision}
	// OtherTenant is the tenant label of the folded, uncapped remainder; it has no scope.
	OtherTenant = regions.OtherLabel
)

// Decision label values that count as offered traffic.
const (
	DecisionAllowed         = "allowed"
	DecisionThrottled       = "throttled"
	DecisionShadowThrottled = "shadow_throttled"
)

// Defaults filled in by New.
const (
	DefaultLongWindow  = 5 * time.Minute
	DefaultShortWindow = time.Minute
	DefaultMaxAge      = 2 * time.Minute
	DefaultTimeout     = 10 * time.Second
)

// ErrUnavailable is wrapped when Prometheus cannot be queried; the caller skips its run.
var ErrUnavailable = errors.New("prometheus unavailable")

// Source is one Prometheus server. Region "" means it holds the series of every region;
// otherwise only that region's series are read from it.
type Source struct {
	Region string
	// URL is the server's base URL; a user:password@ in it is sent as basic auth and
	// never shown (String, errors).
	URL string
}

// String is "URL" or "region=URL" with the URL's password hidden, for logs and errors.
func (s Source) String() string {
	if s.Region == "" {
		return redact.URL(s.URL)
	}
	return s.Region + "=" + redact.URL(s.URL)
}

// API is the Prometheus HTTP API at s, through hc (nil: the default client). Its errors
// never show a secret of s.URL (a password, a token parameter: redact.Secrets): the HTTP
// client's errors quote the request's URL, query string included. Only a URL that does
// not parse fails, with an error that does not show it.
func (s Source) API(hc *http.Client) (v1.API, error) {
	c, err := api.NewClient(api.Config{Address: s.URL, Client: hc})
	if err != nil {
		return nil, fmt.Errorf("%w prometheus %q: not a client address", regions.ErrInvalid, s)
	}
	return v1.NewAPI(scrubbedClient{c, redact.Secrets(s.URL)}), nil
}

// scrubbedClient is a Prometheus client whose errors have the URL's secrets hidden.
type scrubbedClient struct {
	api.Client
	secrets []string
}

func (c scrubbedClient) Do(ctx context.Context, req *http.Request) (*http.Response, []byte, error) {
	resp, body, err := c.Client.Do(ctx, req)
	if err != nil && len(c.secrets) > 0 {
		err = scrubbedError{msg: redact.String(err.Error(), c.secrets), err: err}
	}
	return resp, body, err
}

// scrubbedError is err with its text scrubbed; errors.Is and As still see err (a
// deadline, a cancellation).
type scrubbedError struct {
	msg string
	err error
}

func (e scrubbedError) Error() string { return e.msg }
func (e scrubbedError) Unwrap() error { return e.err }

// checkURL checks that u is an http(s) URL with a host. Its error does not contain u: a
// parse error is reduced to its detail, and to nothing when u holds credentials.
func checkURL(u string) error {
	p, err := url.Parse(u)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) && !strings.Contains(u, "@") {
			return fmt.Errorf("does not parse: %w", uerr.Err)
		}
		return errors.New("does not parse")
	}
	if (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return errors.New("want http(s)://host:port or region=http(s)://host:port")
	}
	return nil
}

// ParseSources reads the --prometheus-url values: exactly one URL, or one "region=URL"
// per region (not both forms).
func ParseSources(values []string) ([]Source, error) {
	if len(values) == 0 {
		return nil, fmt.Errorf("%w prometheus url: none given", regions.ErrInvalid)
	}
	var out []Source
	seen := map[string]bool{}
	for _, v := range values {
		s := Source{URL: v}
		if region, u, ok := strings.Cut(v, "="); ok && regions.ValidateID("region", region) == nil {
			s = Source{Region: region, URL: u}
		}
		// Errors name the value with its password hidden (Source.String).
		if err := checkURL(s.URL); err != nil {
			return nil, fmt.Errorf("%w prometheus url %q: %w", regions.ErrInvalid, s, err)
		}
		if seen[s.Region] {
			if s.Region == "" {
				return nil, fmt.Errorf("%w prometheus url %q: give one URL, or one region=URL per region", regions.ErrInvalid, s)
			}
			return nil, fmt.Errorf("%w prometheus url %q: region %s given twice", regions.ErrInvalid, s, s.Region)
		}
		seen[s.Region] = true
		out = append(out, s)
	}
	if seen[""] && len(out) > 1 {
		return nil, fmt.Errorf("%w prometheus urls: a plain URL cannot be mixed with region=URL", regions.ErrInvalid)
	}
	return out, nil
}

// Config configures a Reader.
type Config struct {
	Sources []Source
	// LongWindow is the rate window of the regular run: the rebalancer's interval.
	LongWindow time.Duration
	// ShortWindow is the rate window of the fast path and the peak reserve (1 min).
	ShortWindow time.Duration
	// MaxAge: a series whose newest sample is older than this is stale (unknown).
	MaxAge time.Duration
	// Timeout bounds one Read.
	Timeout time.Duration
	// Client is the HTTP client; nil means a new one with Prometheus's default transport.
	Client *http.Client
}

// Rates are request rates (requests per second) over one window.
type Rates struct {
	Allowed         float64
	Throttled       float64
	ShadowThrottled float64
}

// Offered is everything the clients sent: allowed + throttled + shadow_throttled.
func (r Rates) Offered() float64 { return r.Allowed + r.Throttled + r.ShadowThrottled }

// Sample is one region's demand in one scope, read from fresh series.
type Sample struct {
	Long  Rates // over Config.LongWindow
	Short Rates // over Config.ShortWindow; Long when the short window has too few points
	// LastSeen is the time of the newest raw sample behind the rates.
	LastSeen time.Time
}

// Demand is one read. A (scope, region) absent from Scopes is unknown, never zero.
type Demand struct {
	// At is the evaluation time of every query.
	At time.Time
	// Scopes maps a scope — regions.GlobalScope for the region totals, or a capped
	// tenant/route pair — to the regions with a fresh sample.
	Scopes map[regions.Scope]map[string]Sample
	// Unreachable names the regions whose own Prometheus failed (per-region sources
	// only; with one shared source a failure fails the whole Read).
	Unreachable map[string]error
	// Targets counts, per region, the scrape targets (distinct instance labels) with a
	// fresh sample of RequestsMetric: the gateways whose traffic the region's rates
	// hold. A region with fewer than it has running gateways lacks some of its demand,
	// which is unknown, not zero (the job then keeps its shares). nil when not read.
	Targets map[string]int
	// Folded is, per region with a fresh series, the traffic of the pairs the gateways
	// folded into OtherTenant (not tracked there). Zero folded traffic in a region means
	// every pair with traffic there has a series of its own: a pair without one has none
	// (known zero, not unknown). nil when not read.
	Folded map[string]Sample
}

// KnownZero reports whether scope, without a sample in region, is known to offer
// nothing there: the region's totals and its folded traffic are fresh and nothing was
// folded, over both windows, so every pair with traffic in region has a series.
func (d Demand) KnownZero(scope regions.Scope, region string) bool {
	if _, ok := d.Sample(scope, region); ok || scope == regions.GlobalScope {
		return false
	}
	if _, ok := d.Sample(regions.GlobalScope, region); !ok {
		return false
	}
	f, ok := d.Folded[region]
	return ok && f.Long.Offered() == 0 && f.Short.Offered() == 0
}

// Sample returns region's demand in scope; false means unknown.
func (d Demand) Sample(scope regions.Scope, region string) (Sample, bool) {
	s, ok := d.Scopes[scope][region]
	return s, ok
}

// PairScopes lists the tenant/route scopes that have a sample in at least one region,
// sorted (GlobalScope excluded).
func (d Demand) PairScopes() []regions.Scope {
	out := make([]regions.Scope, 0, len(d.Scopes))
	for sc := range d.Scopes {
		if sc != regions.GlobalScope {
			out = append(out, sc)
		}
	}
	slices.SortFunc(out, func(a, b regions.Scope) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// Reader queries Prometheus. It is safe for concurrent use.
type Reader struct {
	cfg     Config
	sources []source
}

type source struct {
	Source
	api v1.API
}

// New validates cfg and fills defaults. It dials nothing.
func New(cfg Config) (*Reader, error) {
	if len(cfg.Sources) == 0 {
		return nil, fmt.Errorf("%w demand reader: no prometheus source", regions.ErrInvalid)
	}
	if cfg.LongWindow <= 0 {
		cfg.LongWindow = DefaultLongWindow
	}
	if cfg.ShortWindow <= 0 {
		cfg.ShortWindow = DefaultShortWindow
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.LongWindow < time.Second || cfg.ShortWindow < time.Second {
		return nil, fmt.Errorf("%w demand reader: windows %s/%s must be at least 1s", regions.ErrInvalid, cfg.LongWindow, cfg.ShortWindow)
	}
	r := &Reader{cfg: cfg}
	for _, s := range cfg.Sources {
		if s.Region != "" {
			if err := regions.ValidateID("region", s.Region); err != nil {
				return nil, fmt.Errorf("demand reader: %w", err)
			}
		} else if len(cfg.Sources) > 1 {
			return nil, fmt.Errorf("%w demand reader: a source for every region cannot be mixed with others", regions.ErrInvalid)
		}
		if err := checkURL(s.URL); err != nil {
			return nil, fmt.Errorf("%w demand reader: prometheus %q: %w", regions.ErrInvalid, s, err)
		}
		a, err := s.API(cfg.Client) // a parse error, which checkURL has ruled out
		if err != nil {
			return nil, fmt.Errorf("demand reader: %w", err)
		}
		r.sources = append(r.sources, source{Source: s, api: a})
	}
	return r, nil
}

// Config returns the configuration with defaults filled in.
func (r *Reader) Config() Config { return r.cfg }

// Read evaluates every query at now (zero means the current time). It fails with
// ErrUnavailable when no source could be read; with per-region sources, a region whose
// source failed is listed in Unreachable and absent from Scopes.
func (r *Reader) Read(ctx context.Context, now time.Time) (Demand, error) {
	if now.IsZero() {
		now = time.Now()
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	d := Demand{At: now, Scopes: map[regions.Scope]map[string]Sample{}, Unreachable: map[string]error{}, Targets: map[string]int{}, Folded: map[string]Sample{}}
	results := make([]sourceResult, len(r.sources))
	var wg sync.WaitGroup
	for i, s := range r.sources {
		wg.Go(func() { results[i] = r.readSource(ctx, s, now) })
	}
	wg.Wait()
	failed := 0
	for i, res := range results {
		s := r.sources[i]
		if res.err != nil {
			failed++
			if s.Region != "" {
				d.Unreachable[s.Region] = res.err
			}
			continue
		}
		for region, n := range res.targets {
			d.Targets[region] += n
		}
		for region, smp := range res.folded {
			d.Folded[region] = smp
		}
		for sc, byRegion := range res.scopes {
			if d.Scopes[sc] == nil {
				d.Scopes[sc] = map[string]Sample{}
			}
			for region, smp := range byRegion {
				d.Scopes[sc][region] = smp
			}
		}
	}
	if failed == len(r.sources) {
		return Demand{}, fmt.Errorf("read demand: %w", errors.Join(collectErrs(results)...))
	}
	return d, nil
}

func collectErrs(rs []sourceResult) []error {
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	return errs
}

type sourceResult struct {
	scopes  map[regions.Scope]map[string]Sample
	targets map[string]int
	folded  map[string]Sample
	err     error
}

// seriesKey identifies one (scope, region) series group in query results.
type seriesKey struct {
	scope  regions.Scope
	region string
}

// queries returns the six PromQL expressions for one source: rates over the long and
// short windows and the newest sample time, for the region totals and the tenant pairs.
func (r *Reader) queries(region string) (total, pair [3]string) {
	sel, tsel := offeredSelector(region), tenantSelector(region, "")
	total = [3]string{
		RegionOfferedQuery(r.cfg.LongWindow, region),
		RegionOfferedQuery(r.cfg.ShortWindow, region),
		fmt.Sprintf(`max by (region) (timestamp(%s{%s}))`, RequestsMetric, sel),
	}
	pair = [3]string{
		TenantOfferedQuery(r.cfg.LongWindow, region, ""),
		TenantOfferedQuery(r.cfg.ShortWindow, region, ""),
		fmt.Sprintf(`max by (region, tenant, route) (timestamp(%s{%s}))`, TenantRequestsMetric, tsel),
	}
	return total, pair
}

func (r *Reader) readSource(ctx context.Context, s source, now time.Time) sourceResult {
	total, pair := r.queries(s.Region)
	res := sourceResult{scopes: map[regions.Scope]map[string]Sample{}}
	for _, qs := range [][3]string{total, pair} {
		var vecs [3]model.Vector
		for i, q := range qs {
			v, err := query(ctx, s, q, now)
			if err != nil {
				res.err = err
				return res
			}
			vecs[i] = v
		}
		r.merge(res.scopes, vecs, now)
	}
	// The folded remainder (tenant _other) per region, read as a scope of its own.
	sel := offeredSelector(s.Region) + `,tenant="` + OtherTenant + `"`
	var fvecs [3]model.Vector
	for i, q := range [3]string{
		fmt.Sprintf(`sum by (region, decision) (rate(%s{%s}[%s]))`, TenantRequestsMetric, sel, model.Duration(r.cfg.LongWindow)),
		fmt.Sprintf(`sum by (region, decision) (rate(%s{%s}[%s]))`, TenantRequestsMetric, sel, model.Duration(r.cfg.ShortWindow)),
		fmt.Sprintf(`max by (region) (timestamp(%s{%s}))`, TenantRequestsMetric, sel),
	} {
		v, err := query(ctx, s, q, now)
		if err != nil {
			res.err = err
			return res
		}
		fvecs[i] = v
	}
	folded := map[regions.Scope]map[string]Sample{}
	r.merge(folded, fvecs, now) // no tenant label: keyed as the region totals
	res.folded = folded[regions.GlobalScope]

	// The targets behind the region totals: one newest-sample time per (region, instance).
	v, err := query(ctx, s, fmt.Sprintf(`max by (region, instance) (timestamp(%s{%s}))`, RequestsMetric, offeredSelector(s.Region)), now)
	if err != nil {
		res.err = err
		return res
	}
	res.targets = map[string]int{}
	for _, smp := range v {
		region := string(smp.Metric["region"])
		last := time.UnixMilli(int64(math.Round(float64(smp.Value) * 1000)))
		if regions.ValidateID("region", region) != nil || math.IsNaN(float64(smp.Value)) || now.Sub(last) > r.cfg.MaxAge {
			continue
		}
		res.targets[region]++
	}
	return res
}

func query(ctx context.Context, s source, q string, now time.Time) (model.Vector, error) {
	v, _, _, err := s.api.Query(ctx, q, now)
	if err != nil {
		// The HTTP client's *url.Error shows the URL with its password as ***.
		return nil, fmt.Errorf("%w: query %s: %w", ErrUnavailable, s.Source, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("%w: query %s: got %s, want a vector", ErrUnavailable, s.Source, v.Type())
	}
	return vec, nil
}

// merge turns the (long, short, newest) vectors of one metric into samples, keeping only
// fresh series with a long-window rate.
func (r *Reader) merge(into map[regions.Scope]map[string]Sample, vecs [3]model.Vector, now time.Time) {
	long, short := rates(vecs[0]), rates(vecs[1])
	for _, smp := range vecs[2] {
		k, ok := keyOf(smp.Metric)
		if !ok || math.IsNaN(float64(smp.Value)) {
			continue
		}
		last := time.UnixMilli(int64(math.Round(float64(smp.Value) * 1000)))
		if now.Sub(last) > r.cfg.MaxAge {
			continue // stale: unknown
		}
		l, ok := long[k]
		if !ok {
			continue // too few points for a rate: unknown
		}
		s, ok := short[k]
		if !ok {
			s = l
		}
		if into[k.scope] == nil {
			into[k.scope] = map[string]Sample{}
		}
		into[k.scope][k.region] = Sample{Long: l, Short: s, LastSeen: last}
	}
}

// rates sums a "sum by (..., decision)" vector into Rates per series key.
func rates(vec model.Vector) map[seriesKey]Rates {
	out := make(map[seriesKey]Rates, len(vec))
	for _, smp := range vec {
		k, ok := keyOf(smp.Metric)
		v := float64(smp.Value)
		if !ok || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			continue
		}
		r := out[k]
		r.Add(string(smp.Metric["decision"]), v)
		out[k] = r
	}
	return out
}

// keyOf reads region (and tenant, route when present) from a result's labels; series
// with ids that fail validation are ignored.
func keyOf(m model.Metric) (seriesKey, bool) {
	region := string(m["region"])
	if regions.ValidateID("region", region) != nil {
		return seriesKey{}, false
	}
	tenant, hasTenant := m["tenant"]
	if !hasTenant {
		return seriesKey{scope: regions.GlobalScope, region: region}, true
	}
	route := string(m["route"])
	if tenant == OtherTenant || regions.ValidateID("tenant", string(tenant)) != nil || regions.ValidateID("route", route) != nil {
		return seriesKey{}, false
	}
	return seriesKey{scope: regions.Scope{Tenant: string(tenant), Route: route}, region: region}, true
}
