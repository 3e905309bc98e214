package gateway

import (
	"crypto/tls"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/gateway/limiter"
)

// The limiter the gateway decides with, and the Redis client under it.

// newLimiter builds the limiter: the Redis one behind its breaker and fallback, or a
// local one without Redis. Every limiter.Options the gateway sets is set here, once.
func (g *Gateway) newLimiter() error {
	c := &g.cfg.Redis
	if !c.enabled() {
		l, err := limiter.NewLocal(limiter.LocalOptions{Region: g.cfg.Region, Registerer: g.registerer})
		if err != nil {
			return fmt.Errorf("gateway %s: local limiter: %w", g.cfg.Region, err)
		}
		g.lim = l
		return nil
	}
	rdb, err := newRedisClient(c, g.cfg.file)
	if err != nil {
		return err
	}
	g.rdb = rdb
	opts := limiter.Options{
		Region:    g.cfg.Region,
		Timeout:   c.Timeout,
		KeyPrefix: c.KeyPrefix,
		Breaker: limiter.BreakerOptions{
			Failures:    c.Breaker.Failures,
			FailureSpan: c.Breaker.FailureSpan,
			OpenFor:     c.Breaker.OpenFor,
		},
		Instances:         g.fallbackInstances,
		ExpectedInstances: g.cfg.ExpectedInstances,
		Counted:           g.counted,
		Registerer:        g.registerer,
		Logger:            g.log,
	}
	setLeases(&opts, g.cfg.Leases)
	l, err := limiter.NewRedis(g.rdb, opts)
	if err != nil {
		return fmt.Errorf("gateway %s: redis limiter: %w", g.cfg.Region, err) // New closes g.rdb
	}
	g.lim, g.redis = l, l
	return nil
}

// setLeases maps the leases config onto the limiter's options; zero values take the
// limiter's defaults, a zero threshold leaves leases off.
func setLeases(o *limiter.Options, l LeasesConfig) {
	o.Leases.Threshold = l.Threshold
	o.Leases.Fraction = l.Fraction
	o.Leases.TTL = l.TTL
}

// warmConns connections are kept open to Redis (per node of a cluster), one per pipeline
// the limiter may have in flight, so the first burst after a start or an idle spell
// does not pay for dials within the decision timeout (and get fallback decisions).
const warmConns = limiter.DefaultPipelineInFlight

// newRedisClient is the client of redis.url: one server, or a Redis Cluster's client with
// redis.cluster. Either way a dead Redis must not hold a request past the decision
// timeout: the limiter bounds every call by its own timeout through the context, and
// these keep a connection attempt or a pool slot from lasting long either.
func newRedisClient(c *RedisConfig, file string) (redis.UniversalClient, error) {
	dial := max(10*c.Timeout, 100*time.Millisecond)
	if c.Sentinel.configured() {
		return newSentinelClient(c, file, dial)
	}
	if c.Cluster {
		co, err := redis.ParseClusterURL(c.URL)
		if err != nil {
			return nil, &ConfigError{File: file, Key: "redis.url", Reason: redactedReason(err, c.URL)}
		}
		co.ContextTimeoutEnabled = true
		co.DialTimeout = dial
		co.MaxRetries = -1 // a retry would double the latency bound; the fallback answers instead
		if co.MinIdleConns == 0 {
			co.MinIdleConns = warmConns
		}
		if co.MaxRedirects == 0 {
			// A MOVED or ASK answer costs a round trip within the decision timeout; after
			// one the client reloads the slot map, so two is plenty.
			co.MaxRedirects = 2
		}
		if co.TLSConfig != nil {
			if err := c.TLS.apply(co.TLSConfig); err != nil {
				return nil, &ConfigError{File: file, Key: "redis.tls", Reason: err.Error()}
			}
		}
		return redis.NewClusterClient(co), nil
	}
	ro, err := redis.ParseURL(c.URL)
	if err != nil {
		return nil, &ConfigError{File: file, Key: "redis.url", Reason: redactedReason(err, c.URL)}
	}
	ro.ContextTimeoutEnabled = true
	ro.DialTimeout = dial
	ro.MaxRetries = -1 // a retry would double the latency bound; the fallback answers instead
	if ro.MinIdleConns == 0 {
		ro.MinIdleConns = warmConns
	}
	if ro.TLSConfig != nil {
		if err := c.TLS.apply(ro.TLSConfig); err != nil {
			return nil, &ConfigError{File: file, Key: "redis.tls", Reason: err.Error()}
		}
	}
	return redis.NewClient(ro), nil
}

// decisionBounds are extra decision-histogram bounds at the Redis timeout and 1 ms past
// it, so "p99 of decisions <= timeout + 1 ms" can be read off the histogram exactly.
func decisionBounds(c *RedisConfig) []float64 {
	if !c.enabled() {
		return nil
	}
	return []float64{c.Timeout.Seconds(), (c.Timeout + time.Millisecond).Seconds()}
}

// newSentinelClient is the failover client of redis.sentinel, with the same bounds as
// the other clients: context deadlines honoured, no retries, short dials.
func newSentinelClient(c *RedisConfig, file string, dial time.Duration) (redis.UniversalClient, error) {
	s := c.Sentinel
	o := &redis.FailoverOptions{
		MasterName:            s.MasterName,
		SentinelAddrs:         append([]string(nil), s.Addrs...),
		Username:              s.Username,
		Password:              s.Password,
		SentinelUsername:      s.SentinelUsername,
		SentinelPassword:      s.SentinelPassword,
		DB:                    s.DB,
		ContextTimeoutEnabled: true,
		DialTimeout:           dial,
		MaxRetries:            -1, // a retry would double the latency bound; the fallback answers instead
		MinIdleConns:          warmConns,
	}
	if s.TLS {
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if err := c.TLS.apply(o.TLSConfig); err != nil {
			return nil, &ConfigError{File: file, Key: "redis.tls", Reason: err.Error()}
		}
	}
	return redis.NewFailoverClient(o), nil
}
