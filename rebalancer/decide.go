package rebalancer

import (
	"math"
	"slices"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// Reasons for a Decision: why shares are written, or why not. A bounded set, fit for a
// metric label.
const (
	ReasonInterval   = "interval"   // the full run on the interval tick
	ReasonThrottling = "throttling" // fast path: an ok region throttles while the scope has spare refill
	ReasonDark       = "dark"       // fast path: a dark region holds more than the floor
	ReasonReturned   = "returned"   // fast path: a region that was dark is ok again
	ReasonNoTrigger  = "no_trigger" // a check tick with nothing to act on
	ReasonHysteresis = "hysteresis" // the change is too small to be worth a write
	ReasonNoDemand   = "no_demand"  // the ok regions offer less than Config.MinDemand: noise
)

// Trigger is why the fast path fires: a reason and the region behind it.
type Trigger struct {
	Reason string // ReasonThrottling, ReasonDark or ReasonReturned
	Region string
}

// FastPathTrigger is the cheap check run every minute between full runs. It fires when
//   - a dark region holds more than the floor,
//   - a region that was dark at the last allocation (st) is ok again, or
//   - an ok region throttles more than Config.FastPathThrottle of its short-window offered
//     traffic while more than that fraction of the scope's refill is unused (an unknown
//     region counts as using its whole share, a dark one its share).
//
// Regions are checked in input order; the first match is returned.
func FastPathTrigger(cfg Config, limit regions.Limit, in []RegionInput, st State) (Trigger, bool) {
	const eps = 1e-9
	for _, r := range in {
		if r.Status == StatusDark && r.Share > cfg.Floor+eps {
			return Trigger{ReasonDark, r.Region}, true
		}
	}
	for _, r := range in {
		if r.Status == StatusOK && st.Regions[r.Region].Status == StatusDark {
			return Trigger{ReasonReturned, r.Region}, true
		}
	}
	R := limit.RefillPerSecond
	used := 0.0
	for _, r := range in {
		if r.Status == StatusOK {
			used += r.Short.Allowed
		} else {
			used += r.Share * R
		}
	}
	if !(R-used > cfg.FastPathThrottle*R) {
		return Trigger{}, false
	}
	for _, r := range in {
		if r.Status == StatusOK && r.Short.Throttled > cfg.FastPathThrottle*r.Short.Offered() {
			return Trigger{ReasonThrottling, r.Region}, true
		}
	}
	return Trigger{}, false
}

// ShouldWrite is the hysteresis. Proposed shares are written only when
//
//   - the change is big enough: some share moves by at least Config.MinChange, or a
//     throttled region (any rejection in either window) would gain at least
//     Config.ThrottledGain of its share; and
//   - the change helps a region: some ok region is throttled, or is below its demand
//     plus headroom and would gain; a dark region holds more than the floor; an unknown
//     region's share has to move; or the current shares do not sum to 1.
//
// The second rule keeps the rebalancer from shuffling spare capacity (the peak reserve
// decaying, the equal rest) between regions that all have their demand and headroom:
// such a write changes no admission. The current shares are the inputs' Share; a region
// missing from proposed is not written and never forces a write.
func ShouldWrite(cfg Config, limit regions.Limit, in []RegionInput, proposed map[string]float64) bool {
	const eps = 1e-9
	R := limit.RefillPerSecond
	sum, largest := 0.0, 0.0
	big, helps := false, false
	for _, r := range in {
		sum += r.Share
		p, ok := proposed[r.Region]
		if !ok {
			continue
		}
		largest = math.Max(largest, math.Abs(p-r.Share))
		throttled := r.Status == StatusOK && (r.Long.Throttled > 0 || r.Short.Throttled > 0)
		gains := p > r.Share+eps
		if throttled && gains && p >= r.Share*(1+cfg.ThrottledGain) {
			big = true
		}
		switch r.Status {
		case StatusOK:
			short := r.Share*R < (1+cfg.Headroom)*demand(r)
			helps = helps || throttled || (short && gains)
		case StatusDark:
			helps = helps || r.Share > cfg.Floor+eps
		case StatusUnknown:
			helps = helps || math.Abs(p-r.Share) > eps
		}
	}
	if largest <= eps {
		return false
	}
	if math.Abs(sum-1) > regions.ShareTolerance {
		return true
	}
	return (big || largest >= cfg.MinChange) && helps
}

// Plan splits a change into two writes so that the shares gateways enforce never sum
// above 1, whichever of old or new each gateway has loaded: first holds the regions
// whose share decreases, second those whose share increases (a region absent from old
// counts as an increase). Unchanged regions are in neither. Write first, wait one
// gateway reload period, then write second; when first is empty, write second at once.
func Plan(old, new map[string]float64) (first, second map[string]float64) {
	first, second = map[string]float64{}, map[string]float64{}
	for r, s := range new {
		o, ok := old[r]
		switch {
		case !ok || s > o:
			second[r] = s
		case s < o:
			first[r] = s
		}
	}
	return first, second
}

// Decision is the outcome of one tick for one scope.
type Decision struct {
	// Allocation is always computed; keep its State whether or not anything is written.
	Allocation Allocation
	// Write says whether to write First, then (after one gateway reload period) Second.
	Write bool
	// Reason is one of the Reason* constants: why written, or why not.
	Reason string
	// Region names the region behind a fast-path reason.
	Region        string
	First, Second map[string]float64
}

// Tick says which of the rebalancer's two ticks Decide runs.
type Tick int

const (
	// CheckTick is the cheap check between full runs: it acts only when FastPathTrigger
	// fires.
	CheckTick Tick = iota
	// FullRun is the run on the interval tick: it always considers a write.
	FullRun
)

// Quiet reports whether the ok regions of in together offer less than
// Config.MinDemand x refill (short window): demand too small to move the scope. It is
// false when no region is ok (nothing is known, which is not "quiet").
func Quiet(cfg Config, refill float64, in []RegionInput) bool {
	total, anyOK := 0.0, false
	for _, r := range in {
		if r.Status == StatusOK {
			anyOK, total = true, total+demand(r)
		}
	}
	return anyOK && total < cfg.MinDemand*refill
}

// Decide runs one tick for one scope: Allocate; on a CheckTick act only when
// FastPathTrigger fires; then apply the hysteresis and plan the write. A Quiet scope is
// allocated with its ok regions keeping their shares (as unknown ones do), so only a dark
// region can move it; without one its Reason is ReasonNoDemand.
//
// The one move a Quiet scope makes is the heal of a dark episode: when a region that was
// dark (State, or RegionInput.DarkFloor) is ok again and still at the floor, its ok
// regions go back to the equal split of what the unknown and dark regions leave (reason
// ReasonReturned), on a check as on a full run, when some share moves by at least
// Config.MinChange. Without it the floor would last until demand came back: the dark
// episode moved the scope, and noise-proof quiet kept it there.
func Decide(cfg Config, limit regions.Limit, now time.Time, in []RegionInput, st State, tick Tick) (Decision, error) {
	quiet := Quiet(cfg, limit.RefillPerSecond, in)
	if region, ok := returnedToFloor(cfg, in, st); quiet && ok {
		return healReturned(cfg, limit, now, in, st, region)
	}
	if quiet {
		held := slices.Clone(in)
		for i := range held {
			if held[i].Status == StatusOK {
				held[i].Status = StatusUnknown
			}
		}
		in = held
	}
	trig, fired := FastPathTrigger(cfg, limit, in, st)
	a, err := Allocate(cfg, limit, now, in, st)
	if err != nil {
		return Decision{}, err
	}
	d := Decision{Allocation: a}
	switch {
	case tick == FullRun:
		d.Reason = ReasonInterval
	case fired:
		d.Reason, d.Region = trig.Reason, trig.Region
	default:
		d.Reason = ReasonNoTrigger
		return d, nil
	}
	if !ShouldWrite(cfg, limit, in, a.Shares) {
		d.Reason, d.Region = ReasonHysteresis, ""
		if quiet {
			d.Reason = ReasonNoDemand
		}
		return d, nil
	}
	old := make(map[string]float64, len(in))
	for _, r := range in {
		old[r.Region] = r.Share
	}
	d.Write = true
	d.First, d.Second = Plan(old, a.Shares)
	return d, nil
}

// returnedToFloor names the first ok region of in that was dark (st, or its DarkFloor)
// and still holds the floor.
func returnedToFloor(cfg Config, in []RegionInput, st State) (string, bool) {
	const eps = 1e-9
	for _, r := range in {
		if r.Status == StatusOK && r.Share <= cfg.Floor+eps && (r.DarkFloor || st.Regions[r.Region].Status == StatusDark) {
			return r.Region, true
		}
	}
	return "", false
}

// healReturned decides a Quiet scope in which region came back from dark at the floor:
// the ok regions get the equal split of what the unknown (kept) and dark (floor) regions
// leave. Their demand, below the minimum, plays no part, so noise cannot steer the heal.
// The State is the one a plain allocation of in returns (region's status ok again), so
// the heal happens once per dark episode.
func healReturned(cfg Config, limit regions.Limit, now time.Time, in []RegionInput, st State, region string) (Decision, error) {
	plain, err := Allocate(cfg, limit, now, in, st)
	if err != nil {
		return Decision{}, err
	}
	idle := slices.Clone(in)
	for i := range idle {
		idle[i].Long, idle[i].Short = Rates{}, Rates{}
	}
	// No demand and no peaks: Allocate's last stage, the equal rest, is all there is.
	a, err := Allocate(cfg, limit, now, idle, State{})
	if err != nil {
		return Decision{}, err
	}
	for i := range a.Regions {
		a.Regions[i].Demand, a.Regions[i].Peak = plain.Regions[i].Demand, plain.Regions[i].Peak
	}
	a.State = plain.State
	d := Decision{Allocation: a, Reason: ReasonNoDemand}
	old := make(map[string]float64, len(in))
	largest := 0.0
	for _, r := range in {
		old[r.Region] = r.Share
		largest = math.Max(largest, math.Abs(a.Shares[r.Region]-r.Share))
	}
	if largest < cfg.MinChange {
		return d, nil
	}
	d.Write, d.Reason, d.Region = true, ReasonReturned, region
	d.First, d.Second = Plan(old, a.Shares)
	return d, nil
}
