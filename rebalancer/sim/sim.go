package sim

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quotaplane/quotaplane/rebalancer"
	"github.com/quotaplane/quotaplane/regions"
)

// Config is the simulated deployment. Every duration is whole seconds.
type Config struct {
	// Capacity (burst) and Refill (per second) of every tenant's global limit.
	Capacity int64
	Refill   float64
	// Interval is the full rebalancing run (5 min); CheckInterval the fast-path check
	// (1 min, waterfill only).
	Interval, CheckInterval time.Duration
	// ShortWindow is the short rate window (1 min); the long one is Interval.
	ShortWindow time.Duration
	// ScrapeLag is how old the newest sample a policy sees is (30 s).
	ScrapeLag time.Duration
	// ApplyDelay bounds how long a written share takes to reach a region's gateways
	// (20 s). Increases land after 1 s and decreases after ApplyDelay, the worst order.
	ApplyDelay time.Duration
	// HeartbeatTTL: a region is dark when it served nothing for this long (15 s).
	HeartbeatTTL time.Duration
	// Rebalancer configures waterfill; the zero value means
	// rebalancer.DefaultConfig(number of regions).
	Rebalancer rebalancer.Config
}

// DefaultConfig is the configuration `ratectl sim` starts from.
func DefaultConfig() Config {
	return Config{
		Capacity:      2000,
		Refill:        1000,
		Interval:      5 * time.Minute,
		CheckInterval: time.Minute,
		ShortWindow:   time.Minute,
		ScrapeLag:     30 * time.Second,
		ApplyDelay:    20 * time.Second,
		HeartbeatTTL:  15 * time.Second,
	}
}

func (c Config) validate() error {
	if c.Capacity <= 0 || !(c.Refill > 0) || math.IsInf(c.Refill, 0) {
		return fmt.Errorf("sim config: capacity %d and refill %v must be > 0", c.Capacity, c.Refill)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		min  time.Duration
	}{
		{"interval", c.Interval, time.Second},
		{"check interval", c.CheckInterval, time.Second},
		{"short window", c.ShortWindow, time.Second},
		{"scrape lag", c.ScrapeLag, 0},
		{"apply delay", c.ApplyDelay, time.Second},
		{"heartbeat ttl", c.HeartbeatTTL, time.Second},
	} {
		if d.v < d.min || d.v%time.Second != 0 || d.v > 24*time.Hour {
			return fmt.Errorf("sim config: %s %v must be whole seconds, at least %v and at most 24h", d.name, d.v, d.min)
		}
	}
	return nil
}

// epoch is the simulated wall time of second 0 (the allocation only ages state by it).
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// Run simulates policy on trace and measures it.
func Run(trace *Trace, policy Policy, cfg Config) (Report, error) {
	if trace == nil || trace.Seconds() == 0 {
		return Report{}, errors.New("simulate: empty trace")
	}
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	n := len(trace.Regions)
	if cfg.Rebalancer == (rebalancer.Config{}) {
		cfg.Rebalancer = rebalancer.DefaultConfig(n)
	}
	if err := cfg.Rebalancer.Validate(n); err != nil {
		return Report{}, fmt.Errorf("simulate: %w", err)
	}
	initial, err := policy.initial(n)
	if err != nil {
		return Report{}, fmt.Errorf("simulate: %w", err)
	}
	r := newRun(trace, policy, cfg, initial)
	for j := range trace.Tenants {
		if err := r.tenant(j); err != nil {
			return Report{}, fmt.Errorf("simulate %s on tenant %s: %w", policy, trace.Tenants[j], err)
		}
	}
	return r.report(), nil
}

type run struct {
	tr      *Trace
	policy  Policy
	cfg     Config
	initial []float64
	T, n    int
	live    [][]bool // [region][second]: the region served at that second
	limit   regions.Limit
	sec     struct{ interval, check, short, lag, apply, ttl int }

	// totals over tenants
	admitted, offered, bound, over, unnecessary float64
	regionOffered, regionUnnecessary            []float64
	worstMinuteOver                             float64
	writes                                      int
	tenantOffered, tenantUnnecessary            [][]float64 // [tenant][second]
}

