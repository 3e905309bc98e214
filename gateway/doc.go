// Package gateway owns the region gateway's HTTP side: its configuration file, routing
// requests to upstreams by net/http ServeMux patterns, resolving the API key (X-Api-Key
// or auth.key_header, or a Bearer token) to a tenant, asking the limiter for a decision
// on one path shared by three doors (the reverse proxy, Envoy's rate-limit service on
// rls_listen, and the /v1/check endpoint for nginx and Traefik), the rate-limit response
// headers, the reverse proxy,
// the admin endpoints (/metrics, /healthz, /readyz), the gateway's metrics, and the
// lifecycle that wires the snapshot reloader, heartbeats and graceful drain together.
//
// Decisions themselves (Redis bucket, breaker, local fallback, leases) belong to
// gateway/limiter; the control-plane data belongs to regions. This package must not
// import rebalancer or cmd, and it never talks to Redis or PostgreSQL directly: it goes
// through the limiter and the regions store.
package gateway
