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

// redisClusterSlots is the number of hash slots of a Redis Cluster.
const redisClusterSlots = 16384

// ClusterOptions configures StartRedisCluster. The zero value is a 3-master cluster with
// a 1 s node timeout that keeps serving the slots of live masters while one is down.
type ClusterOptions struct {
	// Dir holds one data directory per node; empty means a new temporary directory.
	Dir string
	// Masters is the number of master nodes (default 3). There are no replicas, so a
	// stopped master's slots are unavailable until it comes back; no failover happens.
	Masters int
	// NodeTimeout is cluster-node-timeout (default 1 s): how long a node may be
	// unreachable before the others flag it as failing.
	NodeTimeout time.Duration
	// RequireFullCoverage sets cluster-require-full-coverage. By default (false) the live
	// masters keep serving their slots while another master is down, which is what a
	// rate limiter wants; true makes every node refuse commands then (CLUSTERDOWN).
	RequireFullCoverage bool
	// Args are extra redis-server arguments for every node.
	Args []string
}

// Cluster is a Redis Cluster of masters started by StartRedisCluster. Each node is a
// Process: stop, kill, pause or restart it for fault tests. A restarted node keeps its
// node id and slots (its nodes.conf is in its directory) and comes back with no keys.
type Cluster struct {
	// Nodes are the masters; node i serves the i-th of equal ranges of the 16384 slots.
	Nodes []*Process

	busPorts []int // each node's cluster bus port
}

// Addrs are the host:port addresses of the nodes, for redis.ClusterOptions.Addrs or
// redis.UniversalOptions.Addrs.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, p := range c.Nodes {
		addrs[i] = p.Addr()
	}
	return addrs
}

// SlotRange is the first and last slot node i serves.
func (c *Cluster) SlotRange(i int) (first, last int) {
	return slotRange(i, len(c.Nodes))
}

// NodeForSlot is the index of the node that serves slot.
func (c *Cluster) NodeForSlot(slot int) int {
	for i := range c.Nodes {
		if first, last := c.SlotRange(i); slot >= first && slot <= last {
			return i
		}
	}
	return -1
}

// Stop kills every node. Stopping a stopped cluster does nothing.
func (c *Cluster) Stop() error {
	var errs []error
	for _, p := range c.Nodes {
		errs = append(errs, p.Kill())
	}
	return errors.Join(errs...)
}

// WaitOK polls every running node until it reports cluster_state:ok and knows all
// slots, or ctx ends. Call it after restarting a node, before relying on the cluster.
func (c *Cluster) WaitOK(ctx context.Context) error {
	for _, p := range c.Nodes {
		if !p.Running() {
			continue
		}
		if err := waitClusterOK(ctx, p.Addr()); err != nil {
			return err
		}
	}
	return nil
}

// slotRange splits the slots into n nearly equal ranges; the first ones take the
// remainder.
func slotRange(i, n int) (first, last int) {
	base, rem := redisClusterSlots/n, redisClusterSlots%n
	first = i*base + min(i, rem)
	last = first + base - 1
	if i < rem {
		last++
	}
	return first, last
}

// StartRedisCluster starts opts.Masters redis-server nodes with cluster mode on (Redis 7
// or later: each node's cluster bus port is chosen free and set with --cluster-port),
// assigns each an equal range of slots (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER
// MEET) and waits until every node reports cluster_state:ok.
// On error, the nodes already started are killed.
func StartRedisCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	if opts.Masters < 1 || opts.Masters > 64 {
		return nil, fmt.Errorf("start redis cluster: %d masters, want 1 to 64", opts.Masters)
	}
	if opts.NodeTimeout <= 0 {
		opts.NodeTimeout = time.Second
	}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "quotaplane-redis-cluster-*")
		if err != nil {
			return nil, fmt.Errorf("start redis cluster: %w", err)
		}
		opts.Dir = dir
	}
	coverage := "no"
	if opts.RequireFullCoverage {
		coverage = "yes"
	}
	c := &Cluster{}
	fail := func(err error) (*Cluster, error) {
		_ = c.Stop()
		return nil, fmt.Errorf("start redis cluster: %w", err)
	}
	for i := range opts.Masters {
		dir := filepath.Join(opts.Dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fail(err)
		}
		p, bus, err := startClusterNode(ctx, dir, append([]string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(opts.NodeTimeout.Milliseconds(), 10),
			"--cluster-require-full-coverage", coverage,
		}, opts.Args...))
		if err != nil {
			return fail(fmt.Errorf("node %d: %w", i, err))
		}
		c.Nodes = append(c.Nodes, p)
		c.busPorts = append(c.busPorts, bus)
	}
	for i, p := range c.Nodes {
		first, last := c.SlotRange(i)
		if err := addSlots(ctx, p.Addr(), first, last); err != nil {
			return fail(fmt.Errorf("node %d: %w", i, err))
		}
	}
	// Every node meets the first; gossip introduces the rest.
	for i, p := range c.Nodes[1:] {
		if err := clusterDo(ctx, p.Addr(), "cluster", "meet", c.Nodes[0].Host, c.Nodes[0].Port, c.busPorts[0]); err != nil {
			return fail(fmt.Errorf("node %d meets node 0: %w", i+1, err))
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := c.WaitOK(wctx); err != nil {
		return fail(err)
	}
	return c, nil
}

// startClusterNode starts one node on a free port with a free cluster bus port of its
// own (--cluster-port; by default Redis takes port+10000, which another process may
// hold). A port taken between choosing it and binding it is retried with new ports.
func startClusterNode(ctx context.Context, dir string, args []string) (*Process, int, error) {
	var last error
	for range 5 {
		bus, err := FreePort()
		if err != nil {
			return nil, 0, err
		}
		p, err := StartRedis(ctx, RedisOptions{Dir: dir, Args: append([]string{"--cluster-port", strconv.Itoa(bus)}, args...)})
		if err == nil {
			return p, bus, nil
		}
		if !strings.Contains(err.Error(), "Address already in use") {
			return nil, 0, err
		}
		last = err
	}
	return nil, 0, last
}

// RedisCluster starts a 3-master Redis Cluster for one test and kills it at cleanup.
func RedisCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := StartRedisCluster(context.Background(), ClusterOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("local.RedisCluster: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// addSlots assigns slots first..last to the node at addr.
func addSlots(ctx context.Context, addr string, first, last int) error {
	return clusterDo(ctx, addr, "cluster", "addslotsrange", first, last)
}

// clusterDo runs one command on one node over a connection of its own.
func clusterDo(ctx context.Context, addr string, args ...any) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
	defer rdb.Close()
	if err := rdb.Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("%v on %s: %w", args[:min(len(args), 2)], addr, err)
	}
	return nil
}

// waitClusterOK polls CLUSTER INFO on one node until cluster_state:ok with every slot
// assigned and at least as many known nodes as masters expected.
func waitClusterOK(ctx context.Context, addr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
	defer rdb.Close()
	last := ""
	for {
		info, err := rdb.ClusterInfo(ctx).Result()
		if err == nil && clusterInfoOK(info) {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = strings.Join(strings.Fields(info), " ")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster on %s not ok: %w (last: %s)", addr, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func clusterInfoOK(info string) bool {
	ok, assigned := false, false
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		switch {
		case line == "cluster_state:ok":
			ok = true
		case line == "cluster_slots_assigned:"+strconv.Itoa(redisClusterSlots):
			assigned = true
		}
	}
	return ok && assigned
}
