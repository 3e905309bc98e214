// Command rebalancer is the control-plane job: every --interval it reads offered demand
// per region from Prometheus and rewrites the regions' shares of every global limit in
// PostgreSQL (rebalancer/job). Only the replica holding a PostgreSQL advisory lock acts,
// so several may run. Its admin port serves /metrics, /healthz and the status page
// (rebalancer/status: "/" and "/status.json").
//
// It starts while PostgreSQL is down (the store is opened lazily and every tick retries,
// counted as skipped_database), so the admin port is up regardless.
//
// `rebalancer healthcheck [URL]` exits 0 when URL (default http://127.0.0.1:9102/readyz)
// answers 2xx: the check of an image that has no shell.
//
// The command line follows every binary's conventions (internal/cliflag): two-dash flags,
// durations with days (--interval 1d), RATELIMIT_DATABASE_URL and RATELIMIT_PROMETHEUS_URL
// behind --database-url and --prometheus-url (listed in --help), `version` beside
// --version, exit 2 for a bad flag or argument and 1 for any other failure.
//
// It is wiring only: flags, logging, the admin server and the exit code.
package main
