package limiter

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Eviction reasons of ratelimit_local_evictions_total.
const (
	evictIdle     = "idle"     // the bucket was full: exact
	evictCapacity = "capacity" // MaxBuckets reached: the bucket's debt is forgotten
)

// Reasons of ratelimit_fallback_refused_total: why the fallback refused a request
// without a bucket deciding it.
const (
	refuseClosed    = iota // a call failed while the breaker was closed: no episode
	refuseUncounted        // the other gateways do not count this one in their N yet
	refuseDebtsFull        // no room to record another bucket's debt
	refuseReasons
)

var refuseNames = [refuseReasons]string{"breaker_closed", "not_counted", "debts_full"}

// Reasons of ratelimit_redis_errors_total.
const (
	reasonTimeout     = "timeout"      // the call exceeded Options.Timeout
	reasonError       = "error"        // any other failure to get an answer
	reasonBreakerOpen = "breaker_open" // the breaker did not let the call through
	reasonInvalid     = "invalid"      // the script refused the arguments (a bug here)
)

// localMetrics are the metrics of one Local. They exist whether or not they are
// registered, so the hot path never checks.
type localMetrics struct {
	evictions *prometheus.CounterVec
	idle      prometheus.Counter
	capacity  prometheus.Counter
	settledV  *prometheus.CounterVec
	settled   [settleDirections]prometheus.Counter // charged and returned only
}

func newLocalMetrics() *localMetrics {
	m := &localMetrics{
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_local_evictions_total",
			Help: "In-memory buckets evicted: idle (full, so exact) or capacity (MaxBuckets reached: a local bucket not yet full starts again full, a fallback one empty).",
		}, []string{"reason"}),
	}
	m.idle = m.evictions.WithLabelValues(evictIdle)
	m.capacity = m.evictions.WithLabelValues(evictCapacity)
	m.settledV, m.settled = newSettled(settleOwed)
	return m
}

func (m *localMetrics) evicted(reason string, n int) {
	if n <= 0 {
		return
	}
	if reason == evictCapacity {
		m.capacity.Add(float64(n))
		return
	}
	m.idle.Add(float64(n))
}

// collectors are what a Local registers: the eviction counters and a gauge of the
// buckets held, read at scrape time.
func (m *localMetrics) collectors(buckets func() int) []prometheus.Collector {
	return []prometheus.Collector{
		m.evictions, m.settledV,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_local_buckets",
			Help: "In-memory token buckets held by the local or fallback limiter.",
		}, func() float64 { return float64(buckets()) }),
	}
}

// redisMetrics are the metrics of the Redis limiter.
type redisMetrics struct {
	errors      *prometheus.CounterVec
	timeout     prometheus.Counter
	failed      prometheus.Counter
	breakerOpen prometheus.Counter
	invalid     prometheus.Counter
	active      prometheus.Gauge
	state       prometheus.Gauge
	minCapacity prometheus.Counter
	owed        prometheus.Counter
	repaid      prometheus.Counter
	writtenOff  prometheus.Counter
	// costAboveFallback counts fallback rejections of a cost above the fallback bucket.
	costAboveFallback prometheus.Counter
	// refused counts the fallback's refusals that no bucket made, by reason.
	refusedVec     *prometheus.CounterVec
	refused        [refuseReasons]prometheus.Counter
	lost           prometheus.Counter
	flushed        prometheus.Counter
	evictingPolicy prometheus.Gauge

	pipelines    prometheus.Counter
	pipelined    prometheus.Counter
	noscript     prometheus.Counter
	shardRetries prometheus.Counter

	leaseOps      *prometheus.CounterVec
	leaseCalls    prometheus.Counter
	returnCalls   prometheus.Counter
	leaseTokens   *prometheus.CounterVec
	leaseGranted  prometheus.Counter
	leaseReturned prometheus.Counter
	leaseRejected prometheus.Counter

	settledV *prometheus.CounterVec
	settled  [settleDirections]prometheus.Counter
}

