package job

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/rebalancer"
)

// Results of one tick: the values of the result label.
const (
	ResultOK                = "ok"
	ResultSkippedPrometheus = "skipped_prometheus" // demand could not be read; shares kept
	ResultSkippedDatabase   = "skipped_database"   // the store could not be read or written
	// ResultError is anything else: an allocation refused a scope's input (the other
	// scopes are still decided and written), PostgreSQL refused a write as invalid, or the
	// run was cut short between its two writes.
	ResultError     = "error"
	ResultNotLeader = "not_leader" // another rebalancer holds the lock
	// ResultFenced: a write was refused because another rebalancer took the leadership
	// over during the tick (the lease epoch moved); the run was abandoned.
	ResultFenced = "fenced"
	// ResultConflict: a write was refused because the rows it was computed from changed
	// (an operator, a region added or removed); the run was abandoned, the next tick
	// recomputes.
	ResultConflict = "conflict"
)

// Reasons a scope's computed shares were not written, beyond the rebalancer's own
// (hysteresis, no_trigger).
const (
	SkipOverride = "override" // an operator override is in force for the scope
	SkipDryRun   = "dry_run"
	SkipError    = "error" // the allocation refused the scope's input
	// SkipNoDemand: the "*" scope has no offered traffic outside the pairs with a scope
	// of their own, so there is nothing to split; its shares stay (a dark region still
	// shrinks to the floor).
	SkipNoDemand = "no_demand"
)

// BasisProportional is the Basis of an ok region's share in the "*" scope: its fraction
// of the offered demand "*" governs (see Job).
const BasisProportional rebalancer.Basis = "proportional"

var (
	results     = []string{ResultOK, ResultSkippedPrometheus, ResultSkippedDatabase, ResultError, ResultNotLeader, ResultFenced, ResultConflict}
	skipReasons = []string{rebalancer.ReasonHysteresis, rebalancer.ReasonNoTrigger, SkipOverride, SkipDryRun, SkipError, SkipNoDemand}
)

type metrics struct {
	runs          *prometheus.CounterVec // full runs on the interval
	checks        *prometheus.CounterVec // fast-path checks
	lastSuccess   prometheus.Gauge
	shareRatio    *prometheus.GaugeVec
	writesSkipped *prometheus.CounterVec
	shareWrites   prometheus.Counter
	expiredScopes prometheus.Counter
	leader        prometheus.Gauge
	duration      *prometheus.HistogramVec
	writesRefused *prometheus.CounterVec
	retries       *prometheus.CounterVec
	leaseRepairs  *prometheus.CounterVec
	// overridesExpired counts override rows whose end was recorded.
	overridesExpired prometheus.Counter
	lastTick         prometheus.Gauge
	overdue          prometheus.Counter
}

