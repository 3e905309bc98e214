package gateway

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/net/http/httpguts"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/internal/redact"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// Environment variables that override the configuration file.
const (
	EnvDatabaseURL = "RATELIMIT_DATABASE_URL"
	EnvRedisURL    = "RATELIMIT_REDIS_URL"
)

// Defaults filled in by LoadConfig and New for keys that are absent (or zero).
const (
	DefaultListen            = "127.0.0.1:8080"
	DefaultAdminListen       = "127.0.0.1:9100"
	DefaultRedisTimeout      = limiter.DefaultTimeout
	DefaultKeyPrefix         = limiter.DefaultKeyPrefix
	DefaultBreakerFailures   = limiter.DefaultBreakerFailures
	DefaultBreakerOpenFor    = limiter.DefaultBreakerOpenFor
	DefaultReloadInterval    = 30 * time.Second
	DefaultQuotaSyncInterval = 5 * time.Second
	DefaultHeartbeatInterval = store.DefaultHeartbeatInterval
	DefaultExpectedInstances = limiter.DefaultExpectedInstances
	DefaultDrainTimeout      = 15 * time.Second
	DefaultMaxTenants        = 1000
	DefaultTenantInterval    = time.Minute
	DefaultCapacity          = 20
	DefaultRefillPerSecond   = 10
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultKeyHeader         = "X-Api-Key"
	// The per-client limit on requests without a valid API key (unauthenticated_limit).
	DefaultUnauthCapacity   = 100
	DefaultUnauthRefill     = 10
	DefaultUnauthMaxClients = 65536
)

// maxUnauthClients bounds unauthenticated_limit.max_clients (about 90 bytes each).
const maxUnauthClients = 1 << 20

// Route ids the gateway uses as metric labels of its own; a configured route may not take them.
const (
	routeUnmatched = "_unmatched"
	labelOther     = regions.OtherLabel
)

