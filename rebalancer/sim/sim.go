package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
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
	ownConfig := cfg.Rebalancer != (rebalancer.Config{})
	if !ownConfig {
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
	r.ownConfig = ownConfig
	untracked := map[string]bool{}
	for _, u := range trace.Untracked {
		untracked[u] = true
	}
	var global []int
	for j, tn := range trace.Tenants {
		if untracked[tn] {
			global = append(global, j)
			continue
		}
		if err := r.group([]int{j}, false); err != nil {
			return Report{}, fmt.Errorf("simulate %s on tenant %s: %w", policy, tn, err)
		}
	}
	if len(global) > 0 {
		if err := r.group(global, true); err != nil {
			return Report{}, fmt.Errorf("simulate %s on the untracked tenants (*): %w", policy, err)
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
	// exists [region][second]: the region is part of the deployment (RegionChanges).
	exists [][]bool
	// ownConfig: cfg.Rebalancer was given; else it is DefaultConfig of the regions that
	// exist at each tick.
	ownConfig bool
	// tenantRegions and globalMax feed Report.TenantRegions and Report.GlobalMaxShare.
	tenantRegions []TenantRegion
	globalMax     map[string]float64
	limit         regions.Limit
	sec           struct{ interval, check, short, lag, apply, ttl int }

	// totals over tenants
	admitted, offered, bound, over, unnecessary float64
	regionOffered, regionUnnecessary            []float64
	worstMinuteOver                             float64
	writes                                      int
	tenantOffered, tenantUnnecessary            [][]float64 // [tenant][second]
}

func newRun(tr *Trace, p Policy, cfg Config, initial []float64) *run {
	T, n := tr.Seconds(), len(tr.Regions)
	r := &run{tr: tr, policy: p, cfg: cfg, initial: slices.Clone(initial), T: T, n: n,
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
	r.exists = make([][]bool, n)
	idx := map[string]int{}
	for i, name := range tr.Regions {
		idx[name] = i
		r.live[i] = make([]bool, T)
		r.exists[i] = make([]bool, T)
		present := true
		for _, c := range tr.RegionChanges {
			if c.Region == name {
				present = !c.Added // the first change says what it was before
				break
			}
		}
		for t := range T {
			for _, c := range tr.RegionChanges {
				if c.Region == name && c.At == t {
					present = c.Added
				}
			}
			r.exists[i][t] = present
		}
	}
	r.eachPoint(func(p point, from, to int) {
		for _, row := range p.rows {
			for t := from; t < to; t++ {
				r.live[row.region][t] = r.exists[row.region][t]
			}
		}
	})
	// Regions absent at 0 start with no share; the others split the initial shares.
	sum := 0.0
	for i := range r.initial {
		if !r.exists[i][0] {
			r.initial[i] = 0
		}
		sum += r.initial[i]
	}
	for i := range r.initial {
		if sum > 0 && r.exists[i][0] {
			r.initial[i] /= sum
		}
	}
	return r
}

// regionConfig is the allocation tuning for the regions that exist at t.
func (r *run) regionConfig(t int) rebalancer.Config {
	if r.ownConfig {
		return r.cfg.Rebalancer
	}
	n := 0
	for i := range r.exists {
		if r.exists[i][t] {
			n++
		}
	}
	return rebalancer.DefaultConfig(max(n, 1))
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

// tenantRun is one scope's simulation: a tenant with its own scope, or every untracked
// tenant under "*" (global); its members' buckets, the scope's summed counters and its
// policy state.
type tenantRun struct {
	*run
	members    []int
	global     bool
	offered    [][][]float64 // [member][region][second]
	cumA, cumT [][]float64   // [region][second]: the scope's counters before that second
	enforced   []float64     // shares the buckets use
	written    []float64     // shares last written
	pending    []pending
	tokens     [][]float64 // [member][region]
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

func (r *run) group(members []int, global bool) error {
	n, T := r.n, r.T
	tr := &tenantRun{run: r, members: members, global: global,
		offered: make([][][]float64, len(members)), cumA: make([][]float64, n), cumT: make([][]float64, n),
		enforced: make([]float64, n), written: append([]float64(nil), r.initial...),
		pending: make([]pending, n), tokens: make([][]float64, len(members)),
		capacity: make([]float64, n), refill: make([]float64, n), secondAt: -1,
	}
	for k := range members {
		tr.offered[k] = make([][]float64, n)
		tr.tokens[k] = make([]float64, n)
		for i := range n {
			tr.offered[k][i] = make([]float64, T)
		}
	}
	for i := range n {
		tr.cumA[i] = make([]float64, T+1)
		tr.cumT[i] = make([]float64, T+1)
		tr.setShare(i, r.initial[i])
		for k := range members {
			tr.tokens[k][i] = tr.capacity[i]
		}
	}
	member := map[int]int{}
	for k, j := range members {
		member[j] = k
	}
	r.eachPoint(func(p point, from, to int) {
		for _, row := range p.rows {
			if k, ok := member[row.tenant]; ok {
				for t := from; t < to; t++ {
					tr.offered[k][row.region][t] = row.offered
				}
			}
		}
	})
	meters := make([]*meter, len(members))
	for k, j := range members {
		meters[k] = newMeter(r, j)
	}
	// Per member and region: offered, admitted and what the equal split admits.
	type tally struct{ offered, admitted, equal float64 }
	tallies := make([][]tally, len(members))
	for k := range tallies {
		tallies[k] = make([]tally, n)
	}
	if global {
		r.globalMax = map[string]float64{}
	}
	adm, rej := make([]float64, n), make([]float64, n)
	sumA, sumT := make([]float64, n), make([]float64, n)
	for t := range T {
		tr.regionChanges(t)
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
		clear(sumA)
		clear(sumT)
		nExist := 0
		for i := range n {
			if r.exists[i][t] {
				nExist++
			}
		}
		if global {
			for i, region := range r.tr.Regions {
				r.globalMax[region] = math.Max(r.globalMax[region], tr.written[i])
			}
		}
		for k := range members {
			for i := range n {
				adm[i], rej[i] = 0, 0
				tr.tokens[k][i] = math.Min(tr.capacity[i], tr.tokens[k][i]+tr.refill[i])
				if r.live[i][t] {
					o := tr.offered[k][i][t]
					adm[i] = math.Min(o, tr.tokens[k][i])
					rej[i] = o - adm[i]
					tr.tokens[k][i] -= adm[i]
				}
				sumA[i] += adm[i]
				sumT[i] += rej[i]
				if o := adm[i] + rej[i]; o > 0 {
					tallies[k][i].offered += o
					tallies[k][i].admitted += adm[i]
					tallies[k][i].equal += math.Min(o, r.cfg.Refill/float64(max(nExist, 1)))
				}
			}
			meters[k].second(t, adm, rej)
		}
		for i := range n {
			tr.cumA[i][t+1] = tr.cumA[i][t] + sumA[i]
			tr.cumT[i][t+1] = tr.cumT[i][t] + sumT[i]
		}
	}
	for _, m := range meters {
		m.finish()
	}
	for k, j := range members {
		for i, region := range r.tr.Regions {
			if tl := tallies[k][i]; tl.offered > 0 {
				r.tenantRegions = append(r.tenantRegions, TenantRegion{Tenant: r.tr.Tenants[j], Region: region,
					Offered: tl.offered, Admitted: tl.admitted, EqualSplit: tl.equal})
			}
		}
	}
	return nil
}

// regionChanges applies a region added or removed at t to the scope's shares at once,
// as the store does in one transaction (store.AddRegion, store.RemoveRegion): a region
// added starts at the floor (the others scaled to the rest); a removed one's share goes
// to the others in proportion. Static shares are never rescaled.
func (tr *tenantRun) regionChanges(t int) {
	if tr.policy.kind == Static {
		return
	}
	for _, c := range tr.tr.RegionChanges {
		if c.At != t || t == 0 {
			continue
		}
		ci := slices.Index(tr.tr.Regions, c.Region)
		next := slices.Clone(tr.written)
		rest := 0.0
		for i := range next {
			if i != ci {
				rest += next[i]
			}
		}
		nExist := 0
		for i := range tr.exists {
			if tr.exists[i][t] {
				nExist++
			}
		}
		f := 0.0
		if c.Added {
			f = 1.0
			if nExist > 1 {
				f = math.Min(0.05, 0.5/float64(nExist))
			}
		}
		for i := range next {
			switch {
			case i == ci:
				next[i] = f
			case rest > 0:
				next[i] = next[i] / rest * (1 - f)
			}
		}
		for i := range next {
			tr.written[i] = next[i]
			tr.pending[i].ok = false
			tr.setShare(i, next[i])
		}
	}
}

func (tr *tenantRun) setShare(i int, share float64) {
	l := regions.Scale(tr.cfg.Capacity, tr.cfg.Refill, share)
	tr.enforced[i] = share
	tr.capacity[i] = float64(l.Capacity)
	tr.refill[i] = l.RefillPerSecond
	for k := range tr.tokens {
		tr.tokens[k][i] = math.Min(tr.tokens[k][i], tr.capacity[i])
	}
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
	in := make([]rebalancer.RegionInput, 0, tr.n)
	e := t - tr.sec.lag
	for i, region := range tr.tr.Regions {
		if !tr.exists[i][t] {
			continue
		}
		live := false
		for s := max(0, t-tr.sec.ttl); s < t; s++ {
			live = live || tr.live[i][s]
		}
		fresh := e >= 1 && tr.live[i][e-1]
		long, okL := tr.rate(i, e, tr.sec.interval)
		short, okS := tr.rate(i, e, tr.sec.short)
		in = append(in, rebalancer.RegionInput{
			Region: region,
			Status: rebalancer.RegionStatus(live, fresh && okL && okS),
			Long:   long, Short: short,
			Share: tr.written[i],
		})
	}
	if len(in) == 0 {
		return nil // no region exists now
	}
	tick := rebalancer.CheckTick
	if full {
		tick = rebalancer.FullRun
	}
	cfg, limit, st := tr.regionConfig(t), tr.limit, tr.state
	if tr.global {
		// "*" as the job splits it (rebalancer/job): in proportion to the untracked
		// tenants' demand, R their total, no headroom or peak; below the minimum demand
		// of one tenant's refill, or with none, the ok regions keep their shares.
		cfg.Headroom, st = 0, withoutPeaks(st)
		total := 0.0
		for _, ri := range in {
			if ri.Status == rebalancer.StatusOK {
				total += ri.Short.Offered()
			}
		}
		if total > 0 && !rebalancer.Quiet(cfg, limit.RefillPerSecond, in) {
			limit.RefillPerSecond = total
		}
	}
	d, err := rebalancer.Decide(cfg, limit, epoch.Add(time.Duration(t)*time.Second), in, st, tick)
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

// withoutPeaks is st with every peak at 0 ("*" has no peak reserve).
func withoutPeaks(st rebalancer.State) rebalancer.State {
	out := rebalancer.State{At: st.At, Regions: make(map[string]rebalancer.RegionState, len(st.Regions))}
	for r, rs := range st.Regions {
		rs.Peak = 0
		out.Regions[r] = rs
	}
	return out
}

// proportional is the naive baseline: shares in proportion to the interval's offered
// (or allowed) rate, from whatever samples the window holds, a region without samples
// read as zero; written in one step.
func (tr *tenantRun) proportional(t int) {
	v := make([]float64, tr.n)
	sum := 0.0
	for i := range v {
		if !tr.exists[i][t] {
			continue
		}
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
