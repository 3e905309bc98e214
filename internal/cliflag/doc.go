// Package cliflag holds the command-line conventions the gateway, the rebalancer and
// ratectl share: one duration syntax with days and weeks (Duration), the RATELIMIT_*
// environment variables with their deprecated aliases and the "Environment:" section of
// --help (Var), usage errors that exit 2 (UsageError, Exit), and the `version` and
// `healthcheck` subcommands (Configure, HealthcheckCmd).
//
// It imports internal/version and internal/healthcheck of this module, nothing else.
package cliflag