// Config is the gateway's configuration file (YAML). docs/configuration.md documents every
// key; zero values mean "use the default". Build one with LoadConfig, or fill it in code
// and let New validate it.
type Config struct {
	// Region is the region this gateway serves (required).
	Region string `yaml:"region"`
	// Mode is database (keys and rules from PostgreSQL) or standalone (from Tenants). It
	// may be left out only when the rest says which (see checkMode); LoadConfig and New
	// fill it in.
	Mode string `yaml:"mode"`
	// Listen is the proxy's address.
	Listen string `yaml:"listen"`
	// AdminListen serves /metrics, /healthz and /readyz.
	AdminListen string `yaml:"admin_listen"`
	// DatabaseURL is the control-plane PostgreSQL; empty means standalone: keys and rules
	// come from Tenants and DefaultRule.
	DatabaseURL string `yaml:"database_url"`
	// Redis is the region's shared bucket store; an empty URL means a per-instance local
	// limiter.
	Redis RedisConfig `yaml:"redis"`
	// ReloadInterval is the safety-net reload period (NOTIFY reloads come sooner).
	ReloadInterval time.Duration `yaml:"reload_interval"`
	// QuotaSyncInterval is how often this instance reports its region's calendar-quota
	// counters to the database and reads back every region's usage: the staleness of
	// the quota allowances (docs/reliability.md, "Calendar quotas").
	QuotaSyncInterval time.Duration `yaml:"quota_sync_interval"`
	// HeartbeatInterval is how often this instance records itself alive; an instance unseen
	// for three intervals counts as dead.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// ExpectedInstances is the floor of the fallback's divisor N: while Redis is down each
	// instance admits 1/N of the regional limit, with N the live instances of the region
	// by heartbeat, or this when that is larger or unknown (default 1). Set it to the
	// fewest replicas the region ever runs (an HPA's minReplicas).
	ExpectedInstances int `yaml:"expected_instances"`
	// DrainTimeout bounds the graceful shutdown: in-flight requests get this long.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// InstanceID names this instance in heartbeats; default host-pid-random.
	InstanceID string `yaml:"instance_id"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// DefaultRule applies when no tenant or route rule matches. In database mode a "*"/"*"
	// rule in the database wins over it.
	DefaultRule RuleConfig `yaml:"default_rule"`
	// Routes map request patterns to route ids and upstreams (at least one).
	Routes []RouteConfig `yaml:"routes"`
	// Routing is how request paths are matched to routes, at the proxy and /v1/check,
	// and what the check and RLS doors do with a request no route matches.
	Routing RoutingConfig `yaml:"routing"`
	// Tenants gives keys and rules in standalone mode; not allowed with DatabaseURL.
	Tenants []TenantConfig `yaml:"tenants"`
	// Metrics bounds the per-tenant series.
	Metrics MetricsConfig `yaml:"metrics"`
	// UnauthenticatedLimit bounds, per client address, the requests that fail
	// authentication, so that guessing keys is slow and cheap to refuse.
	UnauthenticatedLimit UnauthLimitConfig `yaml:"unauthenticated_limit"`
	// TrustedProxies are the CIDRs (or single addresses) of the proxies whose
	// X-Forwarded-For the gateway believes when it finds a request's client address.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// MaxHeaderBytes bounds a request's header block; a larger one is answered 431.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// Auth is how clients present their API key.
	Auth AuthConfig `yaml:"auth"`
	// Leases turns on token leases for hot keys (needs redis.url).
	Leases LeasesConfig `yaml:"leases"`
	// RLSListen serves Envoy's rate-limit service (gRPC, envoy.service.ratelimit.v3) on
	// this address; empty means off.
	RLSListen string `yaml:"rls_listen"`
	// RLSTrustTenant accepts a "tenant" descriptor entry from the RLS caller as an
	// already authenticated tenant. Only for callers that authenticated the client.
	RLSTrustTenant bool `yaml:"rls_trust_tenant"`
	// Check is the HTTP check endpoint for nginx auth_request and Traefik forwardAuth.
	Check CheckConfig `yaml:"check"`

	// Observability configures the proxy's access log (observe.go).
	Observability ObservabilityConfig `yaml:"observability"`

	// file is where the configuration came from, for error messages.
	file string
	// modeSource says how Mode was decided (checkMode); emptyEnv lists the URL variables
	// that were set but empty (OverridesFromLookupEnv).
	modeSource string
	emptyEnv   []string
	// normalized is set once normalize has succeeded: checks that need the values as
	// written, before defaults, are not repeated.
	normalized bool
}

// RoutingConfig makes route matching agree with the application's router: every
// spelling of a path the application routes to one handler must be matched to that
// handler's route, or refused (routing.go). The defaults match the broadest common
// router and refuse what routers disagree on.
type RoutingConfig struct {
	// Case is "fold" (default: /Orders is /orders, methods too) or "exact".
	Case string `yaml:"case"`
	// TrailingSlash is "optional" (default: /orders/ is /orders) or "exact".
	TrailingSlash string `yaml:"trailing_slash"`
	// PathParams is "strip" (default: /orders;jsessionid=1 is /orders) or "refuse" (400).
	PathParams string `yaml:"path_params"`
	// DotSegments is "refuse" (default: 400 for ".", ".." or "//", escaped or not) or
	// "resolve" (removed as RFC 3986 does).
	DotSegments string `yaml:"dot_segments"`
	// EncodedSlashes is "refuse" (default: 400 for %2F, %5C or a backslash in a path) or
	// "decode" (taken as "/").
	EncodedSlashes string `yaml:"encoded_slashes"`
	// Unmatched is what /v1/check and RLS do with a request no route matches: "refuse"
	// (default: 404, or OVER_LIMIT over RLS), "*" (decided under the "*" rule) or a
	// route id (decided under that route's rules). The proxy answers 404 whatever it is:
	// it forwards only what it matched.
	Unmatched string `yaml:"unmatched"`
}

// Values of the routing keys.
const (
	routingFold     = "fold"
	routingExact    = "exact"
	routingOptional = "optional"
	routingStrip    = "strip"
	routingRefuse   = "refuse"
	routingResolve  = "resolve"
	routingDecode   = "decode"
)

// rules are the parsed routing rules (normalize has checked the values).
func (r RoutingConfig) rules() pathRules {
	return pathRules{
		fold:          r.Case != routingExact,
		optionalSlash: r.TrailingSlash != routingExact,
		stripParams:   r.PathParams != routingRefuse,
		resolveDots:   r.DotSegments == routingResolve,
		decodeSlashes: r.EncodedSlashes == routingDecode,
	}
}

// ObservabilityConfig configures what the proxy tells about each request beyond the
// metrics, which are always on.
type ObservabilityConfig struct {
	// AccessLog is the per-request log (off by default).
	AccessLog AccessLogConfig `yaml:"access_log"`
}

// AccessLogConfig is the sampled access log: one JSON line ("msg":"access") per logged
// request, through the gateway's logger at INFO. It never holds the API key, any header
// or the query string.
type AccessLogConfig struct {
	// Enabled turns it on.
	Enabled bool `yaml:"enabled"`
	// SampleRatio is the fraction of requests logged, in (0, 1] (default 1 when enabled).
	SampleRatio float64 `yaml:"sample_ratio"`
}

// checkObservability fills the observability defaults and validates them (from normalize).
func (c *Config) checkObservability() error {
	a := &c.Observability.AccessLog
	bad := func(key, reason string) error {
		return &ConfigError{File: c.file, Key: "observability.access_log." + key, Reason: reason}
	}
	if a.Enabled && a.SampleRatio == 0 {
		a.SampleRatio = 1
	}
	if !(a.SampleRatio >= 0 && a.SampleRatio <= 1) {
		return bad("sample_ratio", "must be between 0 and 1")
	}
	if a.Enabled {
		if l, err := parseLogLevel(c.LogLevel); err == nil && l > slog.LevelInfo {
			return bad("enabled", "access log lines are INFO: log_level "+c.LogLevel+" would drop every one (set log_level: info)")
		}
	}
	return nil
}

// CheckConfig is the check endpoint on the proxy's listener.
type CheckConfig struct {
	// Disabled turns /v1/check off: the path is then routed like any other.
	Disabled bool `yaml:"disabled"`
}

// AuthConfig is how a client presents its API key.
type AuthConfig struct {
	// KeyHeader is the header that carries the key (default X-Api-Key).
	KeyHeader string `yaml:"key_header"`
	// Bearer also accepts "Authorization: Bearer <key>". The Authorization header is then
	// an identity header: it never reaches an upstream.
	Bearer bool `yaml:"bearer"`
}

// RedisConfig is the region's Redis.
type RedisConfig struct {
	// URL is redis://host:port/db (or rediss://); empty means local limiting only. With
	// Cluster, redis://host1:port?addr=host2:port&addr=host3:port: seed nodes of a Redis
	// Cluster (go-redis ParseClusterURL), database 0 only.
	URL string `yaml:"url"`
	// Cluster makes URL the seed nodes of a Redis Cluster instead of one server.
	Cluster bool `yaml:"cluster"`
	// Timeout bounds one decision's Redis call; past it the local fallback decides.
	Timeout time.Duration `yaml:"timeout"`
	// KeyPrefix starts every bucket key ("rl" gives rl:{tenant}:route).
	KeyPrefix string `yaml:"key_prefix"`
	// Breaker opens after consecutive Redis failures and probes again later.
	Breaker BreakerConfig `yaml:"breaker"`
	// TLS configures a rediss:// connection: the CA that signed the server's certificate
	// and, for servers that verify clients, this gateway's certificate and key.
	TLS RedisTLSConfig `yaml:"tls"`
	// Sentinel finds the master through Redis Sentinel instead of URL (sentinel.go).
	Sentinel SentinelConfig `yaml:"sentinel"`
}

// SentinelConfig finds the region's Redis master through Redis Sentinel: go-redis's
// failover client asks the sentinels for the master of MasterName, follows a promotion
// when they announce one, and sends every call to the current master.
type SentinelConfig struct {
	// MasterName is the name the sentinels monitor (sentinel monitor <name> ...).
	MasterName string `yaml:"master_name"`
	// Addrs are the sentinels' host:port (at least one; give them all).
	Addrs []string `yaml:"addrs"`
	// Username and Password authenticate to the master and replicas (requirepass or an
	// ACL user); SentinelUsername and SentinelPassword to the sentinels themselves. Like
	// every secret, prefer an environment-filled file to writing them here.
	Username         string `yaml:"username"`
	Password         string `yaml:"password"`
	SentinelUsername string `yaml:"sentinel_username"`
	SentinelPassword string `yaml:"sentinel_password"`
	// DB is the database number on the master (default 0).
	DB int `yaml:"db"`
	// TLS connects to the sentinels and the master over TLS, with redis.tls's files.
	TLS bool `yaml:"tls"`
}

func (s *SentinelConfig) configured() bool {
	return s.MasterName != "" || len(s.Addrs) > 0 || s.Username != "" || s.Password != "" ||
		s.SentinelUsername != "" || s.SentinelPassword != "" || s.DB != 0 || s.TLS
}

// check validates redis.sentinel (called from normalize).
func (s *SentinelConfig) check(c *Config) error {
	if !s.configured() {
		return nil
	}
	bad := func(key, format string, args ...any) error {
		return &ConfigError{File: c.file, Key: "redis.sentinel" + key, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Redis.URL != "":
		return bad("", "give redis.url or redis.sentinel, not both (%s is set?)", EnvRedisURL)
	case c.Redis.Cluster:
		return bad("", "a Redis Cluster has no sentinels: give redis.cluster or redis.sentinel, not both")
	case s.MasterName == "":
		return bad(".master_name", "required: the name the sentinels monitor")
	case len(s.Addrs) == 0:
		return bad(".addrs", "at least one sentinel host:port is required")
	case s.DB < 0 || s.DB > 15:
		return bad(".db", "must be between 0 and 15, got %d", s.DB)
	}
	for i, a := range s.Addrs {
		if err := checkHostPort(a); err != nil {
			return bad(fmt.Sprintf(".addrs[%d]", i), "%v", err)
		}
		if h, _, _ := net.SplitHostPort(a); h == "" {
			return bad(fmt.Sprintf(".addrs[%d]", i), "no host in %q", a)
		}
	}
	return nil
}

// RedisTLSConfig are PEM files for a rediss:// connection. Empty fields mean the system's
// roots and no client certificate.
type RedisTLSConfig struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"` // default: the URL's host
}

// UnauthLimitConfig is the per-client token bucket of failed authentications.
type UnauthLimitConfig struct {
	// Capacity failed attempts are allowed at once, then RefillPerSecond more every second.
	Capacity        int64   `yaml:"capacity"`
	RefillPerSecond float64 `yaml:"refill_per_second"`
	// MaxClients bounds the client buckets held (memory); idle ones are evicted first.
	MaxClients int `yaml:"max_clients"`
	// Disabled turns the limit off.
	Disabled bool `yaml:"disabled"`
}

// BreakerConfig is the Redis circuit breaker.
type BreakerConfig struct {
	// Failures is how many consecutive failures (errors or timeouts) open it, once they
	// have gone on for FailureSpan.
	Failures uint32 `yaml:"failures"`
	// FailureSpan is how long calls must have been failing before it opens (default
	// failures x timeout): calls that time out together in one stall count once.
	FailureSpan time.Duration `yaml:"failure_span"`
	// OpenFor is how long it stays open before a probe may close it.
	OpenFor time.Duration `yaml:"open_for"`
}