func newRun(tr *Trace, p Policy, cfg Config, initial []float64) *run {
	T, n := tr.Seconds(), len(tr.Regions)
	r := &run{tr: tr, policy: p, cfg: cfg, initial: initial, T: T, n: n,
		limit:             regions.Limit{Capacity: cfg.Capacity, RefillPerSecond: cfg.Refill},
		regionOffered:     make([]float64, n),
		regionUnnecessary: make([]float64, n),
		tenantOffered:     make([][]float64, len(tr.Tenants)),
		tenantUnnecessary: make([][]float64, len(tr.Tenants)),
	}
	s := func(d time.Duration) int { return int(d / time.Second) }
	r.sec.interval, r.sec.check, r.sec.short = s(cfg.Interval), s(cfg.CheckInterval), s(cfg.ShortWindow)
	r.sec.lag, r.sec.apply, r.sec.ttl = s(cfg.ScrapeLag), s(cfg.ApplyDelay), s(cfg.HeartbeatTTL)
	r.live = make([][]bool, n)
	for i := range r.live {
		r.live[i] = make([]bool, T)
	}
	r.eachPoint(func(p point, from, to int) {
		for _, row := range p.rows {
			for t := from; t < to; t++ {
				r.live[row.region][t] = true
			}
		}
	})
	return r
}

// eachPoint calls fn for every time point with the seconds [from, to) it covers.
func (r *run) eachPoint(fn func(p point, from, to int)) {
	pts := r.tr.points
	for k, p := range pts {
		to := r.T
		if k+1 < len(pts) {
			to = pts[k+1].t
		}
		fn(p, p.t, to)
	}
}

// tenantRun is one tenant's simulation: its buckets, counters and policy state.
type tenantRun struct {
	*run
	j          int
	offered    [][]float64 // [region][second]
	cumA, cumT [][]float64 // [region][second]: counters before that second
	enforced   []float64   // shares the buckets use
	written    []float64   // shares last written
	pending    []pending
	tokens     []float64
	capacity   []float64
	refill     []float64
	state      rebalancer.State
	second     map[string]float64 // the increases of a plan, due at secondAt
	secondAt   int
}

type pending struct {
	share float64
	at    int
	ok    bool
}

func (r *run) tenant(j int) error {
	n, T := r.n, r.T
	tr := &tenantRun{run: r, j: j,
		offered: make([][]float64, n), cumA: make([][]float64, n), cumT: make([][]float64, n),
		enforced: make([]float64, n), written: append([]float64(nil), r.initial...),
		pending: make([]pending, n), tokens: make([]float64, n),
		capacity: make([]float64, n), refill: make([]float64, n), secondAt: -1,
	}
	for i := range n {
		tr.offered[i] = make([]float64, T)
		tr.cumA[i] = make([]float64, T+1)
		tr.cumT[i] = make([]float64, T+1)
		tr.setShare(i, r.initial[i])
		tr.tokens[i] = tr.capacity[i]
	}
	r.eachPoint(func(p point, from, to int) {
		for _, row := range p.rows {
			if row.tenant == j {
				for t := from; t < to; t++ {
					tr.offered[row.region][t] = row.offered
				}
			}
		}
	})
	m := newMeter(r, j)
	adm, rej := make([]float64, n), make([]float64, n)
	for t := range T {
		for i, p := range tr.pending {
			if p.ok && p.at <= t {
				tr.setShare(i, p.share)
				tr.pending[i].ok = false
			}
		}
		if t == tr.secondAt {
			tr.write(t, tr.second)
			tr.second, tr.secondAt = nil, -1
		}
		if t > 0 && t%r.sec.check == 0 && tr.secondAt < 0 {
			if err := tr.tick(t, t%r.sec.interval == 0); err != nil {
				return fmt.Errorf("at %d s: %w", t, err)
			}
		}
		for i := range n {
			adm[i], rej[i] = 0, 0
			tr.tokens[i] = math.Min(tr.capacity[i], tr.tokens[i]+tr.refill[i])
			if r.live[i][t] {
				o := tr.offered[i][t]
				adm[i] = math.Min(o, tr.tokens[i])
				rej[i] = o - adm[i]
				tr.tokens[i] -= adm[i]
			}
			tr.cumA[i][t+1] = tr.cumA[i][t] + adm[i]
			tr.cumT[i][t+1] = tr.cumT[i][t] + rej[i]
		}
		m.second(t, adm, rej)
	}
	m.finish()
	return nil
}

