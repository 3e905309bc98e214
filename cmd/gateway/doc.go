// Command gateway runs one region gateway: an authenticated, rate-limited reverse proxy.
//
//	gateway --config FILE [--listen ADDR] [--region NAME] [--check]
//	gateway healthcheck [URL]     (exit 0 when URL, default the admin port's /readyz, answers 2xx)
//	gateway version               (also --version, on one line)
//
// RATELIMIT_DATABASE_URL and RATELIMIT_REDIS_URL override the file's URLs; see
// docs/configuration.md. The command line follows every binary's conventions
// (internal/cliflag): two-dash flags, the environment in --help, exit 2 for a bad flag or
// argument and 1 for any other failure. It is wiring only (flags, signals, logger,
// registry, exit code): package gateway does the work. Nothing imports it.
package main
