// Package demandtest serves the gateway's request counters with rates a test sets, so the
// rebalancer's tests can have a real Prometheus scrape known demand. Each counter grows
// linearly in time at its set rate, so Prometheus's rate() recovers it exactly.
//
// It is for tests only; it imports client_golang and net/http/httptest, nothing of this
// module but demand's metric names.
package demandtest

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
)

var (
	requestsDesc = prometheus.NewDesc(demand.RequestsMetric, "Requests by decision (test exporter).",
		[]string{"region", "route", "decision", "source"}, nil)
	tenantDesc = prometheus.NewDesc(demand.TenantRequestsMetric, "Requests of capped tenants (test exporter).",
		[]string{"region", "tenant", "route", "decision"}, nil)
)

// Exporter is an HTTP server on 127.0.0.1 exposing /metrics.
type Exporter struct {
	srv *httptest.Server
	mu  sync.Mutex
	now func() time.Time
	ser map[series]*counter
}

type series struct {
	tenant bool
	labels [4]string
}

type counter struct {
	base  float64
	rate  float64
	since time.Time
}

func (c *counter) value(now time.Time) float64 { return c.base + c.rate*now.Sub(c.since).Seconds() }

// New starts an exporter; Close stops it.
func New() *Exporter {
	e := &Exporter{now: time.Now, ser: map[series]*counter{}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	e.srv = httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return e
}

// Addr is host:port, for a scrape target.
func (e *Exporter) Addr() string {
	u, _ := url.Parse(e.srv.URL)
	return u.Host
}

// Close stops serving; Prometheus then marks every series stale.
func (e *Exporter) Close() { e.srv.Close() }

// Handler is the /metrics handler, for tests that serve it elsewhere.
func (e *Exporter) Handler() http.Handler { return e.srv.Config.Handler }

// SetRegion sets region's request rates (per second) by decision, on route "default"
// with source "redis".
func (e *Exporter) SetRegion(region string, allowed, throttled, shadowThrottled float64) {
	for d, r := range map[string]float64{demand.DecisionAllowed: allowed, demand.DecisionThrottled: throttled, demand.DecisionShadowThrottled: shadowThrottled} {
		e.set(series{labels: [4]string{region, "default", d, "redis"}}, r)
	}
}

// SetTenant sets the rates of one capped tenant/route pair in region.
func (e *Exporter) SetTenant(region, tenant, route string, allowed, throttled float64) {
	for d, r := range map[string]float64{demand.DecisionAllowed: allowed, demand.DecisionThrottled: throttled} {
		e.set(series{tenant: true, labels: [4]string{region, tenant, route, d}}, r)
	}
}

// SetTenantShadow sets the shadow_throttled rate of one capped tenant/route pair in
// region: requests a shadow rule would have rejected and forwarded.
func (e *Exporter) SetTenantShadow(region, tenant, route string, shadowThrottled float64) {
	e.set(series{tenant: true, labels: [4]string{region, tenant, route, demand.DecisionShadowThrottled}}, shadowThrottled)
}

// RemoveRegion drops every series of region, as if its gateways vanished.
func (e *Exporter) RemoveRegion(region string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for s := range e.ser {
		if s.labels[0] == region {
			delete(e.ser, s)
		}
	}
}

func (e *Exporter) set(s series, rate float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	c, ok := e.ser[s]
	if !ok {
		e.ser[s] = &counter{rate: rate, since: now}
		return
	}
	c.base, c.rate, c.since = c.value(now), rate, now
}

// Describe sends nothing: the exporter is an unchecked collector.
func (e *Exporter) Describe(chan<- *prometheus.Desc) {}

// Collect sends every counter at its current value.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	for s, c := range e.ser {
		d := requestsDesc
		if s.tenant {
			d = tenantDesc
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, c.value(now), s.labels[:]...)
	}
}
