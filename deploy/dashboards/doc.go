// Package dashboards ships quotaplane's Grafana dashboard (quotaplane.json, embedded) and
// exposes every panel query with its template variables filled in (Queries), so tests can
// run each one against a real Prometheus: this package's tests check that Prometheus
// accepts every query and that every metric they name is one the Go code registers; the
// end-to-end stack test requires each to return data.
//
// The dashboard is hand-written JSON (Grafana schema 39) with a Prometheus data-source
// variable ${datasource} and a multi-value region variable. Import it in Grafana
// (Dashboards > New > Import) or provision it from a file; pick the region's Prometheus.
//
// It must not import any other package of this module (its tests use deploy/local).
package dashboards