// RuleConfig is a token bucket.
type RuleConfig struct {
	Capacity        int64   `yaml:"capacity"`
	RefillPerSecond float64 `yaml:"refill_per_second"`
	Shadow          bool    `yaml:"shadow"`
	Shards          int     `yaml:"shards"`
	// Bands are the rule's further token buckets (docs/configuration.md, "Bands").
	Bands []BandConfig `yaml:"bands"`
}

// RouteConfig maps a ServeMux pattern to a route id and an upstream.
type RouteConfig struct {
	ID       string `yaml:"id"`
	Match    string `yaml:"match"`
	Upstream string `yaml:"upstream"`
	// Cost is how many tokens one request of the route takes.
	Cost CostConfig `yaml:"cost"`
	// LimitBy gives each distinct value of a client property a bucket of its own,
	// nested inside the tenant's bucket for the route (the rule): a request is admitted
	// only if both admit. "client_ip", "header:NAME" or "descriptor:NAME" (an RLS
	// descriptor entry). Empty: one bucket per tenant and route.
	LimitBy string `yaml:"limit_by"`
	// LimitByCase is "exact" (default) or "fold": with fold, values that differ only in
	// case (ACME, acme) share one bucket. Only for header: and descriptor: values.
	LimitByCase string `yaml:"limit_by_case"`
	// PerValue is each value's bucket, scaled by the region's share like the rule; unset,
	// a value's bucket is the rule's size (one value may use the whole tenant's limit,
	// and all values together never more than it).
	PerValue *PerValueConfig `yaml:"per_value"`
}

// PerValueConfig is a limit_by value's bucket.
type PerValueConfig struct {
	Capacity        int64   `yaml:"capacity"`
	RefillPerSecond float64 `yaml:"refill_per_second"`
}

// CostConfig is a route's cost: fixed, or read from a request header up to Max.
type CostConfig struct {
	// Fixed is the tokens every request takes (default 1); with Header, the cost of an
	// RLS request that sends no hits_addend.
	Fixed int64 `yaml:"fixed"`
	// Header, when set, is the request header that carries the cost (a decimal integer
	// 1..Max). A missing or malformed value is answered 400, never taken as free.
	Header string `yaml:"header"`
	// Max caps the cost a client may ask for, in Header or in an RLS hits_addend: more is
	// 400 (HTTP) or over the limit (RLS). Required with Header and ResponseHeader; it
	// caps the real cost read from ResponseHeader too.
	Max int64 `yaml:"max"`
	// ResponseHeader, when set, is the upstream response header that carries the
	// request's real cost (a decimal integer >= 0): the request is admitted on its cost
	// as above (the estimate), and the difference is settled after the response, into
	// debt if need be (docs/configuration.md, "Cost known after the response"). Only
	// the proxy door sees responses.
	ResponseHeader string `yaml:"response_header"`
}

// LeasesConfig turns on token leases for hot keys (gateway/limiter, lease.go).
type LeasesConfig struct {
	// Threshold is the rate (tokens per second, seen by this instance) from which a key
	// is leased; 0 (default) means leases off.
	Threshold float64 `yaml:"threshold"`
	// Fraction bounds the region's over-admission on a leased key (instances x batch) as
	// a fraction of one second's regional refill (default 0.02).
	Fraction float64 `yaml:"fraction"`
	// TTL is how long leased tokens may be spent (default 250ms).
	TTL time.Duration `yaml:"ttl"`
}

// TenantConfig is a standalone tenant: its API keys and its rules. Tenant "*" may carry
// rules only: they apply to a route for every tenant.
type TenantConfig struct {
	ID    string             `yaml:"id"`
	Keys  []KeyConfig        `yaml:"keys"`
	Rules []TenantRuleConfig `yaml:"rules"`
}

// KeyConfig is one API key: exactly one of Secret (the key itself, for development) or
// SHA256 (the lowercase hex SHA-256 of the key, so the file holds no secret).
type KeyConfig struct {
	Secret string `yaml:"secret"`
	SHA256 string `yaml:"sha256"`
}

// TenantRuleConfig is one tenant's bucket for one route ("*" = every route).
type TenantRuleConfig struct {
	Route           string  `yaml:"route"`
	Capacity        int64   `yaml:"capacity"`
	RefillPerSecond float64 `yaml:"refill_per_second"`
	Shadow          bool    `yaml:"shadow"`
	Shards          int     `yaml:"shards"`
	// Bands are the rule's further token buckets (docs/configuration.md, "Bands").
	Bands []BandConfig `yaml:"bands"`
}

// BandConfig is one further token bucket of a rule, as in a limits file: "10,000 per
// hour" is {name: hour, capacity: 10000, per: 1h}; per or refill_per_second, not both.
type BandConfig struct {
	Name     string `yaml:"name"`
	Capacity int64  `yaml:"capacity"`
	// Per is the time the band refills its capacity in: a Go duration, or whole weeks
	// and days first (30d, 1w, 1d12h), read as the limits file reads it
	// (store.RefillOver).
	Per             string  `yaml:"per"`
	RefillPerSecond float64 `yaml:"refill_per_second"`
	// Period makes the band a calendar quota of capacity per hour, day, week or month
	// (no per, no refill_per_second), counted in Zone's calendar ("" is UTC).
	Period regions.Period `yaml:"period"`
	Zone   string         `yaml:"zone"`
}

// band is b as a regions.Band (checkBands has checked it).
func (b BandConfig) band() regions.Band {
	refill := b.RefillPerSecond
	if r, err := store.RefillOver(b.Capacity, b.Per); b.Per != "" && err == nil {
		refill = r
	}
	if b.Period != "" {
		return regions.Band{Name: b.Name, Capacity: b.Capacity, Period: b.Period, Zone: b.Zone}
	}
	return regions.Band{Name: b.Name, Capacity: b.Capacity, RefillPerSecond: refill, Zone: b.Zone}
}

// regionsBands are bands as regions.Bands; nil for none.
func regionsBands(bands []BandConfig) []regions.Band {
	if len(bands) == 0 {
		return nil
	}
	out := make([]regions.Band, len(bands))
	for i, b := range bands {
		out[i] = b.band()
	}
	return out
}

// MetricsConfig bounds the tenant-labelled series.
type MetricsConfig struct {
	// MaxTenants is the most (tenant, route) pairs with series of their own; the rest are
	// counted as tenant="_other", route="_other".
	MaxTenants int `yaml:"max_tenants"`
	// TenantInterval is how often the busiest non-tracked pairs may replace the quietest
	// tracked ones.
	TenantInterval time.Duration `yaml:"tenant_interval"`
}

// Overrides are the command-line flags and environment variables that win over the file.
// Empty fields leave the file's value.
type Overrides struct {
	Listen      string
	Region      string
	DatabaseURL string
	RedisURL    string

	emptyEnv []string // set-but-empty URL variables (OverridesFromLookupEnv)
}

// OverridesFromEnv reads RATELIMIT_DATABASE_URL and RATELIMIT_REDIS_URL.
func OverridesFromEnv(getenv func(string) string) Overrides {
	return Overrides{DatabaseURL: getenv(EnvDatabaseURL), RedisURL: getenv(EnvRedisURL)}
}

