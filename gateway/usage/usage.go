// Package usage owns what a gateway knows of calendar-quota usage: the counters its
// region's decisions showed, reported to the store, and every region's usage read back
// from it, from which each quota band's allowance is computed (regions.Allowance). It is
// the only path by which one region learns what the others have used; no request waits
// on it.
package usage

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/regions"
)

// Store is what the tracker needs of the store (regions/store.Store).
type Store interface {
	// ReportUsage records the region's counters: never lowering one already recorded.
	ReportUsage(ctx context.Context, region string, rows []regions.QuotaReport) error
	// LoadUsage is every quota period starting at since or later: the region's usage
	// and the fleet's.
	LoadUsage(ctx context.Context, region string, since time.Time) (map[regions.QuotaKey]regions.QuotaUsage, error)
}

// Tracker reports a region's quota counters and holds the fleet's usage as last read.
// It is safe for concurrent use.
type Tracker struct {
	region string
	st     Store
	now    func() time.Time
	log    *slog.Logger

	mu       sync.Mutex
	seen     map[regions.QuotaKey]int64 // the highest counter seen since the last report
	inflight map[regions.QuotaKey]int64 // the report being sent, until the load after it

	view atomic.Pointer[map[regions.QuotaKey]regions.QuotaUsage]

	errors  prometheus.Counter
	loaded  prometheus.Gauge
	pending prometheus.GaugeFunc
}

// Options configure a Tracker.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now        func() time.Time
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// New returns a tracker of region's usage over st.
func New(region string, st Store, o Options) (*Tracker, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Tracker{region: region, st: st, now: o.Now, log: o.Logger, seen: map[regions.QuotaKey]int64{}}
	t.errors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_quota_sync_errors_total",
		Help: "Reports of calendar-quota usage to the store, or loads of the fleet's usage from it, that failed (the last usage read stays in force).",
	})
	t.loaded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ratelimit_quota_usage_loaded_timestamp_seconds",
		Help: "When the fleet's calendar-quota usage was last read from the store (Unix time; 0: never). The allowances are that old.",
	})
	t.pending = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_quota_reports_pending",
		Help: "Quota counters seen and not yet reported to the store.",
	}, func() float64 {
		t.mu.Lock()
		defer t.mu.Unlock()
		return float64(len(t.seen) + len(t.inflight))
	})
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{t.errors, t.loaded, t.pending} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("quota usage metrics: %w", err)
			}
		}
	}
	return t, nil
}

// Saw records that the region's counter of k stood at used after a decision.
func (t *Tracker) Saw(k regions.QuotaKey, used int64) {
	t.mu.Lock()
	if used > t.seen[k] {
		t.seen[k] = used
	}
	t.mu.Unlock()
}

// Usage is what the last load counted of k, with this gateway's own region's usage raised
// to the highest counter it has seen since (not reported yet): a fresher count of it, so
// a counter Redis lost comes back at least at what this gateway saw. loaded is false
// before the first load succeeded.
func (t *Tracker) Usage(k regions.QuotaKey) (u regions.QuotaUsage, loaded bool) {
	m := t.view.Load()
	if m == nil {
		return regions.QuotaUsage{}, false
	}
	u = (*m)[k]
	t.mu.Lock()
	seen := max(t.seen[k], t.inflight[k])
	t.mu.Unlock()
	if seen > u.Mine {
		u.Total += seen - u.Mine
		u.Mine = seen
	}
	return u, true
}

// Loaded reports whether a load has succeeded yet.
func (t *Tracker) Loaded() bool { return t.view.Load() != nil }

// Sync reports the counters seen since the last report, then reads the fleet's usage.
// A report that fails is kept for the next Sync (a counter only grows, so reporting
// its highest value later loses nothing); a load that fails keeps the last usage read,
// so the allowances never go back to a fresh period's.
func (t *Tracker) Sync(ctx context.Context) error {
	t.mu.Lock()
	seen := t.seen
	t.seen, t.inflight = make(map[regions.QuotaKey]int64, len(seen)), seen
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.inflight = nil
		t.mu.Unlock()
	}()
	var err error
	if len(seen) > 0 {
		rows := make([]regions.QuotaReport, 0, len(seen))
		for k, used := range seen {
			rows = append(rows, regions.QuotaReport{QuotaKey: k, Used: used})
		}
		if err = t.st.ReportUsage(ctx, t.region, rows); err != nil {
			for k, used := range seen {
				t.Saw(k, used)
			}
			err = fmt.Errorf("report quota usage: %w", err)
		}
	}
	m, lerr := t.st.LoadUsage(ctx, t.region, t.now().Add(-regions.QuotaLookback))
	if lerr != nil {
		t.errors.Inc()
		if err == nil {
			err = fmt.Errorf("load quota usage: %w", lerr)
		}
		return err
	}
	// What this gateway saw and has not reported yet counts too: a fresher count of
	// its own region than the store's.
	t.mu.Lock()
	for k, used := range t.seen {
		if u := m[k]; used > u.Mine {
			u.Total += used - u.Mine
			u.Mine = used
			m[k] = u
		}
	}
	t.mu.Unlock()
	t.view.Store(&m)
	t.loaded.Set(float64(t.now().UnixNano()) / 1e9)
	if err != nil {
		t.errors.Inc()
	}
	return err
}

// Run syncs every interval until ctx ends, each Sync within timeout, and once more as it
// ends (a stopping gateway's last counters reach the store).
func (t *Tracker) Run(ctx context.Context, interval, timeout time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		if err := t.Sync(sctx); err != nil {
			t.log.Warn("quota usage not synced; the last usage read stays in force", "region", t.region, "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
			_ = t.Sync(sctx)
			cancel()
			return
		case <-tick.C:
		}
	}
}
