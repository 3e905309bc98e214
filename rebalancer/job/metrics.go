package job

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/rebalancer"
)

// Results of one tick: the values of the result label.
const (
	ResultOK                = "ok"
	ResultSkippedPrometheus = "skipped_prometheus" // demand could not be read; shares kept
	ResultSkippedDatabase   = "skipped_database"   // the store could not be read or written
	ResultError             = "error"              // anything else (an allocation refused its input)
	ResultNotLeader         = "not_leader"         // another rebalancer holds the lock
)

// Reasons a scope's computed shares were not written, beyond the rebalancer's own
// (hysteresis, no_trigger).
const (
	SkipOverride = "override" // an operator override is in force for the scope
	SkipDryRun   = "dry_run"
	SkipError    = "error" // the allocation refused the scope's input
)

var (
	results     = []string{ResultOK, ResultSkippedPrometheus, ResultSkippedDatabase, ResultError, ResultNotLeader}
	skipReasons = []string{rebalancer.ReasonHysteresis, rebalancer.ReasonNoTrigger, SkipOverride, SkipDryRun, SkipError}
)

type metrics struct {
	runs          *prometheus.CounterVec // full runs on the interval
	checks        *prometheus.CounterVec // fast-path checks
	lastSuccess   prometheus.Gauge
	shareRatio    *prometheus.GaugeVec
	writesSkipped *prometheus.CounterVec
	shareWrites   prometheus.Counter
	leader        prometheus.Gauge
	duration      *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_runs_total",
			Help: "Full rebalancer runs (every interval) by result: ok, skipped_prometheus, skipped_database, error, not_leader.",
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
			Help: "Scopes whose computed shares were not written, by reason: hysteresis, no_trigger, override, dry_run, error.",
		}, []string{"reason"}),
		shareWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_rebalancer_share_writes_total",
			Help: "Region shares written (one per region and scope changed).",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_rebalancer_leader",
			Help: "1 while this rebalancer holds the leader lock.",
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
	m.duration.WithLabelValues(kindRun.String())
	m.duration.WithLabelValues(kindCheck.String())
	if reg != nil {
		reg.MustRegister(m.runs, m.checks, m.lastSuccess, m.shareRatio, m.writesSkipped, m.shareWrites, m.leader, m.duration)
	}
	return m
}

func (m *metrics) count(k kind, result string) {
	if k == kindRun {
		m.runs.WithLabelValues(result).Inc()
	} else {
		m.checks.WithLabelValues(result).Inc()
	}
}