// newMetrics makes the job's metrics and registers them on reg (nil: none). A registry
// that already holds one of them (a second Job on it) is an error; nothing is left
// registered then.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_runs_total",
			Help: "Full rebalancer runs (every interval) by result: ok, skipped_prometheus, skipped_database, error, not_leader, fenced, conflict.",
		}, []string{"result"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_checks_total",
			Help: "Fast-path checks (every check interval) by result, as for runs.",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_rebalancer_last_success_timestamp_seconds",
			Help: "When the last full run succeeded (Unix time); 0 before the first.",
		}),
		shareRatio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_rebalancer_share_ratio",
			Help: "Share in force after the last full run, per region and scope: * and the busiest capped tenant/route pairs.",
		}, []string{"region", "scope"}),
		writesSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_writes_skipped_total",
			Help: "Scopes whose computed shares were not written, by reason: hysteresis, no_trigger, override, dry_run, error, no_demand.",
		}, []string{"reason"}),
		shareWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_share_writes_total",
			Help: "Region shares written (one per region and scope changed).",
		}),
		expiredScopes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_expired_scopes_total",
			Help: "Tenant/route pairs whose rebalancer shares were deleted after the configured number of full runs without demand.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_rebalancer_leader",
			Help: "1 while this rebalancer holds the leader lock.",
		}),
		writesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_writes_refused_total",
			Help: "Share writes the database refused, abandoning the tick, by reason: fenced (no longer the leader) or conflict (rows changed since read).",
		}, []string{"reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_retries_total",
			Help: "Ticks decided again at once from a fresh read, by reason: conflict (a write lost a race with a region or share change).",
		}, []string{"reason"}),
		leaseRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_lease_repairs_total",
			Help: "Writes fenced while this rebalancer still held the leader lock (the lease row edited, reset by migrate down and up, or deleted), by outcome: repaired (a new epoch taken) or failed.",
		}, []string{"outcome"}),
		overridesExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_overrides_expired_total",
			Help: "Operator override rows past their expiry that the rebalancer deleted, each recorded in the share history and the audit log.",
		}),
		lastTick: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_rebalancer_last_tick_timestamp_seconds",
			Help: "When this rebalancer last ended a tick (run or check, any result; Unix time); 0 before the first. A leader whose ticks stop keeps it old.",
		}),
		overdue: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_overdue_total",
			Help: "Times the leader went longer than its stale bound (3 tick periods plus the reload wait) without ending a tick.",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_rebalancer_run_duration_seconds",
			Help:    "Duration of a tick (kind run or check), including the shrink-before-grow wait.",
			Buckets: prometheus.ExponentialBuckets(0.01, 3, 9),
		}, []string{"kind"}),
	}
	for _, r := range results {
		m.runs.WithLabelValues(r)
		m.checks.WithLabelValues(r)
	}
	for _, r := range skipReasons {
		m.writesSkipped.WithLabelValues(r)
	}
	m.writesRefused.WithLabelValues(ResultFenced)
	m.writesRefused.WithLabelValues(ResultConflict)
	m.retries.WithLabelValues(ResultConflict)
	m.leaseRepairs.WithLabelValues("repaired")
	m.leaseRepairs.WithLabelValues("failed")
	m.duration.WithLabelValues(kindRun.String())
	m.duration.WithLabelValues(kindCheck.String())
	if reg == nil {
		return m, nil
	}
	var done []prometheus.Collector
	for _, c := range []struct {
		name string
		c    prometheus.Collector
	}{
		{"ratelimit_rebalancer_runs_total", m.runs}, {"ratelimit_rebalancer_checks_total", m.checks},
		{"ratelimit_rebalancer_last_success_timestamp_seconds", m.lastSuccess},
		{"ratelimit_rebalancer_share_ratio", m.shareRatio}, {"ratelimit_rebalancer_writes_skipped_total", m.writesSkipped},
		{"ratelimit_rebalancer_share_writes_total", m.shareWrites},
		{"ratelimit_rebalancer_expired_scopes_total", m.expiredScopes}, {"ratelimit_rebalancer_leader", m.leader},
		{"ratelimit_rebalancer_run_duration_seconds", m.duration},
		{"ratelimit_rebalancer_writes_refused_total", m.writesRefused},
		{"ratelimit_rebalancer_retries_total", m.retries},
		{"ratelimit_rebalancer_lease_repairs_total", m.leaseRepairs},
		{"ratelimit_rebalancer_overrides_expired_total", m.overridesExpired},
		{"ratelimit_rebalancer_last_tick_timestamp_seconds", m.lastTick},
		{"ratelimit_rebalancer_overdue_total", m.overdue},
	} {
		if err := reg.Register(c.c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("register metric %s: %w", c.name, err)
		}
		done = append(done, c.c)
	}
	return m, nil
}

func (m *metrics) count(k kind, result string) {
	if k == kindRun {
		m.runs.WithLabelValues(result).Inc()
	} else {
		m.checks.WithLabelValues(result).Inc()
	}
}
