// Package status serves the rebalancer's status page on its admin port: the regions
// with their live gateways, the default ("*") shares with their source and each
// region's live offered and throttled rates, the tenant shares that differ most from
// the default, the recent share changes with their reasons and demand inputs, and
// charts of the last hour (throttled rate and share per region) drawn as inline SVG on
// the server. The same data is served as JSON at /status.json.
//
// PostgreSQL (store.Store) is the source of truth: without it the page is a 503 with a
// plain message. Prometheus only adds the live figures and the charts: without it the
// page still renders, with a visible "Prometheus unreachable" note.
//
// Everything the page needs is embedded (go:embed): no JavaScript framework, no CDN.
// Every user-controlled string (tenant ids, reasons, actors) goes through html/template.
//
// The live figures and the charts' PromQL come from rebalancer/status/figures, which
// ratectl status reads too, so both show the same figures.
//
// It imports regions, regions/store, rebalancer/job (for the history inputs),
// rebalancer/status/figures and the Prometheus HTTP API client; never gateway or cmd.
package status
