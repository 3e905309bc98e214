package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

func TestLoadConfigGoodFull(t *testing.T) {
	c, err := LoadConfig("testdata/good-full.yaml", Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Region != "us-east" || c.Redis.Timeout != 5*time.Millisecond || c.ReloadInterval != 30*time.Second ||
		c.HeartbeatInterval != 5*time.Second || c.ExpectedInstances != 20 || c.Metrics.MaxTenants != 1000 ||
		len(c.Routes) != 3 || c.Routes[2].Cost.Max != 50 || c.Routes[1].LimitBy != "client_ip" || c.Leases.Threshold != 200 || c.RLSListen == "" ||
		len(c.Tenants) != 2 || c.Tenants[1].Rules[0].Shards != 2 || c.File() != "testdata/good-full.yaml" ||
		c.UnauthenticatedLimit.Capacity != 100 || len(c.TrustedProxies) != 3 || c.MaxHeaderBytes != 65536 {
		t.Fatalf("unexpected config: %+v", c)
	}
	if !c.Standalone() {
		t.Fatal("no database_url: want standalone")
	}
	snap, err := standaloneSnapshot(&c, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rule, _, _ := snap.RegionalRule(c.Region, "shop-a", "create-order")
	want := []regions.Band{{Name: "hour", Capacity: 100, RefillPerSecond: 100.0 / 3600}, {Name: "day", Capacity: 1000, RefillPerSecond: 0.02}, {Name: "month", Capacity: 30000, RefillPerSecond: 30000.0 / (30 * 86400)}}
	if !slices.Equal(rule.Bands, want) {
		t.Fatalf("shop-a/create-order bands %+v, want %+v", rule.Bands, want)
	}
}

func TestLoadConfigDefaults(t *testing.T) {
	c, err := LoadConfig("testdata/good-minimal.yaml", Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Region: "eu-west", Listen: DefaultListen, AdminListen: DefaultAdminListen,
		Redis: RedisConfig{Timeout: DefaultRedisTimeout, KeyPrefix: DefaultKeyPrefix,
			Breaker: BreakerConfig{Failures: DefaultBreakerFailures, OpenFor: DefaultBreakerOpenFor}},
		ReloadInterval:    DefaultReloadInterval,
		HeartbeatInterval: DefaultHeartbeatInterval,
		ExpectedInstances: DefaultExpectedInstances,
		DrainTimeout:      DefaultDrainTimeout,
		LogLevel:          "info",
		DefaultRule:       RuleConfig{Capacity: DefaultCapacity, RefillPerSecond: DefaultRefillPerSecond, Shards: 1},
		Metrics:           MetricsConfig{MaxTenants: DefaultMaxTenants, TenantInterval: DefaultTenantInterval},
		MaxHeaderBytes:    DefaultMaxHeaderBytes,
		UnauthenticatedLimit: UnauthLimitConfig{Capacity: DefaultUnauthCapacity, RefillPerSecond: DefaultUnauthRefill,
			MaxClients: DefaultUnauthMaxClients},
	}
	got := c
	got.Routes, got.Tenants, got.file = nil, nil, ""
	if !equalConfig(got, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", got, want)
	}
}

func equalConfig(a, b Config) bool {
	return a.Region == b.Region && a.Listen == b.Listen && a.AdminListen == b.AdminListen &&
		a.DatabaseURL == b.DatabaseURL && reflect.DeepEqual(a.Redis, b.Redis) && a.ReloadInterval == b.ReloadInterval &&
		a.HeartbeatInterval == b.HeartbeatInterval && a.ExpectedInstances == b.ExpectedInstances &&
		a.DrainTimeout == b.DrainTimeout && a.InstanceID == b.InstanceID && a.LogLevel == b.LogLevel &&
		reflect.DeepEqual(a.DefaultRule, b.DefaultRule) && a.Metrics == b.Metrics && a.MaxHeaderBytes == b.MaxHeaderBytes &&
		a.UnauthenticatedLimit == b.UnauthenticatedLimit && slices.Equal(a.TrustedProxies, b.TrustedProxies)
}

func TestLoadConfigOverrides(t *testing.T) {
	env := map[string]string{
		EnvDatabaseURL: "postgres://gw@127.0.0.1:5432/q",
		EnvRedisURL:    "redis://127.0.0.1:7000/1",
	}
	ov := OverridesFromEnv(func(k string) string { return env[k] })
	ov.Listen, ov.Region = "127.0.0.1:18080", "ap-south"
	c, err := LoadConfig("testdata/good-database.yaml", ov)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:18080" || c.Region != "ap-south" || c.DatabaseURL != env[EnvDatabaseURL] || c.Redis.URL != env[EnvRedisURL] {
		t.Fatalf("overrides not applied: %+v", c)
	}
	if c.Standalone() {
		t.Fatal("database_url from the environment: want database mode")
	}
	// A database URL from the environment turns a standalone file's tenants into an error.
	if _, err := LoadConfig("testdata/good-full.yaml", ov); err == nil || !strings.Contains(err.Error(), "tenants: only allowed without database_url") {
		t.Fatalf("tenants with a database from env: got %v", err)
	}
}

// TestBadConfigs checks one fixture per failure mode and its whole error message.
func TestBadConfigs(t *testing.T) {
	want := map[string]string{
		"bad-duration":                      `redis.timeout: "banana" is not a duration (write e.g. 5ms, 30s, 1m)`,
		"bad-listen":                        `listen: want host:port, got "localhost"`,
		"bad-log-level":                     `log_level: want debug, info, warn or error, got "loud"`,
		"bad-key-prefix":                    `redis.key_prefix: "rl {x}": only letters, digits, '.', '_', '-' and ':' are allowed`,
		"breaker-open-for-too-short":        `redis.breaker.open_for: must be between 10ms and 1m, got 1ms`,
		"breaker-failure-span-too-long":     `redis.breaker.failure_span: 2m0s is longer than 1m: a Redis that is down would cost every request the timeout for that long`,
		"bad-pattern":                       `routes[0].match: parsing "POST orders": at offset 5: host/path missing /`,
		"bad-redis-url":                     `redis.url: scheme "http" not supported (want redis, rediss, unix)`,
		"bad-region-id":                     `region: region id "us east": only letters, digits, '.', '_' and '-' are allowed`,
		"bad-tenant-id":                     `tenants[0].id: tenant id "shop/a": only letters, digits, '.', '_' and '-' are allowed`,
		"bad-upstream":                      `routes[0].upstream: scheme "ftp" not supported (want http, https)`,
		"conflicting-patterns":              `routes[1].match: "POST /orders" matches the same requests as routes[0].match "POST /orders"`,
		"default-rule-zero-capacity":        `default_rule.capacity: must be between 1 and 1000000000000000, got 0`,
		"duplicate-key":                     `tenants[1].keys[0]: the same API key is already given at tenants[0].keys[0]`,
		"duplicate-route-id":                `routes[1].id: "a" is already the id of routes[0]`,
		"duplicate-yaml-key":                `line 2: mapping key "region" already defined at [1:1]`,
		"duration-without-unit":             `reload_interval: "30" is not a duration (write e.g. 5ms, 30s, 1m)`,
		"empty":                             `the file is empty`,
		"key-bad-sha256":                    `tenants[0].keys[0]: sha256 must be 64 hex digits (sha256sum of the key)`,
		"key-empty":                         `tenants[0].keys[0]: give secret (the key) or sha256 (its hex SHA-256)`,
		"key-secret-and-sha256":             `tenants[0].keys[0]: give secret or sha256, not both`,
		"missing-region":                    `region: required (or --region)`,
		"missing-upstream":                  `routes[0].upstream: required`,
		"negative-duration":                 `redis.timeout: must be a positive duration, got -5ms`,
		"negative-max-tenants":              `metrics.max_tenants: must be between 1 and 100000, got -1`,
		"no-routes":                         `routes: at least one route is required`,
		"redis-timeout-too-long":            `redis.timeout: 10s is longer than 1s: a slow Redis would become a slow gateway`,
		"reserved-route-id":                 `routes[0].id: route id "_other": reserved for metrics (the series of untracked tenants)`,
		"rule-unknown-route":                `tenants[0].rules[0].route: no route has id "delete-order"`,
		"rule-zero-refill":                  `tenants[0].rules[0].refill_per_second: must be > 0 and at most 1e+12, got 0`,
		"syntax-error":                      `line 2: ',' or ']' must be specified`,
		"tenants-with-database":             `tenants: only allowed without database_url (standalone mode); with a database, keys and rules live there`,
		"unknown-key":                       `regoin: unknown key "regoin"`,
		"unknown-nested-key":                `redis.timeuot: unknown key "timeuot"`,
		"wildcard-tenant-with-keys":         `tenants[0].keys: tenant "*" carries route rules for every tenant and cannot have keys`,
		"wrong-type":                        `expected_instances: wrong type: want an integer, got "many"`,
		"trusted-proxy-not-cidr":            `trusted_proxies[1]: "10.0.0.1/33" is not a CIDR or an address`,
		"unauthenticated-limit-zero-refill": `unauthenticated_limit.refill_per_second: must be > 0 and at most 1e+12, got 0`,
		"max-header-bytes-too-small":        `max_header_bytes: must be between 4096 and 1048576, got 100`,
		"redis-tls-without-rediss":          `redis.tls: only used with a rediss:// redis.url (or redis.sentinel.tls)`,
		"mode-missing":                      "mode: not set, and neither database_url (RATELIMIT_DATABASE_URL) nor tenants say which mode: set mode: database with a database URL, or mode: standalone with tenants",
		"mode-database-without-url":         "database_url: mode database needs a PostgreSQL URL (database_url, or RATELIMIT_DATABASE_URL): none is set",
		"mode-standalone-with-database":     "database_url: mode standalone takes no database (database_url, or RATELIMIT_DATABASE_URL, is set): set mode: database, or remove the URL",
		"mode-standalone-without-keys":      "tenants: mode standalone needs at least one tenant with a key: without one every request is answered 401",
		"mode-unknown":                      `mode: want database or standalone, got "regional"`,
		"redis-section-without-url":         "redis.url: empty, but the redis section sets timeout: give the URL (redis.url, or RATELIMIT_REDIS_URL), or drop the section to limit per instance",
		"sentinel-without-master":           "redis.sentinel.master_name: required: the name the sentinels monitor",
		"sentinel-and-url":                  "redis.sentinel: give redis.url or redis.sentinel, not both (RATELIMIT_REDIS_URL is set?)",
		"sentinel-bad-addr":                 `redis.sentinel.addrs[0]: want host:port, got "26379"`,
		"access-log-bad-sample-ratio":       "observability.access_log.sample_ratio: must be between 0 and 1",
		"access-log-with-warn-level":        "observability.access_log.enabled: access log lines are INFO: log_level warn would drop every one (set log_level: info)",
		"redis-cluster-database":            `redis.cluster: a Redis Cluster has only database 0: drop the /db from redis.url`,
		"cost-header-without-max":           `routes[0].cost.max: required with cost.header: the most tokens one request may ask for`,
		"cost-negative-max":                 `routes[0].cost.max: must be between 1 and 1000000000, got -1`,
		"cost-header-is-key-header":         `routes[0].cost.header: "X-Api-Key" is auth.key_header`,
		"cost-fixed-above-max":              `routes[0].cost.fixed: 10 is above max 5`,
		"cost-response-header-without-max":  `routes[0].cost.max: required with cost.response_header: the most tokens one response may be charged`,
		"cost-response-header-not-a-name":   `routes[0].cost.response_header: "X Usage" is not a header name`,
		"cost-response-header-rate":         `routes[0].cost.response_header: "X-RateLimit-Used" is a rate-limit header: the gateway strips those from responses`,
		"limit-by-unknown":                  `routes[0].limit_by: "cookie": want client_ip, header:NAME or descriptor:NAME`,
		"limit-by-reserved-header":          `routes[0].limit_by: "Host" cannot be limited by: not a header name, or reserved`,
		"limit-by-case-client-ip":           `routes[0].limit_by_case: only for limit_by header:NAME or descriptor:NAME values`,
		"routing-bad-case":                  `routing.case: want fold or exact, got "insensitive"`,
		"routing-unmatched-unknown-route":   `routing.unmatched: want refuse, "*" or a route id, got "catch-all"`,
		"routing-case-conflict":             `routes[1].match: "POST /Orders/" matches the same requests as routes[0].match "POST /orders" under the routing rules (routing.case: fold, routing.trailing_slash: optional)`,
		"rls-listen-bad":                    `rls_listen: want host:port, got "grpc"`,
		"rls-trust-tenant-without-listen":   `rls_trust_tenant: only used with rls_listen`,
		"leases-without-redis":              `leases: only used with redis.url: without Redis every decision is local already`,
		"leases-fraction-above-one":         `leases.fraction: must be between 0 and 1, got 1.5`,
		"leases-without-threshold":          `leases.threshold: required (> 0) to turn leases on; remove leases to leave them off`,
		"key-header-reserved":               `auth.key_header: "X-Tenant_Id" is reserved: the gateway or a proxy uses it for something else`,
		"key-header-not-a-name":             `auth.key_header: "X Api Key" is not a header name`,
		"key-header-authorization":          `auth.key_header: "authorization" is reserved: set auth.bearer to accept "Authorization: Bearer <key>"`,
		"band-bad-name":                     `tenants[0].rules[0].bands[0].name: band id "per hour": only letters, digits, '.', '_' and '-' are allowed`,
		"band-duplicate":                    `tenants[0].rules[0].bands[1].name: band "hour" is already bands[0]`,
		"band-named-rate":                   `tenants[0].rules[0].bands[0].name: "rate" is the name of the rule's own capacity and refill_per_second`,
		"band-negative-per":                 `tenants[0].rules[0].bands[0].per: "-1h": want a duration like 1h, 90m, 30d or 1w`,
		"band-per-without-unit":             `tenants[0].rules[0].bands[0].per: "3600": want a duration like 1h, 90m, 30d or 1w`,
		"band-no-refill":                    `tenants[0].rules[0].bands[0]: give per (1h: capacity per hour) or refill_per_second`,
		"band-per-and-refill":               `tenants[0].rules[0].bands[0]: give per or refill_per_second, not both`,
		"band-unknown-key":                  `tenants[0].rules[0].bands[0].window: unknown key "window"`,
		"band-with-shards":                  `tenants[0].rules[0].shards: a rule with bands cannot be sharded (got 2): its buckets are decided in one script call`,
		"band-zero-capacity":                `tenants[0].rules[0].bands[0].capacity: must be between 1 and 1000000000000000, got 0`,
		"band-fractional-capacity":          `tenants[0].rules[0].bands[0].capacity: wrong type: want an integer, got "1.5"`,
		"rule-fractional-capacity":          `tenants[0].rules[0].capacity: wrong type: want an integer, got "2.5"`,
	}
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Errorf("%d fixtures, %d expected messages: keep them in step", len(files), len(want))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			msg, ok := want[name]
			if !ok {
				t.Fatalf("no expected message for %s", f)
			}
			_, err := LoadConfig(f, Overrides{})
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("want a *ConfigError, got %T %v", err, err)
			}
			if got, want := err.Error(), "config "+f+": "+msg; got != want {
				t.Fatalf("error message:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestLoadConfigMissingFile(t *testing.T) {
	_, err := LoadConfig("testdata/does-not-exist.yaml", Overrides{})
	if err == nil || !strings.HasPrefix(err.Error(), "config testdata/does-not-exist.yaml: ") {
		t.Fatalf("got %v", err)
	}
}

// TestConfigErrorsRedactURLs makes sure a password in a bad URL never reaches a message.
func TestConfigErrorsRedactURLs(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	src := "region: r\ndatabase_url: \"postgres://u:s3cret@host:bad port/db\"\nroutes: [{id: a, match: /, upstream: 'http://127.0.0.1:1'}]\n"
	if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(f, Overrides{})
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "database_url") {
		t.Fatalf("got %v", err)
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, p := range []string{"testdata/good-full.yaml", "testdata/good-minimal.yaml", "testdata/bad/unknown-key.yaml", "testdata/bad/bad-duration.yaml"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config fuzz.yaml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if err := c.normalize(); err != nil {
			if !strings.HasPrefix(err.Error(), "config fuzz.yaml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		// A valid config stays valid: normalize is idempotent.
		if err := c.normalize(); err != nil {
			t.Fatalf("normalize twice: %v", err)
		}
	})
}

// TestURLErrorsNeverShowPassword: malformed database, Redis and upstream URLs with a
// password give an error naming the key that shows no piece (3+ characters) of the
// password. A parser that quotes "the port" of u:Qx7z/Pw9k@host quotes the password.
func TestURLErrorsNeverShowPassword(t *testing.T) {
	const pw = "Qx7zPw9k"
	tests := []struct{ key, url string }{
		{"database_url", "postgres://u:Qx7z/Pw9k@host/db"},
		{"database_url", "postgres://u:Qx7z%zzPw9k@host/db"},
		{"database_url", "postgres://u:Qx7z Pw9k@host/db"},
		{"database_url", "postgres://u:Qx7zPw9k@host:bad port/db"},
		{"database_url", "postgres://u:Qx7zPw9k@ho st/db"},
		{"database_url", "postgres://u@host/db?password=Qx7zPw9k&sslmode=bogus"},
		{"database_url", "host=h password=Qx7zPw9k port=bad"},
		{"database_url", "host=h password='Qx7z Pw9k' port=bad"},
		{"database_url", "Qx7zPw9k"},
		{"redis.url", "redis://u:Qx7z/Pw9k@host:6379/0"},
		{"redis.url", "redis://u:Qx7z%zzPw9k@host/0"},
		{"redis.url", "redis://:Qx7zPw9k@ho st/0"},
		{"redis.url", "redis://u:Qx7z?Pw9k@host/0"},
		{"redis.url", "redis://u:Qx7z#Pw9k@host/0"},
		{"redis.url", "redis://u:Qx7zPw9k@host:6379/notanumber"},
		{"redis.url", "redis://u:Qx7zPw9k@host:6379/0?dial_timeout=Qx7zPw9k"},
		{"redis.url", "redis://u:Qx7zPw9k@host:6379/0?Qx7zPw9k=1"},
		{"routes[0].upstream", "http://u:Qx7z/Pw9k@host/"},
		{"routes[0].upstream", "http://u:Qx7z%zzPw9k@host/"},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.key, i), func(t *testing.T) {
			cfg := articleConfig("us-east", "http://127.0.0.1:1", "")
			switch tt.key {
			case "database_url":
				cfg.Tenants = nil
				cfg.DatabaseURL = tt.url
			case "redis.url":
				cfg.Redis.URL = tt.url
			default:
				cfg.Routes[0].Upstream = tt.url
			}
			g, err := New(cfg, Options{})
			if err == nil {
				g.closeClients()
				t.Fatal("New accepted the URL")
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.key) {
				t.Errorf("error does not name %s: %s", tt.key, msg)
			}
			for n := 3; n <= len(pw); n++ {
				for i := 0; i+n <= len(pw); i++ {
					if strings.Contains(msg, pw[i:i+n]) {
						t.Fatalf("error shows %q of the password: %s", pw[i:i+n], msg)
					}
				}
			}
			t.Log(msg)
		})
	}
}

// TestDatabaseURLFormsPgxAccepts: what store.Open (pgx) accepts, the config accepts.
func TestDatabaseURLFormsPgxAccepts(t *testing.T) {
	for _, u := range []string{
		"postgres://u:pw@127.0.0.1:5432/q",
		"postgresql://u:pw@h1:5432,h2:5433/q?target_session_attrs=read-write",
		"host=127.0.0.1 port=5432 dbname=q user=u password='a b'",
	} {
		cfg := articleConfig("us-east", "http://127.0.0.1:1", "")
		cfg.Tenants = nil
		cfg.DatabaseURL = u
		if _, err := New(cfg, Options{}); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}
