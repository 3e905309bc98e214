package limiter

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/lua"
)

// Defaults of Options, filled in by one function (Options.withDefaults).
const (
	DefaultTimeout           = 5 * time.Millisecond
	DefaultBreakerFailures   = 5
	DefaultBreakerOpenFor    = time.Second
	DefaultBreakerProbes     = 1
	DefaultExpectedInstances = 1
	DefaultPipelineBatch     = 64
	DefaultPipelineInFlight  = 4
	DefaultLeaseFraction     = 0.02
	DefaultLeaseTTL          = 250 * time.Millisecond
	DefaultMaxLeaseKeys      = 4096
	DefaultMaxLeaseSeries    = 16
)

// DefaultKeyPrefix starts every bucket key when Options.KeyPrefix is empty.
const DefaultKeyPrefix = lua.DefaultPrefix

// Options configures a Redis limiter. Zero fields take the defaults above.
type Options struct {
	// Region is the constant "region" label of the metrics; required with a Registerer.
	Region string
	// KeyPrefix starts every bucket key (lua.Keys); empty means DefaultKeyPrefix ("rl").
	KeyPrefix string
	// Timeout bounds each Redis call (default 5 ms). A call that exceeds it counts as a
	// failure and the decision comes from the fallback, so a slow Redis costs at most
	// this much latency.
	Timeout time.Duration
	// Breaker is the circuit breaker in front of Redis.
	Breaker BreakerOptions
	// Instances returns the number of live gateway instances of this region (from
	// heartbeats); the fallback holds 1/N of each rule. nil, or a result <= 0, means
	// ExpectedInstances.
	Instances func() int
	// ExpectedInstances is N while Instances does not know (default 1).
	ExpectedInstances int
	// Counted reports whether the other gateways of the region count this one in their
	// N yet (a gateway's heartbeat reaches the others' snapshots a reload later): until
	// then the fallback earns nothing, or the region's fallbacks together would earn more
	// than its refill. nil means always.
	Counted func() bool
	// Now is the clock of the fallback buckets, of leases (rates, expiry) and of the
	// breaker's failure span; nil means time.Now. The shared bucket itself runs on
	// Redis TIME.
	Now func() time.Time
	// MaxFallbackBuckets caps the fallback's buckets (LocalOptions.MaxBuckets), and the
	// buckets that may owe it a debt (default DefaultMaxBuckets).
	MaxFallbackBuckets int
	// Registerer receives the metrics; nil means they are not registered.
	Registerer prometheus.Registerer
	// Logger receives breaker state changes (never per-request lines); nil discards.
	Logger *slog.Logger
	// Pipeline is how concurrent calls share round trips.
	Pipeline PipelineOptions
	// Leases are token leases on hot keys (off unless Leases.Threshold > 0).
	Leases LeaseOptions
}

// BreakerOptions configure the circuit breaker in front of Redis.
type BreakerOptions struct {
	// Failures consecutive failures (errors or timeouts) open the breaker (default 5),
	// once they have gone on for FailureSpan. While it is open no call goes to Redis.
	Failures uint32
	// FailureSpan is how long calls must have been failing, with no success in between,
	// before the breaker opens (default Failures x Timeout). Calls that time out
	// together, in one pipeline or one stall of a busy machine, then count as one
	// failure rather than as many; a Redis that is down opens it within the span.
	FailureSpan time.Duration
	// OpenFor is how long the breaker stays open before it half-opens and lets probes
	// through (default 1 s).
	OpenFor time.Duration
	// Probes is how many calls a half-open breaker lets through; that many successes
	// close it, one failure opens it again (default 1).
	Probes uint32
}

// PipelineOptions configure the pipelining of concurrent calls (see batcher).
type PipelineOptions struct {
	// Off sends every call as its own EVALSHA. By default concurrent calls to the same
	// Redis share pipelines; with one caller at a time the two are the same.
	Off bool
	// Batch is the most calls sent in one pipeline (default 64).
	Batch int
	// InFlight is the most calls or pipelines out at once (default 4): a call that
	// finds them all out waits in a queue, and the next one to come back sends
	// everything queued.
	InFlight int
}

