// Package regions owns the control-plane data: tenants' rules, API keys, regions and
// their shares of every global limit, and the gateway instances alive in each region.
//
// It holds the pure model (model.go: ids, rules, scopes, scaling a rule by a share;
// snapshot.go: share and rule resolution), the PostgreSQL Store behind it (store*.go:
// every write one validated transaction, recorded by the schema's history and audit
// triggers with the actor and reason given to the method or by WithAudit), and the
// Reloader (reloader.go) through which gateways hold a Snapshot: loaded whole, validated,
// swapped atomically, reloaded on NOTIFY (NotifyChannel) and on a timer.
//
// It imports only migrations from this module; never gateway, rebalancer or cmd.
package regions