// ConfigError is a configuration problem: which file, which key, and why.
type ConfigError struct {
	File   string // empty for a Config built in code
	Key    string // dotted path, e.g. "redis.timeout" or "routes[1].match"; may be empty
	Reason string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("config")
	if e.File != "" {
		b.WriteString(" ")
		b.WriteString(e.File)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// LoadConfig reads path strictly (unknown keys are errors), applies ov, fills defaults and
// validates. Every error is a *ConfigError naming the file, the key and the reason.
func LoadConfig(path string, ov Overrides) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, &ConfigError{File: path, Reason: err.Error()}
	}
	c, err := ParseConfig(path, data)
	if err != nil {
		return Config{}, err
	}
	c.Apply(ov)
	if err := c.normalize(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// ParseConfig decodes YAML strictly without defaults or validation; name is used in
// errors. Most callers want LoadConfig.
func ParseConfig(name string, data []byte) (c Config, err error) {
	// goccy/go-yaml v1.19.2 panics on some malformed documents (found by FuzzParseConfig,
	// testdata/fuzz); a bad file must be an error, never a crash.
	defer func() {
		if p := recover(); p != nil {
			c, err = Config{}, &ConfigError{File: name, Reason: "not valid YAML"}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data),
		yaml.DisallowUnknownField(),
		yaml.CustomUnmarshaler(unmarshalDuration),
		yaml.CustomUnmarshaler(unmarshalInt64),
		yaml.CustomUnmarshaler(unmarshalInt),
	)
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return Config{}, &ConfigError{File: name, Reason: "the file is empty"}
		}
		return Config{}, yamlError(name, data, err)
	}
	c.file = name
	return c, nil
}

// Apply sets the non-empty overrides.
func (c *Config) Apply(ov Overrides) {
	if ov.Listen != "" {
		c.Listen = ov.Listen
	}
	if ov.Region != "" {
		c.Region = ov.Region
	}
	if ov.DatabaseURL != "" {
		c.DatabaseURL = ov.DatabaseURL
	}
	if ov.RedisURL != "" {
		c.Redis.URL = ov.RedisURL
	}
	c.emptyEnv = append(c.emptyEnv, ov.emptyEnv...)
}

// Standalone reports whether keys and rules come from the file rather than a database.
func (c *Config) Standalone() bool { return c.DatabaseURL == "" }

// File is the path the configuration was read from ("" when built in code).
func (c *Config) File() string { return c.file }

// normalize fills defaults and validates: the one place that does both. It is idempotent.
func (c *Config) normalize() error {
	redisSet := c.Redis.configuredKey() // before the defaults fill it in
	c.fillDefaults()
	for _, check := range []func() error{
		c.checkIdentity, c.checkURLs, c.checkTimings, c.checkLimits, c.checkRoutes,
		c.checkRLS, c.checkLeases, c.checkTenants,
		func() error { return c.checkMode(redisSet) },
		c.checkObservability,
		func() error { return c.Redis.Sentinel.check(c) },
	} {
		if err := check(); err != nil {
			return err
		}
	}
	c.normalized = true
	return nil
}

// bad is the ConfigError of key in c's file.
func (c *Config) bad(key, format string, args ...any) error {
	return &ConfigError{File: c.file, Key: key, Reason: fmt.Sprintf(format, args...)}
}

