// Package regions owns the control-plane model: tenant and route ids, token-bucket rules
// and the limit a region enforces (Limit, scaled by a share), scopes, shares and how a
// region's effective share is resolved, API-key hashes, gateway instances, and the
// Snapshot that gateways hold (everything above, validated as one immutable value).
//
// It is pure: no I/O, no clock of its own (callers pass now). The PostgreSQL store, the
// NOTIFY channel and the reloader that keeps a Snapshot fresh are regions/store.
//
// It imports nothing else from this module; gateway, gateway/limiter, rebalancer and the
// store import it.
package regions
