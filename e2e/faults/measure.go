package faults

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/e2e/stack"
	"github.com/quotaplane/quotaplane/regions"
)

// Snap is the cluster at one moment: every reachable gateway's /metrics and the load's
// status counts per stream.
type Snap struct {
	At       time.Time
	Gateways map[string]Scrape
	Counts   map[string]map[int]uint64
}

// Snapshot scrapes every gateway (a stopped one is left out) and copies the counts.
func (e *Env) Snapshot(ctx context.Context, live *loadgen.Counts) Snap {
	s := Snap{At: time.Now(), Gateways: map[string]Scrape{}}
	if live != nil {
		s.Counts = live.Snapshot()
	}
	for _, g := range e.Gateways {
		if sc, err := ScrapeURL(ctx, g.Admin); err == nil {
			s.Gateways[g.ID] = sc
		}
	}
	return s
}

// Window is the stretch of time around one fault that is measured.
type Window struct {
	Fault string
	// Region is the region whose Redis the fault hits ("" when none).
	Region string
	// RedisRestarts is how often that Redis came back empty during the window.
	RedisRestarts int
	// Affected are the gateways whose decision latency is measured (all when empty).
	Affected []string
	// Recovery is the time from the end of the fault until every gateway of Region
	// decided with Redis again (0 when not measured).
	Recovery time.Duration
	// Outage is how long Region's Redis admitted nothing for certain (killed, paused or
	// answering after the timeout): the bound's partial-fallback term starts after it.
	Outage time.Duration
	Before Snap
	After  Snap
	// HotLimits are the hot tenant's regional limits at the start.
	HotLimits map[string]regions.Limit
}

// Begin starts a window: the snapshot before and the hot tenant's regional limits.
func (e *Env) Begin(ctx context.Context, fault, region string, live *loadgen.Counts) (*Window, error) {
	snap, err := e.Store.LoadSnapshot(ctx, 3*time.Second)
	if err != nil {
		return nil, fmt.Errorf("begin %s: %w", fault, err)
	}
	w := &Window{Fault: fault, Region: region, HotLimits: map[string]regions.Limit{}}
	for _, r := range e.Regions {
		_, lim, _ := snap.RegionalRule(r, HotTenant, stack.Route)
		w.HotLimits[r] = lim
	}
	w.Before = e.Snapshot(ctx, live)
	return w, nil
}

// End takes the snapshot after.
func (e *Env) End(ctx context.Context, w *Window, live *loadgen.Counts) {
	w.After = e.Snapshot(ctx, live)
}

// Figures are what one window measured.
type Figures struct {
	Fault   string
	Elapsed time.Duration
	// Requests answered in the window, by status (0 = transport error: a connection
	// refused by a gateway that is not running).
	Codes     map[int]uint64
	Requests  uint64
	Status5xx uint64
	// Decisions of the affected gateways by source.
	Decisions map[string]float64
	// DecisionP99 is the affected gateways' 99th percentile decision time from
	// ratelimit_decision_duration_seconds (linear within a bucket), and WithinBound the
	// fraction of decisions at most the Redis timeout + 1 ms (a bucket bound of the
	// gateway's histogram, so exact).
	DecisionP99 time.Duration
	WithinBound float64
	// SlowDecisions took longer than the histogram's last bound (50 ms).
	SlowDecisions float64
	// HotAdmitted are the hot tenant's 200s across the cluster; HotLimit the token-bucket
	// limit over the window (Limit).
	HotAdmitted uint64
	HotLimit    float64
	Recovery    time.Duration
}

// Ratio is admitted over the limit.
func (f Figures) Ratio() float64 {
	if f.HotLimit == 0 {
		return 0
	}
	return float64(f.HotAdmitted) / f.HotLimit
}

// Evaluate computes the figures of a finished window.
func (e *Env) Evaluate(w *Window) Figures {
	f := Figures{Fault: w.Fault, Elapsed: w.After.At.Sub(w.Before.At), Codes: map[int]uint64{}, Decisions: map[string]float64{}, Recovery: w.Recovery}
	for name, codes := range w.After.Counts {
		for code, n := range codes {
			d := n - w.Before.Counts[name][code]
			f.Codes[code] += d
			f.Requests += d
			if code >= 500 {
				f.Status5xx += d
			}
			if code == 200 && strings.HasSuffix(name, "/"+HotTenant) {
				f.HotAdmitted += d
			}
		}
	}
	affected := w.Affected
	if len(affected) == 0 {
		for _, g := range e.Gateways {
			affected = append(affected, g.ID)
		}
	}
	var hist Hist
	for _, id := range affected {
		after, ok := w.After.Gateways[id]
		if !ok {
			continue
		}
		before := w.Before.Gateways[id] // nil when it was not running: counts from its start
		h := after.Histogram("ratelimit_decision_duration_seconds").Sub(before.Histogram("ratelimit_decision_duration_seconds"))
		hist = hist.Add(h)
		for _, src := range []string{"redis", "fallback", "lease", "local", "none"} {
			f.Decisions[src] += delta(before, after, "ratelimit_requests_total", "source", src)
		}
	}
	f.DecisionP99 = time.Duration(hist.Quantile(0.99) * float64(time.Second))
	if n := len(hist.Counts); n > 0 {
		f.SlowDecisions = hist.Total - hist.Counts[n-1]
	}
	f.WithinBound = hist.AtMost((e.opts.RedisTimeout + time.Millisecond).Seconds())
	f.HotLimit = e.Limit(w, f.Elapsed)
	return f
}

// delta is a counter's increase between two scrapes of one process (from 0 when it
// restarted in between).
func delta(before, after Scrape, name string, match ...string) float64 {
	a, b := after.Sum(name, match...), before.Sum(name, match...)
	if a < b {
		return a
	}
	return a - b
}

// Limit is the hot tenant's admission limit over a window of length elapsed: each
// region's bucket admits at most capacity + refill x elapsed, summed over the regions.
//
// Nothing is added for the fallback: what a gateway's fallback admits while Redis cannot
// be reached is charged to the Redis bucket when it answers again (gateway/limiter), and
// every answer from Redis lowers the fallback bucket to the gateway's share of what is
// left, so a fault is to cost latency, not accuracy.
func (e *Env) Limit(w *Window, elapsed time.Duration) float64 {
	limit := 0.0
	for _, r := range e.Regions {
		lim := w.HotLimits[r]
		limit += float64(lim.Capacity) + lim.RefillPerSecond*elapsed.Seconds()
	}
	return limit
}

// WaitRedis waits until every gateway of region has its breaker closed and has made a
// Redis decision since the call, and returns how long that took.
func (e *Env) WaitRedis(ctx context.Context, region string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	base := map[string]float64{}
	for _, g := range e.GatewaysOf(region) {
		if s, err := ScrapeURL(ctx, g.Admin); err == nil {
			base[g.ID] = s.Sum("ratelimit_requests_total", "source", "redis")
		}
	}
	err := waitUntil(ctx, limit, func() bool {
		for _, g := range e.GatewaysOf(region) {
			s, err := ScrapeURL(ctx, g.Admin)
			if err != nil || s.Sum("ratelimit_breaker_state") != 0 || s.Sum("ratelimit_requests_total", "source", "redis") <= base[g.ID] {
				return false
			}
		}
		return true
	})
	return time.Since(start), err
}
