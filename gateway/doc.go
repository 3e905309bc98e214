// Package gateway owns the region gateway's HTTP side: its configuration file, routing
// requests to upstreams by net/http ServeMux patterns, resolving X-Api-Key to a tenant,
// asking the limiter for a decision, the rate-limit response headers, the reverse proxy,
// the admin endpoints (/metrics, /healthz, /readyz), the gateway's metrics, and the
// lifecycle that wires the snapshot reloader, heartbeats and graceful drain together.
//
// Decisions themselves (Redis bucket, breaker, local fallback, leases) belong to
// gateway/limiter; the control-plane data belongs to regions. This package must not
// import rebalancer or cmd, and it never talks to Redis or PostgreSQL directly: it goes
// through the limiter and the regions store.
package gateway