func (tr *tenantRun) setShare(i int, share float64) {
	l := regions.Scale(tr.cfg.Capacity, tr.cfg.Refill, share)
	tr.enforced[i] = share
	tr.capacity[i] = float64(l.Capacity)
	tr.refill[i] = l.RefillPerSecond
	tr.tokens[i] = math.Min(tr.tokens[i], tr.capacity[i])
}

// write records shares written at t: a region's gateways load an increase at t+1 and a
// decrease at t+ApplyDelay (the worst order); a later write supersedes a pending one.
func (tr *tenantRun) write(t int, shares map[string]float64) {
	for i, region := range tr.tr.Regions {
		s, ok := shares[region]
		if !ok {
			continue
		}
		tr.written[i] = s
		at := t + tr.sec.apply
		if s >= tr.enforced[i] {
			at = t + 1
		}
		tr.pending[i] = pending{share: s, at: at, ok: true}
	}
}

func (tr *tenantRun) tick(t int, full bool) error {
	switch tr.policy.kind {
	case Waterfill:
		return tr.waterfill(t, full)
	case ProportionalOffered, ProportionalAllowed:
		if full {
			tr.proportional(t)
		}
	}
	return nil
}

func (tr *tenantRun) waterfill(t int, full bool) error {
	in := make([]rebalancer.RegionInput, tr.n)
	e := t - tr.sec.lag
	for i, region := range tr.tr.Regions {
		live := false
		for s := max(0, t-tr.sec.ttl); s < t; s++ {
			live = live || tr.live[i][s]
		}
		fresh := e >= 1 && tr.live[i][e-1]
		long, okL := tr.rate(i, e, tr.sec.interval)
		short, okS := tr.rate(i, e, tr.sec.short)
		in[i] = rebalancer.RegionInput{
			Region: region,
			Status: rebalancer.RegionStatus(live, fresh && okL && okS),
			Long:   long, Short: short,
			Share: tr.written[i],
		}
	}
	tick := rebalancer.CheckTick
	if full {
		tick = rebalancer.FullRun
	}
	d, err := rebalancer.Decide(tr.cfg.Rebalancer, tr.limit, epoch.Add(time.Duration(t)*time.Second), in, tr.state, tick)
	if err != nil {
		return err
	}
	tr.state = d.Allocation.State
	if !d.Write {
		return nil
	}
	tr.writes++
	if len(d.First) == 0 {
		tr.write(t, d.Second)
		return nil
	}
	tr.write(t, d.First)
	tr.second, tr.secondAt = d.Second, t+tr.sec.apply
	return nil
}

// proportional is the naive baseline: shares in proportion to the interval's offered
// (or allowed) rate, from whatever samples the window holds, a region without samples
// read as zero; written in one step.
func (tr *tenantRun) proportional(t int) {
	v := make([]float64, tr.n)
	sum := 0.0
	for i := range v {
		rt, ok := tr.rate(i, t-tr.sec.lag, tr.sec.interval)
		if !ok {
			continue
		}
		v[i] = rt.Allowed
		if tr.policy.kind == ProportionalOffered {
			v[i] = rt.Offered()
		}
		sum += v[i]
	}
	if sum <= 0 {
		return
	}
	shares := make(map[string]float64, tr.n)
	moved := 0.0
	for i, region := range tr.tr.Regions {
		shares[region] = v[i] / sum
		moved = math.Max(moved, math.Abs(v[i]/sum-tr.written[i]))
	}
	if moved >= 0.001 {
		tr.writes++
		tr.write(t, shares)
	}
}

// rate is region i's counters' rate over the samples in [e-w, e], as a scrape sees
// them: a sample at second s exists when the region served at s-1. ok is false with
// fewer than two samples in the window.
func (tr *tenantRun) rate(i, e, w int) (rebalancer.Rates, bool) {
	if e < 1 {
		return rebalancer.Rates{}, false
	}
	last := -1
	for s := e; s >= max(1, e-w); s-- {
		if tr.live[i][s-1] {
			last = s
			break
		}
	}
	first := -1
	for s := max(1, e-w); s <= e; s++ {
		if tr.live[i][s-1] {
			first = s
			break
		}
	}
	if last < 0 || first >= last {
		return rebalancer.Rates{}, false
	}
	dt := float64(last - first)
	return rebalancer.Rates{
		Allowed:   (tr.cumA[i][last] - tr.cumA[i][first]) / dt,
		Throttled: (tr.cumT[i][last] - tr.cumT[i][first]) / dt,
	}, true
}
