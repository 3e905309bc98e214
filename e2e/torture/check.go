package torture

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// State is a tenant's regional limit as observed: what the region's rule scaled by its
// share was from From on (regions.Scale: capacity max(1, round(C·s)), refill R·s).
// C, R, S and Shards are what it came from, for the report.
type State struct {
	From     time.Time
	Capacity float64 // C·s as the gateways enforce it (regions.Scale)
	Refill   float64 // R·s per second
	C        int64
	R, S     float64
	Shards   int
}

// Admission is one admitted request: when the client sent it and when the answer came,
// and the tokens it took (0 counts as 1). The gateway decided it somewhere in between.
type Admission struct {
	Sent, Recv time.Time
	Cost       int
	// Gateway is the id of the gateway that answered (the calendar-quota check follows
	// a fallback's admissions to the gateway that owes them).
	Gateway string
}

// Tokens is what a counts for: its cost, at least 1.
func (a Admission) Tokens() int { return max(a.Cost, 1) }

// Span is a stretch of time, [From, To].
type Span struct{ From, To time.Time }

func (s Span) overlaps(from, to time.Time) bool { return !s.To.Before(from) && !s.From.After(to) }

// GatewayRun is what one gateway did in a run that the bound's fallback terms depend on.
type GatewayRun struct {
	ID, Region string
	// Lives are its processes, in order: a restart ends one and starts another.
	Lives []Life
	// Open are the spans in which its breaker was open or half-open (decisions from its
	// fallback), from its own log (ParseBreakerLog); a span still open when the
	// process stopped ends at the stop.
	Open []Span
}

// Life is one gateway process: from its start to its stop, or to the end of the run.
type Life struct {
	Span
	// Stopped: the process was stopped (or killed) at To; otherwise it still ran at the
	// end of the run.
	Stopped bool
	// Owing: at its stop it still owed fallback debts, by its own metrics.
	Owing bool
}

// Input is everything Check needs. States and Admitted are per tenant, then region.
type Input struct {
	// Lag is how long a state may still be enforced after the next one was observed:
	// one reload of the gateways plus the observation's own interval. A gateway's
	// instance count (the fallback's N) lags the fleet by as much.
	Lag time.Duration
	// States are the observed limits in order of From; the first one holds from the
	// start of the run.
	States map[string]map[string][]State
	// Admitted are the admitted requests.
	Admitted map[string]map[string][]Admission
	// RedisRestarts are, per region, the spans in which its Redis came back empty.
	RedisRestarts map[string][]Span
	// RedisKills are, per region, the spans from a kill of its Redis to the end of its
	// restart (empty): what the region counted before and has not reported is lost.
	RedisKills map[string][]Span
	// Outages are the spans in which PostgreSQL was down: a gateway cannot reload then,
	// so a state replaced shortly before one may be enforced until one lag after it.
	Outages []Span
	// Gateways are the region's gateways over the run: their lives and breaker spans.
	Gateways []GatewayRun
	// Expected is the gateways' expected_instances, the floor of the fallback's N.
	Expected int
	// Quotas are the calendar-quota bands to check (CheckQuotas), QuotaSync the
	// gateways' quota_sync_interval (I) and QuotaMargin the most one sync step takes on
	// top of it (M): a count is at most S = 2·(I + M) old.
	Quotas                 []Quota
	QuotaSync, QuotaMargin time.Duration
}

// Window is one checked window and its bound.
type Window struct {
	Tenant, Region string // Region "" is the sum over the regions
	From, To       time.Time
	Admitted       int
	Bound          float64
	// The bound's terms (docs/reliability.md, "The slack, term by term"): the capacity
	// in force at From (the largest one possibly enforced then), the refill over the
	// window (at each moment the largest refill possibly enforced), one regional
	// capacity per Redis restart inside the window, the fallback's one-token floor (N -
	// capacity, while some gateway of the region had its breaker open in the window),
	// the overlap of a cut gateway's fallback with the others' Redis answers (R·s/N per
	// second of a breaker-open span while another gateway of the region was closed), and
	// the debts lost with gateways stopped while open or owing (R·s/N per second of
	// their last open span).
	CapTerm, RefillTerm, RestartTerm, FloorTerm, OverlapTerm, LostDebtTerm float64
}