// fillDefaults sets every key the file left out to its default.
func (c *Config) fillDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.Redis.Timeout == 0 {
		c.Redis.Timeout = DefaultRedisTimeout
	}
	if c.Redis.KeyPrefix == "" {
		c.Redis.KeyPrefix = DefaultKeyPrefix
	}
	if c.Redis.Breaker.Failures == 0 {
		c.Redis.Breaker.Failures = DefaultBreakerFailures
	}
	if c.Redis.Breaker.OpenFor == 0 {
		c.Redis.Breaker.OpenFor = DefaultBreakerOpenFor
	}
	if c.ReloadInterval == 0 {
		c.ReloadInterval = DefaultReloadInterval
	}
	if c.QuotaSyncInterval == 0 {
		c.QuotaSyncInterval = DefaultQuotaSyncInterval
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.ExpectedInstances == 0 {
		c.ExpectedInstances = DefaultExpectedInstances
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.Metrics.MaxTenants == 0 {
		c.Metrics.MaxTenants = DefaultMaxTenants
	}
	if c.Metrics.TenantInterval == 0 {
		c.Metrics.TenantInterval = DefaultTenantInterval
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.DefaultRule.Capacity == 0 && c.DefaultRule.RefillPerSecond == 0 {
		c.DefaultRule.Capacity = DefaultCapacity
		c.DefaultRule.RefillPerSecond = DefaultRefillPerSecond
	}
	if c.DefaultRule.Shards == 0 {
		c.DefaultRule.Shards = 1
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.Auth.KeyHeader == "" {
		c.Auth.KeyHeader = DefaultKeyHeader
	}
	for _, d := range []struct {
		v   *string
		def string
	}{
		{&c.Routing.Case, routingFold}, {&c.Routing.TrailingSlash, routingOptional},
		{&c.Routing.PathParams, routingStrip}, {&c.Routing.DotSegments, routingRefuse},
		{&c.Routing.EncodedSlashes, routingRefuse}, {&c.Routing.Unmatched, routingRefuse},
	} {
		if *d.v == "" {
			*d.v = d.def
		}
	}
	if u := &c.UnauthenticatedLimit; !u.Disabled {
		if u.Capacity == 0 && u.RefillPerSecond == 0 {
			u.Capacity, u.RefillPerSecond = DefaultUnauthCapacity, DefaultUnauthRefill
		}
		if u.MaxClients == 0 {
			u.MaxClients = DefaultUnauthMaxClients
		}
	}
}

// checkIdentity checks the region and the listeners.
func (c *Config) checkIdentity() error {
	if c.Region == "" {
		return c.bad("region", "required (or --region)")
	}
	if err := regions.ValidateID("region", c.Region); err != nil {
		return c.bad("region", "%v", unwrapInvalid(err))
	}
	if err := checkHostPort(c.Listen); err != nil {
		return c.bad("listen", "%v", err)
	}
	if err := checkHostPort(c.AdminListen); err != nil {
		return c.bad("admin_listen", "%v", err)
	}
	return nil
}

// checkURLs checks the database and Redis URLs and the Redis TLS files.
func (c *Config) checkURLs() error {
	if c.DatabaseURL != "" {
		if err := checkDatabaseURL(c.DatabaseURL); err != nil {
			return c.bad("database_url", "%v", err)
		}
	}
	if c.Redis.URL != "" {
		if err := checkURL(c.Redis.URL, "redis", "rediss", "unix"); err != nil {
			return c.bad("redis.url", "%v", err)
		}
	}
	if c.Redis.Cluster {
		if err := checkClusterURL(c.Redis.URL); err != nil {
			return c.bad("redis.cluster", "%v", err)
		}
	}
	if t := c.Redis.TLS; t != (RedisTLSConfig{}) {
		if !strings.HasPrefix(c.Redis.URL, "rediss://") && !c.Redis.Sentinel.TLS {
			return c.bad("redis.tls", "only used with a rediss:// redis.url (or redis.sentinel.tls)")
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			return c.bad("redis.tls", "give both cert_file and key_file, or neither")
		}
	}
	return nil
}

// checkTimings checks every duration, the breaker, the key prefix and the intervals.
func (c *Config) checkTimings() error {
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"redis.timeout", c.Redis.Timeout},
		{"redis.breaker.open_for", c.Redis.Breaker.OpenFor},
		{"redis.breaker.failure_span", c.Redis.Breaker.FailureSpan},
		{"reload_interval", c.ReloadInterval},
		{"quota_sync_interval", c.QuotaSyncInterval},
		{"heartbeat_interval", c.HeartbeatInterval},
		{"drain_timeout", c.DrainTimeout},
		{"metrics.tenant_interval", c.Metrics.TenantInterval},
	} {
		if d.v < 0 {
			return c.bad(d.key, "must be a positive duration, got %s", d.v)
		}
	}
	if c.Redis.Timeout > time.Second {
		return c.bad("redis.timeout", "%s is longer than 1s: a slow Redis would become a slow gateway", c.Redis.Timeout)
	}
	if c.Redis.Breaker.OpenFor < 10*time.Millisecond || c.Redis.Breaker.OpenFor > time.Minute {
		return c.bad("redis.breaker.open_for", "must be between 10ms and 1m, got %s", c.Redis.Breaker.OpenFor)
	}
	if c.Redis.Breaker.FailureSpan > time.Minute {
		return c.bad("redis.breaker.failure_span", "%s is longer than 1m: a Redis that is down would cost every request the timeout for that long", c.Redis.Breaker.FailureSpan)
	}
	if c.Redis.Breaker.Failures > 1000 {
		return c.bad("redis.breaker.failures", "must be between 1 and 1000, got %d", c.Redis.Breaker.Failures)
	}
	if err := checkKeyPrefix(c.Redis.KeyPrefix); err != nil {
		return c.bad("redis.key_prefix", "%v", err)
	}
	if c.ReloadInterval < 100*time.Millisecond {
		return c.bad("reload_interval", "%s is shorter than 100ms", c.ReloadInterval)
	}
	if c.QuotaSyncInterval < 100*time.Millisecond || c.QuotaSyncInterval > 10*time.Minute {
		return c.bad("quota_sync_interval", "must be between 100ms and 10m (the quotas' staleness), got %s", c.QuotaSyncInterval)
	}
	if c.HeartbeatInterval < 10*time.Millisecond {
		return c.bad("heartbeat_interval", "%s is shorter than 10ms", c.HeartbeatInterval)
	}
	if c.ExpectedInstances < 0 || c.ExpectedInstances > 10000 {
		return c.bad("expected_instances", "must be between 1 and 10000, got %d", c.ExpectedInstances)
	}
	return nil
}

// checkLimits checks the default rule, the unauthenticated limit, the key header, the
// trusted proxies, the log level and the metrics bounds.
func (c *Config) checkLimits() error {
	if c.Metrics.MaxTenants < 0 || c.Metrics.MaxTenants > 100000 {
		return c.bad("metrics.max_tenants", "must be between 1 and 100000, got %d", c.Metrics.MaxTenants)
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		return c.bad("log_level", "%v", err)
	}
	if err := checkBucket(c.DefaultRule.Capacity, c.DefaultRule.RefillPerSecond, c.DefaultRule.Shards); err != nil {
		return c.bad("default_rule."+err.key, "%s", err.reason)
	}
	if err := checkBands(c.DefaultRule.Bands, c.DefaultRule.Shards); err != nil {
		return c.bad("default_rule."+err.key, "%s", err.reason)
	}
	if c.MaxHeaderBytes < 4<<10 || c.MaxHeaderBytes > 1<<20 {
		return c.bad("max_header_bytes", "must be between 4096 and 1048576, got %d", c.MaxHeaderBytes)
	}
	if u := c.UnauthenticatedLimit; !u.Disabled {
		if err := checkBucket(u.Capacity, u.RefillPerSecond, 1); err != nil {
			return c.bad("unauthenticated_limit."+err.key, "%s", err.reason)
		}
		if u.MaxClients < 1 || u.MaxClients > maxUnauthClients {
			return c.bad("unauthenticated_limit.max_clients", "must be between 1 and %d, got %d", maxUnauthClients, u.MaxClients)
		}
	}
	if err := checkKeyHeader(c.Auth.KeyHeader); err != nil {
		return c.bad("auth.key_header", "%v", err)
	}
	c.Auth.KeyHeader = http.CanonicalHeaderKey(c.Auth.KeyHeader)
	for i, p := range c.TrustedProxies {
		if _, err := parseTrustedProxy(p); err != nil {
			return c.bad(fmt.Sprintf("trusted_proxies[%d]", i), "%v", err)
		}
	}
	return nil
}

// checkRoutes checks every route (a unique id, an upstream, its cost and what it is
// limited by), the routing rules, and that no pattern matches the same requests as
// another under them.
func (c *Config) checkRoutes() error {
	ids := make(map[string]int, len(c.Routes))
	if len(c.Routes) == 0 {
		return c.bad("routes", "at least one route is required")
	}
	if err := c.checkRouting(); err != nil {
		return err
	}
	for i := range c.Routes {
		r := &c.Routes[i]
		key := fmt.Sprintf("routes[%d]", i)
		if err := regions.ValidateID("route", r.ID); err != nil {
			return c.bad(key+".id", "%v", unwrapInvalid(err))
		}
		if r.ID == routeUnmatched || r.ID == labelOther {
			return c.bad(key+".id", "%q is reserved for metrics", r.ID)
		}
		if j, dup := ids[r.ID]; dup {
			return c.bad(key+".id", "%q is already the id of routes[%d]", r.ID, j)
		}
		ids[r.ID] = i
		if r.Match == "" {
			return c.bad(key+".match", "required: a net/http ServeMux pattern such as \"POST /orders\"")
		}
		if err := registerPattern(http.NewServeMux(), r.Match, http.NotFoundHandler()); err != nil {
			return c.bad(key+".match", "%v", err)
		}
		if err := checkURL(r.Upstream, "http", "https"); err != nil {
			return c.bad(key+".upstream", "%v", err)
		}
		if err := c.checkCost(&r.Cost); err != nil {
			return c.bad(key+".cost."+err.key, "%s", err.reason)
		}
		lb, err := parseLimitBy(r.LimitBy, r.LimitByCase)
		if err != nil {
			return c.bad(key+".limit_by", "%v", err)
		}
		if lb.kind == limitByHeader {
			if err := checkKeyHeader(lb.name); err != nil || sameHeaderName(lb.name, c.Auth.KeyHeader) {
				return c.bad(key+".limit_by", "%q cannot be limited by: not a header name, or reserved", lb.name)
			}
		}
		switch {
		case r.LimitByCase != "" && r.LimitByCase != routingExact && r.LimitByCase != routingFold:
			return c.bad(key+".limit_by_case", "want exact or fold, got %q", r.LimitByCase)
		case r.LimitByCase == routingFold && lb.kind != limitByHeader && lb.kind != limitByDescriptor:
			return c.bad(key+".limit_by_case", "only for limit_by header:NAME or descriptor:NAME values")
		case r.PerValue != nil && lb.kind == limitByNone:
			return c.bad(key+".per_value", "needs limit_by: it is the bucket of each limit_by value")
		case r.PerValue != nil && (r.PerValue.Capacity < 1 || r.PerValue.Capacity > regions.MaxCapacity):
			return c.bad(key+".per_value.capacity", "%d: want 1 to %d", r.PerValue.Capacity, int64(regions.MaxCapacity))
		case r.PerValue != nil && (!(r.PerValue.RefillPerSecond > 0) || r.PerValue.RefillPerSecond > regions.MaxRefillPerSecond):
			return c.bad(key+".per_value.refill_per_second", "%v: want a number > 0 and at most %g", r.PerValue.RefillPerSecond, float64(regions.MaxRefillPerSecond))
		}
	}
	if _, err := newRouteMux(c.Routes, c.Routing.rules(), func(int) http.Handler { return http.NotFoundHandler() }); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.File = c.file
		}
		return err
	}
	if u := c.Routing.Unmatched; u != routingRefuse && u != regions.Wildcard {
		if _, ok := ids[u]; !ok {
			return c.bad("routing.unmatched", "want refuse, \"*\" or a route id, got %q", u)
		}
	}
	return nil
}

