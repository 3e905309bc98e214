// Package regions owns the control-plane data: tenants' rules, API keys, regions and
// their shares of every global limit, and the gateway instances alive in each region.
//
// It holds the pure model (ids, rules, scopes, share resolution, scaling a rule by a
// share), the PostgreSQL store behind it, and the Snapshot that gateways load whole,
// validate and swap atomically, reloading on NOTIFY and on a timer.
//
// It imports only migrations from this module; never gateway, rebalancer or cmd.
package regions
