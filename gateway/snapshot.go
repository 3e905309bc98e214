package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/regions"
)

// The snapshot in force: swapping in a reloaded one, readiness, and what the limiter and
// the metrics read from it.

func (g *Gateway) onReload(s *regions.Snapshot) {
	if !g.acceptSnapshot(s) {
		return
	}
	known := false
	for _, r := range s.Regions() {
		known = known || r == g.cfg.Region
	}
	if !known {
		g.log.Warn("this region is not in the database; limits use an equal split of the known regions",
			"region", g.cfg.Region)
	}
	if g.usage != nil && !g.usage.Loaded() {
		// Before the first snapshot is served, the first count of the quotas: a gateway
		// that served quota requests without one would refuse them all (it never hands
		// out a fresh period's allowance).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := g.usage.Sync(ctx); err != nil {
			g.log.Warn("quota usage not read before serving; quota requests are refused until it is", "region", g.cfg.Region, "err", err)
		}
		cancel()
	}
	g.setSnapshot(s)
	g.log.Debug("snapshot loaded", "region", g.cfg.Region, "rules", s.RuleCount(),
		"instances", s.LiveInstances(g.cfg.Region))
}

// sinceSnapshot is how long ago the snapshot in force was stored (the monotonic clock).
func (g *Gateway) sinceSnapshot() time.Duration {
	return time.Since(g.origin) - time.Duration(g.snapAt.Load())
}

// counted is the limiter's Options.Counted: whether the region's other gateways count
// this one in their N yet. A standalone gateway (no heartbeats) always is.
func (g *Gateway) counted() bool {
	if g.cfg.Standalone() {
		return true
	}
	from := g.countedFrom.Load()
	return from != 0 && time.Since(g.origin) >= time.Duration(from)
}

// liveInstances is the fallback divisor: live gateways of this region, 0 when unknown.
func (g *Gateway) liveInstances() int {
	if s := g.snap.Load(); s != nil {
		return s.LiveInstances(g.cfg.Region)
	}
	return 0
}

// pairShare is a tracked (tenant, route) pair's effective share, for the share gauge.
func (g *Gateway) pairShare(tenant, route string) (float64, bool) {
	s := g.snap.Load()
	if s == nil {
		return 0, false
	}
	return g.enforcedShare(s, tenant, route), true
}

// enforcedShare is the share of (tenant, route) this region enforces under s: its share,
// times the gate ratio while an increase waits for the other regions' acknowledgments
// (regions.Snapshot.Pending, as decide applies it), so the gauge never reports a share
// that is not in force.
func (g *Gateway) enforcedShare(s *regions.Snapshot, tenant, route string) float64 {
	share, _ := s.Share(g.cfg.Region, tenant, route)
	if pending, held := s.Pending(g.cfg.Region, tenant, route); held {
		share *= pending
	}
	return share
}

// setSnapshot swaps in a new snapshot and updates the gauges that describe it.
func (g *Gateway) setSnapshot(s *regions.Snapshot) {
	g.snap.Store(s)
	g.snapAt.Store(int64(time.Since(g.origin)))
	g.m.rulesLoaded.Set(float64(s.RuleCount()))
	g.m.lastReload.SetToCurrentTime()
	g.m.instances.Set(float64(s.LiveInstances(g.cfg.Region)))
	g.m.heldRaises.Set(float64(s.HeldRaises(g.cfg.Region)))
	g.m.shareRatio.WithLabelValues(regions.Wildcard).Set(g.enforcedShare(s, regions.Wildcard, regions.Wildcard))
	g.tenants.refreshShares()
	g.ready.loaded()
}

// startDraining marks the gateway not ready, for good.
func (g *Gateway) startDraining() { g.ready.drain() }

// readiness makes "not draining, so ready" and "draining, so not ready" one step each:
// a reload racing the drain cannot set ratelimit_gateway_ready back to 1.
type readiness struct {
	mu       sync.Mutex
	draining atomic.Bool
	gauge    prometheus.Gauge // ratelimit_gateway_ready
}

// loaded: a snapshot is in force; ready unless draining.
func (r *readiness) loaded() {
	r.mu.Lock()
	if !r.draining.Load() {
		r.gauge.Set(1)
	}
	r.mu.Unlock()
}

// drain: not ready, for good.
func (r *readiness) drain() {
	r.mu.Lock()
	r.draining.Store(true)
	r.gauge.Set(0)
	r.mu.Unlock()
}

func (r *readiness) isDraining() bool { return r.draining.Load() }

// standaloneSnapshot builds the snapshot of a gateway without a database: one region
// (so its share is 1), the default rule, and the tenants' keys and rules. No instances
// are known, so the fallback divides by expected_instances.
func standaloneSnapshot(c *Config, now time.Time) (*regions.Snapshot, error) {
	d := regions.SnapshotData{
		Regions:  []string{c.Region},
		LoadedAt: now,
		Rules: []regions.Rule{{
			Tenant: regions.Wildcard, Route: regions.Wildcard,
			Capacity: c.DefaultRule.Capacity, RefillPerSecond: c.DefaultRule.RefillPerSecond,
			Shadow: c.DefaultRule.Shadow, Shards: c.DefaultRule.Shards, Bands: regionsBands(c.DefaultRule.Bands),
		}},
	}
	var id int64
	for _, t := range c.Tenants {
		for _, k := range t.Keys {
			h, err := k.hash()
			if err != nil {
				return nil, err // normalize has checked every key
			}
			id++
			d.Keys = append(d.Keys, regions.APIKey{ID: id, Hash: h, Tenant: t.ID, CreatedAt: now})
		}
		for _, r := range t.Rules {
			d.Rules = append(d.Rules, regions.Rule{
				Tenant: t.ID, Route: r.Route, Capacity: r.Capacity, RefillPerSecond: r.RefillPerSecond,
				Shadow: r.Shadow, Shards: r.Shards, UpdatedAt: now, Bands: regionsBands(r.Bands),
			})
		}
	}
	return regions.NewSnapshot(d)
}

// fallbackInstances is the fallback's divisor N: the live instances of this region by
// heartbeat, never fewer than expected_instances (a floor: 1 unless configured). The
// live count is what keeps a small fleet from being over-throttled; the floor is what
// keeps a fleet whose heartbeats are not loaded yet from admitting N times the limit.
func (g *Gateway) fallbackInstances() int {
	return max(g.liveInstances(), g.cfg.ExpectedInstances)
}

// acceptSnapshot checks a database snapshot before it is swapped in: one without a
// single region row (an empty or unmigrated control plane) would make this gateway
// ready while every share is unknown, so it is refused and the previous snapshot (or
// none: not ready) stays. Logged once per state change.
func (g *Gateway) acceptSnapshot(s *regions.Snapshot) bool {
	if len(s.Regions()) > 0 {
		if g.emptySnapshot.Swap(false) {
			g.log.Info("snapshot has regions again", "region", g.cfg.Region)
		}
		return true
	}
	g.m.reloadErrors.Inc()
	if !g.emptySnapshot.Swap(true) {
		g.log.Warn("snapshot has no region rows; keeping the previous one (not ready until one loads): add regions with ratectl",
			"region", g.cfg.Region, "ready", g.snap.Load() != nil)
	}
	return false
}