// checkRouting checks the values of the routing keys (normalize filled the defaults).
func (c *Config) checkRouting() error {
	for _, k := range []struct {
		key, v  string
		allowed [2]string
	}{
		{"routing.case", c.Routing.Case, [2]string{routingFold, routingExact}},
		{"routing.trailing_slash", c.Routing.TrailingSlash, [2]string{routingOptional, routingExact}},
		{"routing.path_params", c.Routing.PathParams, [2]string{routingStrip, routingRefuse}},
		{"routing.dot_segments", c.Routing.DotSegments, [2]string{routingRefuse, routingResolve}},
		{"routing.encoded_slashes", c.Routing.EncodedSlashes, [2]string{routingRefuse, routingDecode}},
	} {
		if k.v != k.allowed[0] && k.v != k.allowed[1] {
			return c.bad(k.key, "want %s or %s, got %q", k.allowed[0], k.allowed[1], k.v)
		}
	}
	return nil
}

// checkRLS checks the Envoy rate-limit service keys.
func (c *Config) checkRLS() error {
	if c.RLSListen != "" {
		if err := checkHostPort(c.RLSListen); err != nil {
			return c.bad("rls_listen", "%v", err)
		}
	}
	if c.RLSTrustTenant && c.RLSListen == "" {
		return c.bad("rls_trust_tenant", "only used with rls_listen")
	}
	return nil
}

// checkTenants checks the tenants of a standalone gateway: unique ids and keys, and rules
// for routes that exist.
func (c *Config) checkTenants() error {
	ids := make(map[string]bool, len(c.Routes))
	for _, r := range c.Routes {
		ids[r.ID] = true
	}
	if len(c.Tenants) > 0 && !c.Standalone() {
		return c.bad("tenants", "only allowed without database_url (standalone mode); with a database, keys and rules live there")
	}
	tenants := make(map[string]int, len(c.Tenants))
	hashes := make(map[regions.KeyHash]string)
	for i := range c.Tenants {
		t := &c.Tenants[i]
		key := fmt.Sprintf("tenants[%d]", i)
		if t.ID != regions.Wildcard {
			if err := regions.ValidateID("tenant", t.ID); err != nil {
				return c.bad(key+".id", "%v", unwrapInvalid(err))
			}
		}
		if j, dup := tenants[t.ID]; dup {
			return c.bad(key+".id", "tenant %q is already tenants[%d]", t.ID, j)
		}
		tenants[t.ID] = i
		if t.ID == regions.Wildcard && len(t.Keys) > 0 {
			return c.bad(key+".keys", "tenant \"*\" carries route rules for every tenant and cannot have keys")
		}
		for k := range t.Keys {
			kk := fmt.Sprintf("%s.keys[%d]", key, k)
			h, err := t.Keys[k].hash()
			if err != nil {
				return c.bad(kk, "%v", err)
			}
			if other, dup := hashes[h]; dup {
				return c.bad(kk, "the same API key is already given at %s", other)
			}
			hashes[h] = kk
		}
		routes := make(map[string]bool, len(t.Rules))
		for k := range t.Rules {
			r := &t.Rules[k]
			rk := fmt.Sprintf("%s.rules[%d]", key, k)
			if r.Route == "" {
				return c.bad(rk+".route", "required: a route id or \"*\"")
			}
			if r.Route != regions.Wildcard {
				if !ids[r.Route] {
					return c.bad(rk+".route", "no route has id %q", r.Route)
				}
			}
			if t.ID == regions.Wildcard && r.Route == regions.Wildcard {
				return c.bad(rk+".route", "the rule for every tenant and every route is default_rule")
			}
			if routes[r.Route] {
				return c.bad(rk+".route", "tenant %q already has a rule for route %q", t.ID, r.Route)
			}
			routes[r.Route] = true
			if r.Shards == 0 {
				r.Shards = 1
			}
			if err := checkBucket(r.Capacity, r.RefillPerSecond, r.Shards); err != nil {
				return c.bad(rk+"."+err.key, "%s", err.reason)
			}
			if err := checkBands(r.Bands, r.Shards); err != nil {
				return c.bad(rk+"."+err.key, "%s", err.reason)
			}
		}
	}
	return nil
}

// MaxCost bounds a route's cost (fixed, or the cap of a header or hits_addend).
const MaxCost = 1_000_000_000

// checkCost fills a route's cost defaults and validates them.
func (c *Config) checkCost(k *CostConfig) *bucketError {
	if k.Fixed == 0 {
		k.Fixed = 1
	}
	if k.Fixed < 1 || k.Fixed > MaxCost {
		return &bucketError{"fixed", fmt.Sprintf("must be between 1 and %d, got %d", MaxCost, k.Fixed)}
	}
	if k.Max < 0 || k.Max > MaxCost {
		return &bucketError{"max", fmt.Sprintf("must be between 1 and %d, got %d", MaxCost, k.Max)}
	}
	if k.ResponseHeader != "" {
		if err := checkKeyHeader(k.ResponseHeader); err != nil {
			return &bucketError{"response_header", err.Error()}
		}
		if isRateHeader(http.CanonicalHeaderKey(k.ResponseHeader)) {
			return &bucketError{"response_header", fmt.Sprintf("%q is a rate-limit header: the gateway strips those from responses", k.ResponseHeader)}
		}
		k.ResponseHeader = http.CanonicalHeaderKey(k.ResponseHeader)
		if k.Max == 0 {
			return &bucketError{"max", "required with cost.response_header: the most tokens one response may be charged"}
		}
	}
	if k.Header == "" {
		if k.Max != 0 && k.Fixed > k.Max {
			return &bucketError{"fixed", fmt.Sprintf("%d is above max %d", k.Fixed, k.Max)}
		}
		return nil
	}
	if err := checkKeyHeader(k.Header); err != nil {
		return &bucketError{"header", err.Error()}
	}
	if sameHeaderName(k.Header, c.Auth.KeyHeader) {
		return &bucketError{"header", fmt.Sprintf("%q is auth.key_header", k.Header)}
	}
	k.Header = http.CanonicalHeaderKey(k.Header)
	if k.Max == 0 {
		return &bucketError{"max", "required with cost.header: the most tokens one request may ask for"}
	}
	if k.Fixed > k.Max {
		return &bucketError{"fixed", fmt.Sprintf("%d is above max %d", k.Fixed, k.Max)}
	}
	return nil
}

// checkLeases validates leases; the limiter fills the defaults (leaseOptions).
func (c *Config) checkLeases() error {
	l := c.Leases
	if l == (LeasesConfig{}) {
		return nil
	}
	if c.Redis.URL == "" {
		return c.bad("leases", "only used with redis.url: without Redis every decision is local already")
	}
	if !(l.Threshold >= 0) || math.IsInf(l.Threshold, 0) || l.Threshold > 1e9 {
		return c.bad("leases.threshold", "must be between 0 (off) and 1e9 tokens per second, got %v", l.Threshold)
	}
	if !(l.Fraction >= 0 && l.Fraction <= 1) {
		return c.bad("leases.fraction", "must be between 0 and 1, got %v", l.Fraction)
	}
	if l.TTL < 0 || l.TTL > time.Minute {
		return c.bad("leases.ttl", "must be between 0 and 1m, got %s", l.TTL)
	}
	if l.Threshold == 0 {
		return c.bad("leases.threshold", "required (> 0) to turn leases on; remove leases to leave them off")
	}
	return nil
}

// limitBy is a parsed routes[].limit_by.
type limitBy struct {
	kind limitByKind
	name string // the header or descriptor entry
	fold bool   // limit_by_case: fold
}

type limitByKind uint8

const (
	limitByNone limitByKind = iota
	limitByClientIP
	limitByHeader
	limitByDescriptor
)

