package gateway

import "strings"

// The gateway's modes (the mode key).
const (
	// ModeDatabase: keys, rules and shares come from PostgreSQL (database_url, or
	// RATELIMIT_DATABASE_URL); the file has no tenants.
	ModeDatabase = "database"
	// ModeStandalone: keys and rules come from the file's tenants and default_rule; no
	// database.
	ModeStandalone = "standalone"
)

// How the mode was decided, for the start-up log line.
const (
	modeFromConfig        = "config"
	modeFromDatabaseURL   = "inferred from database_url"
	modeFromTenantsNoDB   = "inferred from tenants without database_url"
	modeSourceUnnormalize = ""
)

// OverridesFromLookupEnv is OverridesFromEnv that also notices a variable that is set but
// empty (an unfilled Secret, a `${VAR}` that expanded to nothing): LoadConfig refuses
// such a configuration instead of quietly reading "no database" or "no Redis" into it.
func OverridesFromLookupEnv(lookup func(string) (string, bool)) Overrides {
	var ov Overrides
	for _, e := range []struct {
		name string
		dst  *string
	}{{EnvDatabaseURL, &ov.DatabaseURL}, {EnvRedisURL, &ov.RedisURL}} {
		v, ok := lookup(e.name)
		if ok && strings.TrimSpace(v) == "" {
			ov.emptyEnv = append(ov.emptyEnv, e.name)
			continue
		}
		*e.dst = v
	}
	return ov
}

// ModeSource says how the mode was decided: "config", or how it was inferred.
func (c *Config) ModeSource() string { return c.modeSource }

// checkMode decides and checks the mode, before anything else reads it. A configuration
// may leave mode out only when what it holds says which mode it is: a database URL
// means database mode, tenants without one mean standalone. One that says neither is
// refused rather than guessed: an empty RATELIMIT_DATABASE_URL used to turn a production
// gateway into a standalone one with no tenants that answered every request 401.
//
// It also refuses a Redis that is configured but empty (redis settings without a URL,
// or RATELIMIT_REDIS_URL set to ""): limits would silently become per instance. A
// gateway without Redis must say so by having no redis section at all.
func (c *Config) checkMode(redisSet string) error {
	for _, name := range c.emptyEnv {
		switch name {
		case EnvDatabaseURL:
			if c.DatabaseURL == "" {
				return c.bad("database_url", "%s is set but empty: give the PostgreSQL URL, or unset it (and set mode: standalone)", name)
			}
		case EnvRedisURL:
			if c.Redis.URL == "" {
				return c.bad("redis.url", "%s is set but empty: give the Redis URL, or unset it and drop the redis section to limit per instance", name)
			}
		}
	}
	switch c.Mode {
	case ModeDatabase:
		if c.DatabaseURL == "" {
			return c.bad("database_url", "mode database needs a PostgreSQL URL (database_url, or %s): none is set", EnvDatabaseURL)
		}
		if c.modeSource == modeSourceUnnormalize {
			c.modeSource = modeFromConfig
		}
	case ModeStandalone:
		if c.DatabaseURL != "" {
			return c.bad("database_url", "mode standalone takes no database (database_url, or %s, is set): set mode: database, or remove the URL", EnvDatabaseURL)
		}
		if c.modeSource == modeSourceUnnormalize {
			c.modeSource = modeFromConfig
		}
	case "":
		switch {
		case c.DatabaseURL != "":
			c.modeSource = modeFromDatabaseURL
		case len(c.Tenants) > 0:
			c.modeSource = modeFromTenantsNoDB
		default:
			return c.bad("mode", "not set, and neither database_url (%s) nor tenants say which mode: set mode: database with a database URL, or mode: standalone with tenants", EnvDatabaseURL)
		}
		c.Mode = ModeStandalone
		if c.DatabaseURL != "" {
			c.Mode = ModeDatabase
		}
	default:
		return c.bad("mode", "want %s or %s, got %q", ModeDatabase, ModeStandalone, c.Mode)
	}
	if c.Mode == ModeStandalone && !hasKeys(c.Tenants) {
		return c.bad("tenants", "mode standalone needs at least one tenant with a key: without one every request is answered 401")
	}
	// A file's redis settings without a URL mean the URL was to come from the environment;
	// a Config built in code has no environment to lose one to.
	if !c.normalized && c.file != "" && !c.Redis.enabled() && redisSet != "" {
		return c.bad("redis.url", "empty, but the redis section sets %s: give the URL (redis.url, or %s), or drop the section to limit per instance", redisSet, EnvRedisURL)
	}
	return nil
}

func hasKeys(ts []TenantConfig) bool {
	for _, t := range ts {
		if len(t.Keys) > 0 {
			return true
		}
	}
	return false
}

// enabled reports whether a Redis is configured: a URL, or Sentinel.
func (r *RedisConfig) enabled() bool { return r.URL != "" || r.Sentinel.configured() }

// configuredKey names a redis setting other than the URL that is given, or is ""; only
// meaningful before defaults are filled in.
func (r *RedisConfig) configuredKey() string {
	switch {
	case r.Cluster:
		return "cluster"
	case r.Timeout != 0:
		return "timeout"
	case r.KeyPrefix != "":
		return "key_prefix"
	case r.Breaker != BreakerConfig{}:
		return "breaker"
	case r.TLS != RedisTLSConfig{}:
		return "tls"
	}
	return ""
}
