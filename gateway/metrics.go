package gateway

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotaplane/quotaplane/gateway/limiter"
)

// decision is the outcome label of ratelimit_requests_total.
type decision uint8

const (
	decAllowed decision = iota
	decThrottled
	decShadowThrottled
	decUnauthenticated
	numDecisions
)

var decisionNames = [numDecisions]string{"allowed", "throttled", "shadow_throttled", "unauthenticated"}

// source is who decided, as a label.
type source uint8

const (
	srcRedis source = iota
	srcFallback
	srcLocal
	srcLease
	srcNone // no decision: unauthenticated, or the limiter failed and the request was let through
	numSources
)

var sourceNames = [numSources]string{"redis", "fallback", "local", "lease", "none"}

// sourceOf is the label of the limiter's source.
func sourceOf(s limiter.Source) source {
	switch s {
	case limiter.SourceRedis:
		return srcRedis
	case limiter.SourceFallback:
		return srcFallback
	case limiter.SourceLocal:
		return srcLocal
	case limiter.SourceLease:
		return srcLease
	}
	return srcNone
}

// door is the interface a decision was asked through, a label of
// ratelimit_requests_total: the gateway's own reverse proxy, Envoy's rate-limit service
// (rls_listen), or the HTTP check endpoint (/v1/check, for nginx and Traefik).
type door uint8

const (
	doorProxy door = iota
	doorRLS
	doorCheck
	numDoors
)

var doorNames = [numDoors]string{"proxy", "rls", "check"}

// metrics are the gateway's series; the names are a contract (the rebalancer, ratectl and
// the dashboards read them). The limiter registers its own (Redis errors, breaker,
// fallback) on the same registerer.
type metrics struct {
	requests       *prometheus.CounterVec // region, route, decision, source
	tenantRequests *prometheus.CounterVec // region, tenant, route, decision
	duration       [numSources]prometheus.Observer
	lastReload     prometheus.Gauge
	rulesLoaded    prometheus.Gauge
	reloadErrors   prometheus.Counter
	shareRatio     *prometheus.GaugeVec // region, scope
	instances      prometheus.Gauge
	heldRaises     prometheus.Gauge
	decisionErrors prometheus.Counter
	unmatched      prometheus.Counter
	upstreamErrors *prometheus.CounterVec // region, route, reason
	heartbeatErrs  prometheus.Counter
	ready          prometheus.Gauge
	// unauthThrottled counts requests refused 429 by unauthenticated_limit.
	unauthThrottled prometheus.Counter
	// invalid counts authenticated requests refused for a path, cost or value spelling.
	invalid [numDoors][numInvalid]prometheus.Counter
	// settles counts real costs settled after a response (settle.go): route, interface,
	// outcome.
	settles *prometheus.CounterVec
}

// invalidReason is the reason label of ratelimit_invalid_requests_total.
type invalidReason uint8

const (
	invalidPath invalidReason = iota
	invalidCost
	invalidValue
	numInvalid
)

var invalidNames = [numInvalid]string{"path", "cost", "value"}

// decisionBuckets span 50µs (a local decision) to 50ms (far past any sane Redis timeout).
var decisionBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05}