// parseLimitBy reads "", "client_ip", "header:NAME" or "descriptor:NAME", and
// limit_by_case.
func parseLimitBy(s, valueCase string) (limitBy, error) {
	kind, name, _ := strings.Cut(s, ":")
	fold := valueCase == routingFold
	switch {
	case s == "":
		return limitBy{}, nil
	case s == "client_ip":
		return limitBy{kind: limitByClientIP}, nil
	case kind == "header" && name != "":
		return limitBy{kind: limitByHeader, name: http.CanonicalHeaderKey(name), fold: fold}, nil
	case kind == "descriptor" && name != "" && len(name) <= 64 && !strings.ContainsAny(name, " \t\r\n"):
		return limitBy{kind: limitByDescriptor, name: name, fold: fold}, nil
	}
	return limitBy{}, fmt.Errorf("%q: want client_ip, header:NAME or descriptor:NAME", s)
}

// reservedHeaders may not carry the key: the gateway sets or reads them for its own
// purpose, or they describe the connection rather than the client.
var reservedHeaders = []string{
	hdrTenant, "Authorization", "Connection", "Content-Length", "Content-Type", "Cookie",
	"Forwarded", "Host", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te",
	"Trailer", "Transfer-Encoding", "Upgrade", "X-Forwarded-For", "X-Forwarded-Host",
	"X-Forwarded-Proto", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Original-Method",
	"X-Original-Uri", hdrLimit, hdrRemaining, hdrPolicy, hdrRateLimit, hdrRetryAfter,
}

// checkKeyHeader accepts a header name (an RFC 9110 token of at most 64 bytes) that the
// gateway does not use for anything else.
func checkKeyHeader(name string) error {
	if len(name) > 64 || !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("%q is not a header name", name)
	}
	for _, r := range reservedHeaders {
		if sameHeaderName(name, r) {
			if r == "Authorization" {
				return fmt.Errorf("%q is reserved: set auth.bearer to accept \"Authorization: Bearer <key>\"", name)
			}
			return fmt.Errorf("%q is reserved: the gateway or a proxy uses it for something else", name)
		}
	}
	return nil
}

// checkKeyPrefix allows [A-Za-z0-9._:-]{1,32}: no spaces, braces (hash tags) or globs.
func checkKeyPrefix(p string) error {
	if len(p) > 32 {
		return fmt.Errorf("%q is longer than 32 characters", p)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
			return fmt.Errorf("%q: only letters, digits, '.', '_', '-' and ':' are allowed", p)
		}
	}
	return nil
}

type bucketError struct{ key, reason string }

func checkBucket(capacity int64, refill float64, shards int) *bucketError {
	if capacity <= 0 || capacity > regions.MaxCapacity {
		return &bucketError{"capacity", fmt.Sprintf("must be between 1 and %d, got %d", int64(regions.MaxCapacity), capacity)}
	}
	if !(refill > 0) || refill > regions.MaxRefillPerSecond {
		return &bucketError{"refill_per_second", fmt.Sprintf("must be > 0 and at most %g, got %v", float64(regions.MaxRefillPerSecond), refill)}
	}
	if shards < 1 || shards > regions.MaxShards {
		return &bucketError{"shards", fmt.Sprintf("must be between 1 and %d, got %d", regions.MaxShards, shards)}
	}
	return nil
}

// checkBands checks a rule's bands: at most regions.MaxBands, each an id other than
// regions.PrimaryBand and unique, a bucket (per or refill_per_second, not both), and no
// shards; then regions.Rule.Validate on them as the snapshot will hold them.
// checkQuotaBand checks band b (at key) with a period or a zone: a calendar quota.
func checkQuotaBand(key string, b BandConfig) *bucketError {
	switch {
	case b.Period == "":
		return &bucketError{key + ".zone", "a zone is for a calendar quota: give period (hour, day, week or month) too"}
	case b.Per != "" || b.RefillPerSecond != 0:
		return &bucketError{key, "a calendar quota (period) has no per or refill_per_second: it resets at each period's start"}
	case b.Capacity < 1 || b.Capacity > regions.MaxCapacity:
		return &bucketError{key + ".capacity", fmt.Sprintf("must be between 1 and %d, got %d", int64(regions.MaxCapacity), b.Capacity)}
	}
	r := regions.Rule{Tenant: regions.Wildcard, Route: regions.Wildcard, Capacity: 1, RefillPerSecond: 1, Shards: 1, Bands: []regions.Band{b.band()}}
	if err := r.Validate(); err != nil {
		k := key + ".period"
		if strings.Contains(err.Error(), "zone") {
			k = key + ".zone"
		}
		return &bucketError{k, unwrapInvalid(err)}
	}
	return nil
}

func checkBands(bands []BandConfig, shards int) *bucketError {
	if len(bands) == 0 {
		return nil
	}
	if len(bands) > regions.MaxBands {
		return &bucketError{"bands", fmt.Sprintf("at most %d bands besides the rule's own (%q), got %d", regions.MaxBands, regions.PrimaryBand, len(bands))}
	}
	if shards > 1 {
		return &bucketError{"shards", fmt.Sprintf("a rule with bands cannot be sharded (got %d): its buckets are decided in one script call", shards)}
	}
	seen := make(map[string]int, len(bands))
	for i, b := range bands {
		key := fmt.Sprintf("bands[%d]", i)
		if err := regions.ValidateID("band", b.Name); err != nil {
			return &bucketError{key + ".name", unwrapInvalid(err)}
		}
		if strings.EqualFold(b.Name, regions.PrimaryBand) {
			return &bucketError{key + ".name", fmt.Sprintf("%q is the name of the rule's own capacity and refill_per_second", b.Name)}
		}
		if j, dup := seen[b.Name]; dup {
			return &bucketError{key + ".name", fmt.Sprintf("band %q is already bands[%d]", b.Name, j)}
		}
		seen[b.Name] = i
		if b.Period != "" || b.Zone != "" {
			if err := checkQuotaBand(key, b); err != nil {
				return err
			}
			continue
		}
		switch {
		case b.Per != "" && b.RefillPerSecond != 0:
			return &bucketError{key, "give per or refill_per_second, not both"}
		case b.Per == "" && b.RefillPerSecond == 0:
			return &bucketError{key, "give per (1h: capacity per hour) or refill_per_second"}
		case b.Per != "":
			if _, err := store.RefillOver(b.Capacity, b.Per); err != nil {
				return &bucketError{key + ".per", strings.TrimPrefix(err.Error(), "per ")}
			}
		}
		if err := checkBucket(b.Capacity, b.band().RefillPerSecond, 1); err != nil {
			k := key + "." + err.key
			if err.key == "refill_per_second" && b.Per != "" {
				k, err.reason = key+".per", fmt.Sprintf("capacity %d per %s is a refill of %v a second: %s", b.Capacity, b.Per, b.band().RefillPerSecond, err.reason)
			}
			return &bucketError{k, err.reason}
		}
	}
	r := regions.Rule{Tenant: regions.Wildcard, Route: regions.Wildcard, Capacity: 1, RefillPerSecond: 1, Shards: 1, Bands: regionsBands(bands)}
	if err := r.Validate(); err != nil {
		return &bucketError{"bands", unwrapInvalid(err)}
	}
	return nil
}

func (k KeyConfig) hash() (regions.KeyHash, error) {
	switch {
	case k.Secret != "" && k.SHA256 != "":
		return regions.KeyHash{}, errors.New("give secret or sha256, not both")
	case k.Secret != "":
		return regions.HashKey(k.Secret), nil
	case k.SHA256 != "":
		var h regions.KeyHash
		b, err := hex.DecodeString(k.SHA256)
		if err != nil || len(b) != len(h) {
			return h, fmt.Errorf("sha256 must be %d hex digits (sha256sum of the key)", 2*len(h))
		}
		copy(h[:], b)
		return h, nil
	default:
		return regions.KeyHash{}, errors.New("give secret (the key) or sha256 (its hex SHA-256)")
	}
}

