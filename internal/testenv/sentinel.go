package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOptions configures StartSentinel. The zero value is one master, one replica
// and three sentinels (quorum 2) that fail over a master unreachable for 1 s.
type SentinelOptions struct {
	// Dir holds one directory per server; empty means a new temporary directory.
	Dir string
	// MasterName is the name the sentinels monitor (default "quotaplane").
	MasterName string
	// DownAfter is down-after-milliseconds: how long the master may be unreachable before
	// a sentinel flags it (default 1 s).
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout (default 5 s).
	FailoverTimeout time.Duration
}

// Sentinel is a Redis master with a replica, watched by three sentinels (Debian's
// redis-sentinel), all on loopback. Kill or pause Master to make the sentinels promote
// Replica; WaitMaster tells when they have.
type Sentinel struct {
	MasterName string
	// Master and Replica are the data servers as started: after a failover Replica is
	// the master.
	Master, Replica *Process
	Sentinels       []*Process
}

// Addrs are the sentinels' host:port, for redis.FailoverOptions.SentinelAddrs.
func (s *Sentinel) Addrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, p := range s.Sentinels {
		out[i] = p.Addr()
	}
	return out
}

// Stop kills every server. Stopping a stopped set does nothing.
func (s *Sentinel) Stop() error {
	var errs []error
	for _, p := range append([]*Process{s.Master, s.Replica}, s.Sentinels...) {
		if p != nil {
			errs = append(errs, p.Kill())
		}
	}
	return errors.Join(errs...)
}

// MasterAddr asks the first sentinel that answers for the current master's host:port.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var last error
	for _, p := range s.Sentinels {
		if !p.Running() {
			continue
		}
		c := redis.NewSentinelClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, PoolSize: 1})
		a, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
		_ = c.Close()
		if err == nil && len(a) == 2 {
			return a[0] + ":" + a[1], nil
		}
		last = err
	}
	return "", fmt.Errorf("sentinel: no master for %s: %w", s.MasterName, last)
}

// WaitMaster polls the sentinels until they name want as the master, or ctx ends.
func (s *Sentinel) WaitMaster(ctx context.Context, want string) error {
	last := ""
	for {
		a, err := s.MasterAddr(ctx)
		if err == nil && a == want {
			return nil
		}
		last = a
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sentinel: master is not %s: %w (last: %s)", want, ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// StartSentinel starts a master, a replica of it, and three sentinels monitoring it, and
// waits until the replica is in sync and every sentinel knows the replica and the other
// two sentinels (so a failover can be voted and carried out). On error the servers
// already started are killed.
func StartSentinel(ctx context.Context, opts SentinelOptions) (_ *Sentinel, err error) {
	if opts.MasterName == "" {
		opts.MasterName = "quotaplane"
	}
	if opts.DownAfter <= 0 {
		opts.DownAfter = time.Second
	}
	if opts.FailoverTimeout <= 0 {
		opts.FailoverTimeout = 5 * time.Second
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "quotaplane-sentinel-*"); err != nil {
			return nil, fmt.Errorf("start sentinel: %w", err)
		}
	}
	bin, err := lookBinary("redis-sentinel", "redis-sentinel")
	if err != nil {
		return nil, err
	}
	s := &Sentinel{MasterName: opts.MasterName}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	if s.Master, err = StartRedis(ctx, RedisOptions{Dir: filepath.Join(opts.Dir, "master")}); err != nil {
		return nil, err
	}
	if s.Replica, err = StartRedis(ctx, RedisOptions{Dir: filepath.Join(opts.Dir, "replica"),
		Args: []string{"--replicaof", s.Master.Host, strconv.Itoa(s.Master.Port)}}); err != nil {
		return nil, err
	}
	if err := waitReplicaSynced(ctx, s.Replica.Addr()); err != nil {
		return nil, err
	}
	for i := range 3 {
		p, err := startSentinelNode(ctx, bin, filepath.Join(opts.Dir, "sentinel-"+strconv.Itoa(i)), s.Master, opts)
		if err != nil {
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, p)
	}
	for _, p := range s.Sentinels {
		if err := waitSentinelKnows(ctx, p.Addr(), opts.MasterName, len(s.Sentinels)-1); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// RedisSentinel starts a Sentinel set for one test and kills it at cleanup.
func RedisSentinel(t testing.TB) *Sentinel {
	t.Helper()
	s, err := StartSentinel(context.Background(), SentinelOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("testenv.RedisSentinel: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// startSentinelNode runs redis-sentinel with a config file of its own (a sentinel
// rewrites its file as it learns the topology).
func startSentinelNode(ctx context.Context, bin, dir string, master *Process, opts SentinelOptions) (*Process, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start sentinel: %w", err)
	}
	conf := filepath.Join(dir, "sentinel.conf")
	name := opts.MasterName
	text := strings.Join([]string{
		"port " + strconv.Itoa(port),
		"bind 127.0.0.1",
		"daemonize no",
		"protected-mode no",
		"dir " + dir,
		fmt.Sprintf("sentinel monitor %s %s %d 2", name, master.Host, master.Port),
		fmt.Sprintf("sentinel down-after-milliseconds %s %d", name, opts.DownAfter.Milliseconds()),
		fmt.Sprintf("sentinel failover-timeout %s %d", name, opts.FailoverTimeout.Milliseconds()),
		fmt.Sprintf("sentinel parallel-syncs %s 1", name),
		"",
	}, "\n")
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return nil, fmt.Errorf("start sentinel: %w", err)
	}
	p := &Process{Name: "sentinel", Host: "127.0.0.1", Port: port, Dir: dir, bin: bin, args: []string{conf}}
	p.ready = func(ctx context.Context) error { return redisPing(ctx, p.Addr()) }
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// waitReplicaSynced polls INFO replication on a replica until its link to the master is up.
func waitReplicaSynced(ctx context.Context, addr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		info, err := rdb.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replica %s not in sync: %w", addr, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitSentinelKnows polls one sentinel until it knows a replica of name and the given
// number of other sentinels (they find each other through the master's hello channel,
// every 2 s).
func waitSentinelKnows(ctx context.Context, addr, name string, others int) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	last := ""
	for {
		replicas, rerr := c.Replicas(ctx, name).Result()
		sentinels, serr := c.Sentinels(ctx, name).Result()
		if rerr == nil && serr == nil && len(replicas) >= 1 && len(sentinels) >= others {
			return nil
		}
		last = fmt.Sprintf("%d replicas (%v), %d other sentinels (%v)", len(replicas), rerr, len(sentinels), serr)
		select {
		case <-ctx.Done():
			return fmt.Errorf("sentinel %s does not know the set yet: %w (last: %s)", addr, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