// newMetrics registers the gateway's series; extraBounds are added to the decision
// histogram's buckets (the Redis timeout and timeout + 1 ms).
func newMetrics(reg prometheus.Registerer, region string, extraBounds []float64) (*metrics, error) {
	r := prometheus.Labels{"region": region}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_requests_total",
			Help: "Requests (RLS descriptors) by route, decision (allowed, throttled, shadow_throttled, unauthenticated), decision source (redis, fallback, local, lease, none) and interface (proxy, rls, check).",
		}, []string{"region", "route", "decision", "source", "interface"}),
		tenantRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_tenant_requests_total",
			Help: "Requests of the busiest (tenant, route) pairs, at most metrics.max_tenants of them; the rest count as tenant=\"" + labelOther + "\", route=\"" + labelOther + "\".",
		}, []string{"region", "tenant", "route", "decision"}),
		shareRatio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "ratelimit_region_share_ratio",
			Help:        "This region's effective share of the limits in a scope, as enforced (an increase the other regions have not acknowledged yet is not): \"*\" and the tracked tenant/route pairs.",
			ConstLabels: r,
		}, []string{"scope"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "ratelimit_settles_total",
			Help:        "Real costs settled after a response (cost.response_header, or an RLS done-phase descriptor), by route, interface and outcome: settled, capped (above cost.max: charged as max), missing and malformed (no extra charge), failed (the limiter refused the settle).",
			ConstLabels: r,
		}, []string{"route", "interface", "outcome"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "ratelimit_upstream_errors_total",
			Help:        "Requests answered 502 because the upstream failed, by reason: timeout, connect, tls, reset, other.",
			ConstLabels: r,
		}, []string{"route", "reason"}),
	}
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "ratelimit_decision_duration_seconds",
		Help:        "Time to decide one request, by decision source.",
		Buckets:     withBounds(decisionBuckets, extraBounds),
		ConstLabels: r,
	}, []string{"source"})
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: r})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: r})
	}
	m.lastReload = gauge("ratelimit_rules_last_reload_success_timestamp_seconds", "When the rules snapshot was last loaded successfully.")
	m.rulesLoaded = gauge("ratelimit_rules_loaded", "Rules in the current snapshot.")
	m.reloadErrors = counter("ratelimit_rule_reload_errors_total", "Snapshot reloads that failed; the previous snapshot stays in use.")
	m.instances = gauge("ratelimit_gateway_instances", "Live gateway instances of this region by heartbeat (0 = unknown; the fallback then divides by expected_instances).")
	m.heldRaises = gauge("ratelimit_share_increases_held", "Share increases of this region not enforced yet: a gateway of another region, seen within the ack horizon (5 min), has not reported a snapshot that includes them (it may be cut off from the database and still hold its old share).")
	m.decisionErrors = counter("ratelimit_decision_errors_total", "Requests let through because the limiter could not decide (fail open).")
	m.unmatched = counter("ratelimit_unmatched_requests_total", "Authenticated requests that matched no route (answered 404).")
	m.heartbeatErrs = counter("ratelimit_heartbeat_errors_total", "Heartbeats that could not be written.")
	m.ready = gauge("ratelimit_gateway_ready", "1 when a snapshot is loaded and the gateway serves requests.")
	m.unauthThrottled = counter("ratelimit_unauthenticated_throttled_total", "Requests refused 429 because their client address used up its unauthenticated_limit (failed authentications).")

	for _, c := range []prometheus.Collector{
		m.requests, m.tenantRequests, duration, m.lastReload, m.rulesLoaded, m.reloadErrors,
		m.shareRatio, m.instances, m.heldRaises, m.decisionErrors, m.unmatched, m.upstreamErrors, m.heartbeatErrs, m.ready,
		m.unauthThrottled, m.settles,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	invalid := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "ratelimit_invalid_requests_total",
		Help:        "Authenticated requests refused before any bucket was chosen, by interface and reason: path (a spelling the routing rules refuse), cost, value (a limit_by value missing, repeated, list-valued or malformed).",
		ConstLabels: r,
	}, []string{"interface", "reason"})
	if err := reg.Register(invalid); err != nil {
		return nil, err
	}
	for s := range numSources {
		m.duration[s] = duration.WithLabelValues(sourceNames[s])
	}
	for d := range numDoors {
		for i := range numInvalid {
			m.invalid[d][i] = invalid.WithLabelValues(doorNames[d], invalidNames[i])
		}
	}
	return m, nil
}

// routeCounters are one route's ratelimit_requests_total series, resolved once so the
// hot path does no label lookup.
type routeCounters [numDoors][numDecisions][numSources]prometheus.Counter

// newRouteCounters resolves (and so pre-initialises) a route's series for the given
// doors: every decision with every source, except unauthenticated, which only ever has
// source "none".
func (m *metrics) newRouteCounters(region, route string, doors ...door) *routeCounters {
	var rc routeCounters
	for _, i := range doors {
		for d := range numDecisions {
			for s := range numSources {
				if d == decUnauthenticated && s != srcNone {
					continue // never counted; left nil
				}
				rc[i][d][s] = m.requests.WithLabelValues(region, route, decisionNames[d], sourceNames[s], doorNames[i])
			}
		}
	}
	return &rc
}

// withBounds is buckets with extra bounds merged in, sorted, without duplicates.
func withBounds(buckets, extra []float64) []float64 {
	out := append([]float64(nil), buckets...)
	for _, e := range extra {
		if !(e > 0) || slices.Contains(out, e) {
			continue
		}
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// trackingRegisterer remembers what was registered through it, so that a failed New can
// unregister it all.
type trackingRegisterer struct {
	prometheus.Registerer
	mu   sync.Mutex
	done []prometheus.Collector
}

func (r *trackingRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	r.done = append(r.done, c)
	r.mu.Unlock()
	return nil
}

func (r *trackingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *trackingRegisterer) unregisterAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range slices.Backward(r.done) {
		r.Registerer.Unregister(c)
	}
	r.done = nil
}