// registerPattern checks a ServeMux pattern by registering it. ServeMux reports a bad or
// conflicting pattern only by panicking, so this is the one place that recovers.
func registerPattern(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port, got %q", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("bad port in %q", addr)
	}
	return nil
}

func checkURL(raw string, schemes ...string) error {
	if raw == "" {
		return errors.New("required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %s", redactedReason(err, raw))
	}
	for _, s := range schemes {
		if u.Scheme == s {
			if u.Host == "" && s != "unix" {
				return fmt.Errorf("no host in %s URL", s)
			}
			return nil
		}
	}
	return fmt.Errorf("scheme %q not supported (want %s)", u.Scheme, strings.Join(schemes, ", "))
}

// checkClusterURL: a Redis Cluster is reached over TCP and has only database 0.
func checkClusterURL(raw string) error {
	if raw == "" {
		return errors.New("needs redis.url (the seed nodes)")
	}
	u, err := url.Parse(raw) // checkURL has accepted it
	if err != nil {
		return fmt.Errorf("not a URL: %s", redactedReason(err, raw))
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return fmt.Errorf("needs a redis:// or rediss:// redis.url, got %s://", u.Scheme)
	}
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		return errors.New("a Redis Cluster has only database 0: drop the /db from redis.url")
	}
	return nil
}

// checkDatabaseURL accepts what store.Open accepts (pgx's parser: a postgres:// URL,
// several hosts, or a key=value string), without dialing.
func checkDatabaseURL(raw string) error {
	if _, err := pgconn.ParseConfig(raw); err != nil {
		return fmt.Errorf("not a PostgreSQL URL or key=value string: %s", redactedReason(err, raw))
	}
	return nil
}

// quoted is a quoted fragment of a parse error's text: `...`, "..." or '...'.
var quoted = regexp.MustCompile("`[^`]*`|\"[^\"]*\"|'[^']*'")

// redactedReason is a URL parse error fit for a message. Parsers quote the input, or a
// piece of it, and in a malformed URL the piece can be part of a password (the text
// before a '/' in one is taken for a port): every quoted fragment is elided, whatever is left
// of the URL goes, and so does the password wherever it still shows.
func redactedReason(err error, raw string) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		// "cannot parse `URL`: reason (detail)": keep the reason and the detail.
		if i := strings.LastIndex(msg, "`: "); i >= 0 {
			msg = msg[i+3:]
		}
	}
	msg = quoted.ReplaceAllString(msg, `"…"`)
	msg = strings.ReplaceAll(msg, raw, "")
	msg = redact.String(msg, redact.Secrets(raw))
	msg = strings.Join(strings.Fields(msg), " ")
	if msg == "" || msg == "()" {
		msg = "malformed"
	}
	return msg
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("want debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// unwrapInvalid drops the "invalid " prefix regions adds, the key already says what it is.
func unwrapInvalid(err error) string { return strings.TrimPrefix(err.Error(), "invalid ") }

// scalarError is a bad duration or whole number; yamlError finds its key in the document.
type scalarError struct{ value, reason string }

func (e *scalarError) Error() string { return e.reason }

// unmarshalDuration reads "5ms", "30s", "1m"; a bare number is an error (which unit?).
func unmarshalDuration(d *time.Duration, b []byte) error {
	s := strings.TrimSpace(string(b))
	s = strings.Trim(s, `"'`)
	v, err := time.ParseDuration(s)
	if err != nil {
		return &scalarError{value: s, reason: fmt.Sprintf("%q is not a duration (write e.g. 5ms, 30s, 1m)", s)}
	}
	*d = v
	return nil
}

// unmarshalInt64 and unmarshalInt read whole numbers (capacities, costs, counts) as
// whole numbers only: goccy/go-yaml would truncate 1.5 into 1 without a word. Decimal,
// 0x, 0o and 0b forms and _ separators are read, as YAML's and Go's integers.
func unmarshalInt64(v *int64, b []byte) error {
	n, err := parseWhole(b, 64)
	*v = n
	return err
}

func unmarshalInt(v *int, b []byte) error {
	n, err := parseWhole(b, strconv.IntSize)
	*v = int(n)
	return err
}

func parseWhole(b []byte, bits int) (int64, error) {
	s := strings.Trim(strings.TrimSpace(string(b)), `"'`)
	n, err := strconv.ParseInt(s, 0, bits)
	if err != nil {
		return 0, &scalarError{value: s, reason: fmt.Sprintf("wrong type: want an integer, got %q", s)}
	}
	return n, nil
}

// yamlError turns a decoder error into a ConfigError with the key's dotted path.
func yamlError(name string, data []byte, err error) error {
	var de *scalarError
	if errors.As(err, &de) {
		return &ConfigError{File: name, Key: findScalarKey(data, de.value), Reason: de.reason}
	}
	var ye yaml.Error
	if !errors.As(err, &ye) {
		return &ConfigError{File: name, Reason: err.Error()}
	}
	tk := ye.GetToken()
	msg := ye.GetMessage()
	var key string
	if tk != nil {
		key = findTokenKey(data, tk.Position.Line, tk.Position.Column)
		if key == "" {
			key = fmt.Sprintf("line %d", tk.Position.Line)
		}
	}
	var ue *yaml.UnknownFieldError
	if errors.As(err, &ue) {
		msg = strings.Replace(msg, "unknown field", "unknown key", 1)
	}
	var te *yaml.TypeError
	if errors.As(err, &te) && te.DstType != nil {
		msg = fmt.Sprintf("wrong type: want %s", typeName(te.DstType.String()))
		if te.SrcType != nil {
			msg += ", got " + typeName(te.SrcType.String())
		}
	}
	return &ConfigError{File: name, Key: key, Reason: msg}
}

func typeName(t string) string {
	switch {
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "an integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map"):
		return "a mapping"
	case strings.HasPrefix(t, "gateway."):
		return "a mapping"
	}
	return t
}

// findTokenKey returns the dotted path of the mapping entry whose key or value starts at
// line:col, or "".
func findTokenKey(data []byte, line, col int) string {
	var found string
	walkMappings(data, func(path string, m *ast.MappingValueNode) bool {
		for _, n := range []ast.Node{m.Key, m.Value} {
			if n == nil || n.GetToken() == nil {
				continue
			}
			p := n.GetToken().Position
			if p.Line == line && p.Column == col {
				found = path
				return false
			}
		}
		return true
	})
	return found
}

// findScalarKey returns the dotted path of the first mapping entry whose scalar value is v.
func findScalarKey(data []byte, v string) string {
	var found string
	walkMappings(data, func(path string, m *ast.MappingValueNode) bool {
		if s, ok := m.Value.(ast.ScalarNode); ok && fmt.Sprint(s.GetValue()) == v {
			found = path
			return false
		}
		return true
	})
	return found
}

func walkMappings(data []byte, fn func(path string, m *ast.MappingValueNode) bool) {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return
	}
	v := &mappingVisitor{fn: fn}
	for _, d := range f.Docs {
		if v.stop {
			return
		}
		ast.Walk(v, d)
	}
}

type mappingVisitor struct {
	fn   func(string, *ast.MappingValueNode) bool
	stop bool
}

func (v *mappingVisitor) Visit(n ast.Node) ast.Visitor {
	if v.stop {
		return nil
	}
	if m, ok := n.(*ast.MappingValueNode); ok {
		if !v.fn(strings.TrimPrefix(m.GetPath(), "$."), m) {
			v.stop = true
			return nil
		}
	}
	return v
}