// Ratio is admitted over the bound.
func (w Window) Ratio() float64 {
	if w.Bound <= 0 {
		if w.Admitted == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return float64(w.Admitted) / w.Bound
}

// Breach reports whether more was admitted than the bound allows. There is no tolerance
// on top: the bound is the documented invariant.
func (w Window) Breach() bool { return float64(w.Admitted) > w.Bound+1e-9 }

func (w Window) String() string {
	region := w.Region
	if region == "" {
		region = "all regions"
	}
	return fmt.Sprintf("%s in %s from %s over %.3fs: admitted %d, bound %.2f (capacity %.2f + refill %.2f + restarts %.2f + floor %.2f + overlap %.2f + lost debt %.2f) = %.3fx",
		w.Tenant, region, w.From.Format("15:04:05.000"), w.To.Sub(w.From).Seconds(), w.Admitted, w.Bound, w.CapTerm, w.RefillTerm, w.RestartTerm, w.FloorTerm, w.OverlapTerm, w.LostDebtTerm, w.Ratio())
}

// Result is the worst window per tenant and region ("" for all regions), and the worst
// overall.
type Result struct {
	Worst    []Window
	MaxRatio float64
	// Quotas are the calendar-quota periods checked (CheckQuotas).
	Quotas []QuotaPeriod
}

// Breaches are the worst windows that broke the bound.
func (r Result) Breaches() []Window {
	var out []Window
	for _, w := range r.Worst {
		if w.Breach() {
			out = append(out, w)
		}
	}
	return out
}

// QuotaBreaches are the quota periods whose fleet total broke the bound.
func (r Result) QuotaBreaches() []QuotaPeriod {
	var out []QuotaPeriod
	for _, q := range r.Quotas {
		if q.Breach() {
			out = append(out, q)
		}
	}
	return out
}

// step is a right-continuous step function of time: v[i] on [at[i], at[i+1]), v[0]
// before at[0] is 0 (no value), v[len-1] from the last point on.
type step struct {
	at []time.Time
	v  []float64
}

// value is the function at t.
func (f step) value(t time.Time) float64 {
	k := sort.Search(len(f.at), func(i int) bool { return f.at[i].After(t) }) - 1
	if k < 0 {
		return 0
	}
	return f.v[k]
}

// region is what the fallback terms know of one region: its gateways' breaker spans and
// how many gateways ran.
type region struct {
	runs     []GatewayRun
	expected int
	// running counts the region's gateways alive; fewest is the fewest alive at any
	// moment of the last lag (a gateway's own count of live instances lags the fleet by
	// a reload); overlapping counts the gateways whose breaker was open while some other
	// gateway of the region ran with its breaker closed.
	running, fewest, overlapping step
	// open are every gateway's breaker-open spans by From, and openTo the latest To of
	// open[:i+1], to find one that meets a window in log time.
	open   []Span
	openTo []time.Time
	// lost are the spans whose fallback admissions may never be charged to Redis: the
	// last open span of a process that was stopped while open or while it owed.
	lost []Span
}

// n is the fallback's divisor N at t: the fewest gateways alive in the last lag, never
// below the gateways' expected_instances (nor 1).
func (rg *region) n(t time.Time) float64 { return max(rg.fewest.value(t), float64(rg.expected), 1) }

// anyOpen reports whether some gateway's breaker was open at some moment of [t0, t1].
func (rg *region) anyOpen(t0, t1 time.Time) bool {
	k := sort.Search(len(rg.open), func(i int) bool { return rg.open[i].From.After(t1) }) - 1
	return k >= 0 && !rg.openTo[k].Before(t0)
}

func newRegion(runs []GatewayRun, lag time.Duration, expected int) *region {
	rg := &region{runs: runs, expected: expected}
	var pts []time.Time
	for _, g := range runs {
		for _, l := range g.Lives {
			pts = append(pts, l.From, l.To)
		}
		for _, o := range g.Open {
			pts = append(pts, o.From, o.To)
			rg.open = append(rg.open, o)
		}
		for _, l := range g.Lives {
			if !l.Stopped {
				continue
			}
			last := -1
			for i, o := range g.Open {
				if !o.From.Before(l.From) && !o.To.After(l.To) {
					last = i
				}
			}
			if last >= 0 && (g.Open[last].To.Equal(l.To) || l.Owing) {
				rg.lost = append(rg.lost, g.Open[last])
			}
		}
	}
	sort.Slice(rg.open, func(i, j int) bool { return rg.open[i].From.Before(rg.open[j].From) })
	for i, o := range rg.open {
		to := o.To
		if i > 0 && rg.openTo[i-1].After(to) {
			to = rg.openTo[i-1]
		}
		rg.openTo = append(rg.openTo, to)
	}
	pts = sortedTimes(pts)
	alive := func(t time.Time) (running, open, closed int) {
		for _, g := range runs {
			in := false
			for _, l := range g.Lives {
				in = in || (!t.Before(l.From) && t.Before(l.To))
			}
			if !in {
				continue
			}
			running++
			isOpen := false
			for _, o := range g.Open {
				isOpen = isOpen || (!t.Before(o.From) && t.Before(o.To))
			}
			if isOpen {
				open++
			} else {
				closed++
			}
		}
		return running, open, closed
	}
	for _, t := range pts {
		n, open, closed := alive(t)
		rg.running.at, rg.running.v = append(rg.running.at, t), append(rg.running.v, float64(n))
		if closed == 0 {
			open = 0 // every gateway alive is open: none gets Redis answers meanwhile
		}
		rg.overlapping.at, rg.overlapping.v = append(rg.overlapping.at, t), append(rg.overlapping.v, float64(open))
	}
	// The minimum of running over [t - lag, t] changes only at a point of running or one
	// lag after it.
	var fpts []time.Time
	for _, t := range pts {
		fpts = append(fpts, t, t.Add(lag))
	}
	fpts = sortedTimes(fpts)
	for _, t := range fpts {
		n := rg.running.value(t.Add(-lag))
		lo := sort.Search(len(rg.running.at), func(i int) bool { return rg.running.at[i].After(t.Add(-lag)) })
		for i := lo; i < len(rg.running.at) && !rg.running.at[i].After(t); i++ {
			n = min(n, rg.running.v[i])
		}
		rg.fewest.at, rg.fewest.v = append(rg.fewest.at, t), append(rg.fewest.v, n)
	}
	return rg
}

func sortedTimes(ts []time.Time) []time.Time {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	out := ts[:0]
	for i, t := range ts {
		if i == 0 || !t.Equal(out[len(out)-1]) {
			out = append(out, t)
		}
	}
	return out
}

// series is one tenant's limit in one region over time, with the lag applied: state i
// may be enforced in [From_i, From_{i+1} + lag).
type series struct {
	states   []State
	lag      time.Duration
	bps      []time.Time // refill breakpoints, sorted
	rate     []float64   // refill on [bps[k], bps[k+1])
	integral []float64   // ∫ refill from bps[0] to bps[k]
	restarts []Span
	outages  []Span
	// starts are the times from which the region's buckets may be new: the start of the
	// series, and each removal of the region (a state of capacity 0), after which it
	// comes back like a region added for the first time. first[k] is when the first
	// admission at or after starts[k] was answered (zero: none).
	starts, first []time.Time
	// restartCap is, per restart, the largest capacity possibly enforced during it.
	restartCap []float64

	rg *region
	// share is ∫ refill(t) / N(t) dt over [spts[k], spts[k+1]) summed up to spts[k]:
	// one gateway's fallback refill share; overlap the same times the number of gateways
	// overlapping.
	spts           []time.Time
	share, overlap []float64
	shareRate      []float64 // refill / N on [spts[k], spts[k+1])
	overlapRate    []float64
	// lostTerm is, per lost span of the region, the refill share over it.
	lostTerm []float64
	// floorPts are the points where the floor's N or capacity may change, and floorAt
	// the floor at one moment; nil when no capacity is ever below the gateways alive.
	floorPts []time.Time
	floorAt  func(time.Time) float64
}

func newSeries(states []State, lag time.Duration, restarts, outages []Span, rg *region) *series {
	s := &series{states: states, lag: lag, restarts: restarts, outages: outages, rg: rg}
	if len(states) == 0 {
		return s
	}
	for _, r := range restarts {
		c := s.maxAt(r.To, func(st State) float64 { return st.Capacity })
		for t := r.From; t.Before(r.To); t = t.Add(10 * time.Millisecond) {
			c = max(c, s.maxAt(t, func(st State) float64 { return st.Capacity }))
		}
		s.restartCap = append(s.restartCap, c)
	}
	seen := map[time.Time]bool{}
	for i, st := range states {
		for _, t := range []time.Time{st.From, s.end(i)} {
			if !t.IsZero() && !seen[t] {
				seen[t] = true
				s.bps = append(s.bps, t)
			}
		}
	}
	sort.Slice(s.bps, func(i, j int) bool { return s.bps[i].Before(s.bps[j]) })
	s.rate = make([]float64, len(s.bps))
	s.integral = make([]float64, len(s.bps))
	for k, t := range s.bps {
		s.rate[k] = s.maxAt(t, func(st State) float64 { return st.Refill })
		if k > 0 {
			s.integral[k] = s.integral[k-1] + s.rate[k-1]*s.bps[k].Sub(s.bps[k-1]).Seconds()
		}
	}
	// The fallback terms: a gateway's refill share R·s/N, integrated.
	pts := append(append(append([]time.Time(nil), s.bps...), rg.fewest.at...), rg.overlapping.at...)
	s.spts = sortedTimes(pts)
	s.share = make([]float64, len(s.spts))
	s.overlap = make([]float64, len(s.spts))
	s.shareRate = make([]float64, len(s.spts))
	s.overlapRate = make([]float64, len(s.spts))
	for k, t := range s.spts {
		s.shareRate[k] = s.refillAt(t) / rg.n(t)
		s.overlapRate[k] = s.shareRate[k] * rg.overlapping.value(t)
		if k > 0 {
			d := s.spts[k].Sub(s.spts[k-1]).Seconds()
			s.share[k] = s.share[k-1] + s.shareRate[k-1]*d
			s.overlap[k] = s.overlap[k-1] + s.overlapRate[k-1]*d
		}
	}
	for _, l := range rg.lost {
		s.lostTerm = append(s.lostTerm, s.cumulative(l.To, s.share, s.shareRate)-s.cumulative(l.From, s.share, s.shareRate))
	}
	most := 0.0
	for _, v := range rg.running.v {
		most = max(most, v)
	}
	for _, st := range states {
		if st.Capacity < most {
			s.floorPts = sortedTimes(append(append([]time.Time(nil), s.bps...), rg.running.at...))
			s.floorAt = func(t time.Time) float64 {
				return s.maxAt(t, func(st State) float64 { return max(0, rg.running.value(t)-st.Capacity) })
			}
			break
		}
	}
	return s
}

// refillAt is the largest refill possibly enforced at t (the first state's before the
// first breakpoint).
func (s *series) refillAt(t time.Time) float64 {
	if len(s.bps) == 0 {
		return 0
	}
	if t.Before(s.bps[0]) {
		return s.states[0].Refill
	}
	k := sort.Search(len(s.bps), func(i int) bool { return s.bps[i].After(t) }) - 1
	return s.rate[k]
}

// cumulative evaluates an integral kept at s.spts (cum) with its rates at t.
func (s *series) cumulative(t time.Time, cum, rate []float64) float64 {
	if len(s.spts) == 0 || t.Before(s.spts[0]) {
		return 0 // nothing is open before the first point
	}
	k := sort.Search(len(s.spts), func(i int) bool { return s.spts[i].After(t) }) - 1
	return cum[k] + rate[k]*t.Sub(s.spts[k]).Seconds()
}

// end is when state i stops being possibly enforced (zero: never): one lag after the
// next state may have been written, or one lag after a PostgreSQL outage that began
// before that.
func (s *series) end(i int) time.Time {
	if i+1 >= len(s.states) {
		return time.Time{}
	}
	next := s.states[i+1].From
	e := next.Add(s.lag)
	for range len(s.outages) + 1 { // an extension may reach a later outage
		grown := false
		for _, o := range s.outages {
			if o.From.Before(e) && o.To.After(next) && o.To.Add(s.lag).After(e) {
				e, grown = o.To.Add(s.lag), true
			}
		}
		if !grown {
			break
		}
	}
	return e
}

// maxAt is the largest f over the states possibly enforced at t (the first state
// before its From).
func (s *series) maxAt(t time.Time, f func(State) float64) float64 {
	best := 0.0
	for i, st := range s.states {
		if (i == 0 || !t.Before(st.From)) && (s.end(i).IsZero() || t.Before(s.end(i))) {
			best = max(best, f(st))
		}
	}
	return best
}

// refillTo is ∫ refill from bps[0] (or t, if earlier) to t.
func (s *series) refillTo(t time.Time) float64 {
	if len(s.bps) == 0 {
		return 0
	}
	if t.Before(s.bps[0]) {
		return -s.states[0].Refill * s.bps[0].Sub(t).Seconds()
	}
	k := sort.Search(len(s.bps), func(i int) bool { return s.bps[i].After(t) }) - 1
	return s.integral[k] + s.rate[k]*t.Sub(s.bps[k]).Seconds()
}

// restartTerm is one capacity (the largest possibly enforced during the restart) per
// restart that overlaps (t0, t1].
func (s *series) restartTerm(t0, t1 time.Time) float64 {
	sum := 0.0
	for i, r := range s.restarts {
		if r.To.After(t0) && !r.From.After(t1) {
			sum += s.restartCap[i]
		}
	}
	return sum
}

// capTerm is the capacity the bucket may hold at t: the largest possibly enforced at t,
// or, before the first admission, the largest possibly enforced from t to it. A bucket
// does not exist before a call reaches Redis, and a rule first seen starts full (the
// documented rule of lua/prelude.lua), so a new bucket admits at its first call: before
// the first admission there was no bucket, and it was created full at a capacity in
// force by then. (A request the gateway refuses without asking Redis, a cost above the
// capacity, creates none.) A region removed and added back is new again: its buckets in
// Redis, left from before, refilled while it was out and are clipped to the capacity in
// force when it is back, so from the removal to the first admission after it the bucket
// may hold, like a new one, the largest capacity possibly enforced by then.
func (s *series) capTerm(t time.Time) float64 {
	c := s.maxAt(t, func(st State) float64 { return st.Capacity })
	for k, from := range s.starts {
		first := s.first[k]
		if first.IsZero() || t.Before(from) || !t.Before(first) {
			continue
		}
		c = max(c, s.maxAt(first, func(st State) float64 { return st.Capacity }))
		for _, b := range s.bps {
			if b.After(t) && b.Before(first) {
				c = max(c, s.maxAt(b, func(st State) float64 { return st.Capacity }))
			}
		}
	}
	return c
}

// admitted records the answer times of the series' admissions: the first at or after
// each of its starts.
func (s *series) admitted(adm []Admission) {
	s.starts = []time.Time{{}}
	for i, st := range s.states {
		if i > 0 && st.Capacity == 0 {
			s.starts = append(s.starts, st.From)
		}
	}
	s.first = make([]time.Time, len(s.starts))
	for _, a := range adm {
		for k, from := range s.starts {
			if !a.Recv.Before(from) && (s.first[k].IsZero() || a.Recv.Before(s.first[k])) {
				s.first[k] = a.Recv
			}
		}
	}
}

// overlapTerm is the fallback overlap over [t0, t1]: a gateway whose breaker is open
// decides from its fallback bucket, which starts empty and earns R·s/N, while another
// gateway of the region still gets Redis answers from the shared bucket; what it
// admits is owed and charged at its next answer, so the excess is its refill share over
// the part of its open span inside the window during which another gateway was closed.
func (s *series) overlapTerm(t0, t1 time.Time) float64 {
	return s.cumulative(t1, s.overlap, s.overlapRate) - s.cumulative(t0, s.overlap, s.overlapRate)
}

// lostDebtTerm is, for each gateway stopped while its breaker was open (or while it
// owed), its refill share over its last open span, when that span overlaps [t0, t1]:
// what its fallback admitted then is never charged to Redis, which hands it out again.
func (s *series) lostDebtTerm(t0, t1 time.Time) float64 {
	sum := 0.0
	for i, l := range s.rg.lost {
		if l.overlaps(t0, t1) {
			sum += s.lostTerm[i]
		}
	}
	return sum
}

// floorTerm is the fallback's one-token floor over [t0, t1]: while some gateway of the
// region had its breaker open in the window, N - capacity for the most gateways alive
// and the smallest capacity possibly enforced in the window, when positive. A fallback
// bucket holds max(1, floor(C·s/N)), so N gateways hold N tokens where the region has
// C·s < N.
func (s *series) floorTerm(t0, t1 time.Time) float64 {
	if s.floorAt == nil || !s.rg.anyOpen(t0, t1) {
		return 0
	}
	f := s.floorAt(t0)
	for k := sort.Search(len(s.floorPts), func(i int) bool { return s.floorPts[i].After(t0) }); k < len(s.floorPts) && !s.floorPts[k].After(t1); k++ {
		f = max(f, s.floorAt(s.floorPts[k]))
	}
	return f
}

// candidates are the window starts worth checking besides the admissions' send times:
// just before and at every point where the capacity term or a restart term changes.
func (s *series) candidates() []time.Time {
	var out []time.Time
	for _, t := range s.bps {
		out = append(out, t.Add(-time.Nanosecond), t)
	}
	for _, r := range s.restarts {
		out = append(out, r.From.Add(-time.Nanosecond), r.To)
	}
	return out
}

// Check computes, for every tenant, every region and the regions together, the window
// with the highest admitted/bound, over every window [t0, t1] where t0 is an admission's
// send time or a point where the bound's capacity or restart term changes, and t1 an
// admission's receive time. An admission counts in a window when it was sent and
// answered inside it, so it was certainly decided inside it: a count is never more than
// what the fleet admitted in the window. The bound of a window is the table of
// docs/reliability.md ("The slack, term by term"), nothing more:
//
//	max{ Cap_i : state i possibly enforced at t0 }            (the bucket at t0; before
//	                                                          the first request, up to it)
//	+ ∫_{t0}^{t1} max{ Refill_i : state i possibly enforced at t } dt
//	+ Σ over Redis restarts in (t0, t1] of the capacity then  (a bucket lost with Redis)
//	+ (N - Cap)+ while some gateway's breaker was open         (the one-token floor)
//	+ Σ_g ∫ over g's open spans ∩ [t0, t1] ∩ {another gateway closed} of Refill/N
//	                                                          (the fallback overlap)
//	+ Σ over gateways stopped open or owing, whose last open span meets [t0, t1],
//	  of ∫ over that span of Refill/N                         (the lost debt)
//
// and the regions' bounds add up for the regions together.
func Check(in Input) Result {
	var res Result
	byRegion := map[string][]GatewayRun{}
	for _, g := range in.Gateways {
		byRegion[g.Region] = append(byRegion[g.Region], g)
	}
	rgs := map[string]*region{}
	regionOf := func(name string) *region {
		if rgs[name] == nil {
			rgs[name] = newRegion(byRegion[name], in.Lag, in.Expected)
		}
		return rgs[name]
	}
	tenants := sortedKeys(in.Admitted)
	for _, tenant := range tenants {
		regionsOf := map[string]bool{}
		for r := range in.States[tenant] {
			regionsOf[r] = true
		}
		for r := range in.Admitted[tenant] {
			regionsOf[r] = true
		}
		var all []Admission
		var allSeries []*series
		for _, name := range sortedKeys(regionsOf) {
			s := newSeries(in.States[tenant][name], in.Lag, in.RedisRestarts[name], in.Outages, regionOf(name))
			adm := in.Admitted[tenant][name]
			s.admitted(adm)
			all = append(all, adm...)
			allSeries = append(allSeries, s)
			if w, ok := worstWindow(tenant, name, adm, []*series{s}); ok {
				res.Worst = append(res.Worst, w)
			}
		}
		if len(allSeries) > 1 {
			if w, ok := worstWindow(tenant, "", all, allSeries); ok {
				res.Worst = append(res.Worst, w)
			}
		}
	}
	for _, w := range res.Worst {
		res.MaxRatio = max(res.MaxRatio, w.Ratio())
	}
	res.Quotas = CheckQuotas(in)
	return res
}

func worstWindow(tenant, region string, adm []Admission, ss []*series) (Window, bool) {
	if len(adm) == 0 {
		return Window{}, false
	}
	byRecv := append([]Admission(nil), adm...)
	sort.Slice(byRecv, func(i, j int) bool { return byRecv[i].Recv.Before(byRecv[j].Recv) })
	starts := make([]time.Time, 0, len(adm))
	for _, a := range adm {
		starts = append(starts, a.Sent)
	}
	for _, s := range ss {
		starts = append(starts, s.candidates()...)
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	var worst Window
	found := false
	for i, t0 := range starts {
		if i > 0 && t0.Equal(starts[i-1]) {
			continue
		}
		capTerm, refill0 := 0.0, 0.0
		for _, s := range ss {
			capTerm += s.capTerm(t0)
			refill0 += s.refillTo(t0)
		}
		n := 0
		for _, a := range byRecv {
			if a.Sent.Before(t0) {
				continue
			}
			n += a.Tokens()
			w := Window{Tenant: tenant, Region: region, From: t0, To: a.Recv, Admitted: n, CapTerm: capTerm}
			for _, s := range ss {
				w.RefillTerm += s.refillTo(a.Recv)
				w.RestartTerm += s.restartTerm(t0, a.Recv)
				w.FloorTerm += s.floorTerm(t0, a.Recv)
				w.OverlapTerm += s.overlapTerm(t0, a.Recv)
				w.LostDebtTerm += s.lostDebtTerm(t0, a.Recv)
			}
			w.RefillTerm -= refill0
			w.Bound = w.CapTerm + w.RefillTerm + w.RestartTerm + w.FloorTerm + w.OverlapTerm + w.LostDebtTerm
			if !found || w.Ratio() > worst.Ratio() {
				worst, found = w, true
			}
		}
	}
	return worst, found
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
