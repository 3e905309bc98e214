// Package demand reads offered demand from Prometheus: per region (scope "*", from
// ratelimit_requests_total) and per capped tenant/route pair (from
// ratelimit_tenant_requests_total), over a long window (the rebalancer's interval) and a
// short one (1 min), with allowed and throttled rates kept apart.
//
// Offered = allowed + throttled + shadow_throttled: a region throttled at its share never
// shows its real demand through its allowed traffic alone. A region (or pair) with no
// fresh sample is absent from the result — unknown, never zero. A Prometheus that cannot
// be queried is an error, so the caller skips its run instead of acting on a guess.
//
// The PromQL of offered demand lives here only (RegionOfferedQuery, TenantOfferedQuery,
// split with Rates.Add): the status page, ratectl status and the demo query it too, so
// every reader of per-region traffic agrees on what offered is.
//
// A source URL may carry user:password@ (sent as basic auth); Source.String and every
// error show it with the password hidden.
//
// It imports regions (for Scope), internal/redact (the one URL scrubber) and the
// Prometheus HTTP API client only; never gateway,
// the rebalancer's job or cmd.
package demand