func newRedisMetrics() *redisMetrics {
	m := &redisMetrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_redis_errors_total",
			Help: "Decisions Redis did not make, by reason: timeout, error, breaker_open, invalid.",
		}, []string{"reason"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_fallback_active",
			Help: "1 while the Redis circuit breaker is not closed (decisions may come from the local fallback).",
		}),
		state: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_breaker_state",
			Help: "State of the Redis circuit breaker: 0 closed, 1 half-open, 2 open.",
		}),
		minCapacity: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_fallback_min_capacity_total",
			Help: "Fallback decisions whose rule had fewer tokens than there are instances, so each instance kept 1 token, more than its share floor(C/N) = 0 (the region may admit up to N). Every other fallback budget rounds down.",
		}),
		evictingPolicy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_redis_evicting_policy",
			Help: "1 when Redis's maxmemory-policy evicts keys (allkeys-*, volatile-*): buckets may be evicted and then read as full. Read by Load and again by CheckEviction (the gateway: every reload_interval); 0 when the policy does not evict or could not be read.",
		}),
		costAboveFallback: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_fallback_cost_rejections_total",
			Help: "Fallback decisions rejected because the request's cost exceeded this instance's fallback bucket (never clipped into a cheaper pass).",
		}),
		owed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_fallback_owed_tokens_total",
			Help: "Tokens the fallback admitted, every one owed to the shared bucket in Redis, counted once for each bucket it is owed to (a rule's own, each band's, a value's). Each ends up repaid, written off, lost (never charged: still owed at shutdown with Redis down) or still owed (ratelimit_fallback_debt_tokens).",
		}),
		repaid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_fallback_repaid_tokens_total",
			Help: "Tokens the fallback admitted that the bucket script charged to the shared bucket in Redis once it answered again (what Lua charged, after its -capacity floor).",
		}),
		writtenOff: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_fallback_debt_written_off_tokens_total",
			Help: "Tokens of fallback debt not charged because the bucket was already a whole capacity in debt (it admits nothing for a fill time then).",
		}),
		refusedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_fallback_refused_total",
			Help: "Requests the fallback refused without a bucket deciding, by reason: breaker_closed (a Redis call failed while the breaker was closed: one slow call is not an outage), not_counted (this gateway started too recently for the others to count it in N), debts_full (no room for another bucket's debt).",
		}, []string{"reason"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_fallback_debt_lost_tokens_total",
			Help: "Tokens the fallback admitted that were never charged to Redis: still owed when the limiter was closed and Redis did not answer the flush.",
		}),
		flushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_fallback_debt_flushed_tokens_total",
			Help: "Tokens of fallback debt charged to Redis by the flush at shutdown (also counted in repaid).",
		}),
	}
	for i, n := range refuseNames {
		m.refused[i] = m.refusedVec.WithLabelValues(n)
	}
	m.timeout = m.errors.WithLabelValues(reasonTimeout)
	m.failed = m.errors.WithLabelValues(reasonError)
	m.breakerOpen = m.errors.WithLabelValues(reasonBreakerOpen)
	m.invalid = m.errors.WithLabelValues(reasonInvalid)

	m.pipelines = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_redis_pipelines_total",
		Help: "Pipelines of queued script calls sent to Redis (calls that found a free slot go alone and are not counted).",
	})
	m.pipelined = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_redis_pipelined_calls_total",
		Help: "Script calls sent in pipelines; divided by ratelimit_redis_pipelines_total, the mean batch size.",
	})
	m.noscript = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_redis_noscript_reloads_total",
		Help: "Out-of-band reloads of the bucket scripts after Redis answered NOSCRIPT (it restarted or flushed its scripts); the calls that saw it were retried with EVAL.",
	})
	m.shardRetries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_shard_retries_total",
		Help: "Decisions on a sharded rule whose first shard rejected, so a second one was tried.",
	})
	m.leaseOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_lease_calls_total",
		Help: "Redis calls made for token leases on hot keys, by op: lease (take a batch) or return (give unspent tokens back).",
	}, []string{"op"})
	m.leaseCalls = m.leaseOps.WithLabelValues("lease")
	m.returnCalls = m.leaseOps.WithLabelValues("return")
	m.leaseTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_lease_tokens_total",
		Help: "Tokens moved by leases, by direction: granted (taken from Redis) or returned (given back unspent).",
	}, []string{"direction"})
	m.leaseGranted = m.leaseTokens.WithLabelValues("granted")
	m.leaseReturned = m.leaseTokens.WithLabelValues("returned")
	m.leaseRejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_lease_local_rejections_total",
		Help: "Requests on a leased key rejected locally, without a Redis call, while its shared bucket is known to be empty.",
	})
	m.settledV, m.settled = newSettled(settleDirections)
	return m
}

// collectors are what a Redis limiter registers; leases adds the per-key bound series
// (nil when leases are off).
func (m *redisMetrics) collectors(leases *leaseTable, fb *fallback) []prometheus.Collector {
	cs := []prometheus.Collector{m.errors, m.active, m.state, m.minCapacity, m.owed, m.repaid, m.writtenOff, m.costAboveFallback, m.evictingPolicy,
		m.refusedVec, m.lost, m.flushed, m.pipelines, m.pipelined, m.noscript, m.shardRetries, m.leaseOps, m.leaseTokens, m.leaseRejected, m.settledV,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_local_buckets",
			Help: "In-memory token buckets held by the local or fallback limiter.",
		}, func() float64 {
			if ep := fb.episode.Load(); ep != nil {
				return float64(ep.Len())
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_fallback_debt_tokens",
			Help: "Tokens the fallback admitted that Redis has not been charged yet (an outage in progress included).",
		}, func() float64 { return float64(fb.owing()) })}
	if leases != nil {
		cs = append(cs, &leaseCollector{t: leases})
	}
	return cs
}

var (
	leaseBoundDesc = prometheus.NewDesc("ratelimit_lease_overadmission_bound_tokens",
		"Worst-case over-admission of the region on a leased hot key (instances x batch, tokens), for the keys with the largest bounds (at most Leases.MaxSeries series).",
		[]string{"tenant", "route"}, nil)
	leaseKeysDesc = prometheus.NewDesc("ratelimit_lease_keys",
		"Hot keys this instance leases tokens for.", nil, nil)
)

// leaseCollector exports the current bound of the leased keys at scrape time, capped
// at the table's maxSeries keys (largest bounds), so the tenant label stays bounded.
type leaseCollector struct{ t *leaseTable }

func (c *leaseCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- leaseBoundDesc
	ch <- leaseKeysDesc
}

func (c *leaseCollector) Collect(ch chan<- prometheus.Metric) {
	all := c.t.list(0)
	ch <- prometheus.MustNewConstMetric(leaseKeysDesc, prometheus.GaugeValue, float64(len(all)))
	for _, li := range all[:min(len(all), c.t.maxSeries)] {
		ch <- prometheus.MustNewConstMetric(leaseBoundDesc, prometheus.GaugeValue, float64(li.Bound), li.Tenant, li.Route)
	}
}

// register registers every collector with the constant label region (every limiter
// metric has it), or nothing when reg is nil.
func register(reg prometheus.Registerer, region string, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	if region == "" {
		return errors.New("metrics need a region label: set Region")
	}
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"region": region}, reg)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register limiter metrics: %w", err)
		}
	}
	return nil
}