// LeaseOptions configure token leases on hot keys (see leaseTable).
type LeaseOptions struct {
	// Threshold turns leases on: a key this instance is asked for at this many tokens
	// per second or more takes batches of tokens from Redis and spends them locally
	// (Source lease). 0 means leases off. A few hundred is a sensible value: below it a
	// key costs few Redis calls anyway.
	Threshold float64
	// Fraction bounds the region's worst-case over-admission on a leased key,
	// instances x batch, as a fraction of one second's regional refill (default 0.02).
	Fraction float64
	// TTL is how long leased tokens may be spent (default 250 ms); later they go back to
	// Redis.
	TTL time.Duration
	// MaxKeys bounds the keys tracked for leases (default 4096).
	MaxKeys int
	// MaxSeries bounds the keys exported with their over-admission bound
	// (ratelimit_lease_overadmission_bound_tokens), largest first (default 16).
	MaxSeries int
}

// withDefaults validates o and fills in every default: the one place that does.
func (o Options) withDefaults() (Options, error) {
	b, p, ls := o.Breaker, o.Pipeline, o.Leases
	switch {
	case o.Timeout < 0 || b.OpenFor < 0 || b.FailureSpan < 0 || o.ExpectedInstances < 0:
		return o, fmt.Errorf("negative Timeout %v, Breaker.OpenFor %v, Breaker.FailureSpan %v or ExpectedInstances %d",
			o.Timeout, b.OpenFor, b.FailureSpan, o.ExpectedInstances)
	case p.Batch < 0 || p.InFlight < 0 || ls.TTL < 0 || ls.MaxKeys < 0 || ls.MaxSeries < 0:
		return o, fmt.Errorf("negative Pipeline.Batch %d, Pipeline.InFlight %d, Leases.TTL %v, Leases.MaxKeys %d or Leases.MaxSeries %d",
			p.Batch, p.InFlight, ls.TTL, ls.MaxKeys, ls.MaxSeries)
	case !(ls.Threshold >= 0) || math.IsInf(ls.Threshold, 0) || !(ls.Fraction >= 0 && ls.Fraction <= 1):
		return o, fmt.Errorf("Leases.Threshold %v must be a finite number >= 0 and Leases.Fraction %v within [0, 1]", ls.Threshold, ls.Fraction)
	case o.Registerer != nil && o.Region == "":
		return o, errors.New("metrics need a region label: set Region")
	}
	o.Timeout = orDefault(o.Timeout, DefaultTimeout)
	b.Failures = orDefault(b.Failures, DefaultBreakerFailures)
	b.FailureSpan = orDefault(b.FailureSpan, time.Duration(b.Failures)*o.Timeout)
	b.OpenFor = orDefault(b.OpenFor, DefaultBreakerOpenFor)
	b.Probes = orDefault(b.Probes, DefaultBreakerProbes)
	o.ExpectedInstances = orDefault(o.ExpectedInstances, DefaultExpectedInstances)
	if o.Instances == nil {
		o.Instances = func() int { return 0 }
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	p.Batch = orDefault(p.Batch, DefaultPipelineBatch)
	p.InFlight = orDefault(p.InFlight, DefaultPipelineInFlight)
	ls.Fraction = orDefault(ls.Fraction, DefaultLeaseFraction)
	ls.TTL = orDefault(ls.TTL, DefaultLeaseTTL)
	ls.MaxKeys = orDefault(ls.MaxKeys, DefaultMaxLeaseKeys)
	ls.MaxSeries = orDefault(ls.MaxSeries, DefaultMaxLeaseSeries)
	o.Breaker, o.Pipeline, o.Leases = b, p, ls
	return o, nil
}

// orDefault is v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
