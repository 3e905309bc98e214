// Package gateway owns the region gateway's HTTP side: its configuration file, its three
// doors (the reverse proxy, the /v1/check endpoint for nginx and Traefik, and Envoy's
// rate-limit service on rls_listen), the one admission path they share (admit.go: the
// route, matched in the canonical form the routing rules define (routing.go), the
// tenant the API key resolves to, the unauthenticated guard, the cost and the limit_by
// value), the one decision path after it (decide.go, the only place a limiter.Request
// is built), the rate-limit response headers, the admin endpoints (/metrics, /healthz,
// /readyz), the gateway's metrics, and the lifecycle that wires the snapshot reloader,
// heartbeats and graceful drain together. Each door's file holds only its protocol.
//
// Decisions themselves (Redis bucket, breaker, local fallback, leases) belong to
// gateway/limiter; the control-plane data belongs to regions. This package must not
// import rebalancer or cmd, and it never talks to Redis or PostgreSQL directly: it goes
// through the limiter and the regions store.
package gateway
