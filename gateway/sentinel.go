package gateway

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

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

// newSentinelClient is the failover client of redis.sentinel, with the same bounds as
// the other clients: context deadlines honoured, no retries, short dials.
func (g *Gateway) newSentinelClient(dial time.Duration) (redis.UniversalClient, error) {
	s := g.cfg.Redis.Sentinel
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
		if err := g.cfg.Redis.TLS.apply(o.TLSConfig); err != nil {
			return nil, &ConfigError{File: g.cfg.file, Key: "redis.tls", Reason: err.Error()}
		}
	}
	return redis.NewFailoverClient(o), nil
}
