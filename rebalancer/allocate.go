package rebalancer

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// ErrInvalid is wrapped by every error about bad input (config, rates, shares, regions).
var ErrInvalid = errors.New("invalid")

// Status is what the rebalancer knows about a region's demand.
type Status string

const (
	// StatusOK: the region has live gateways and fresh rate samples.
	StatusOK Status = "ok"
	// StatusUnknown: the region's gateways are live but its rates have no fresh sample
	// (a metrics gap, a series that does not exist). Its share is kept: unknown is never
	// read as zero.
	StatusUnknown Status = "unknown"
	// StatusDark: no live gateway heartbeat in the region. Its share shrinks to the floor,
	// never to 0, so the region can serve and reveal its demand when it returns.
	StatusDark Status = "dark"
)

// RegionStatus classifies a region: no live heartbeat is dark, a live region without a
// fresh sample is unknown, otherwise ok.
func RegionStatus(live, fresh bool) Status {
	switch {
	case !live:
		return StatusDark
	case !fresh:
		return StatusUnknown
	default:
		return StatusOK
	}
}

// Rates are request rates in requests per second over one window. Offered demand is
// Allowed + Throttled: a region throttled at its share never shows its real demand
// through its allowed traffic alone.
type Rates struct {
	Allowed   float64
	Throttled float64
}

// Offered is what the clients sent: Allowed + Throttled.
func (r Rates) Offered() float64 { return r.Allowed + r.Throttled }

// RegionInput is one region's view of one scope.
type RegionInput struct {
	Region string
	Status Status
	// Long is over the rebalancer's interval, Short over the last minute; both are
	// ignored unless Status is StatusOK. Short is the demand the allocation uses; a
	// rejection in either window makes the region "throttled" for the hysteresis.
	Long, Short Rates
	// Share is the share in force now (the rebalancer's value, or the equal split when
	// none was written), in [0, 1].
	Share float64
	// DarkFloor says the region's share was set to the floor because it was dark (the
	// job reads it from the reason of the region's row, so it survives a restart of the
	// rebalancer; State remembers it too). A region back from dark at the floor of a
	// Quiet scope is healed by Decide.
	DarkFloor bool
}

// Config tunes the allocation. Build it with DefaultConfig and change fields.
type Config struct {
	// Headroom is the extra share granted above demand, as a fraction of demand (0.25).
	Headroom float64
	// Floor is the smallest share of any region, in (0, 1/n]. Default min(0.05, 0.5/n).
	Floor float64
	// MinChange is the hysteresis: no write when no share moves by at least this (0.02)...
	MinChange float64
	// ThrottledGain ...unless a throttled region would gain at least this fraction of its
	// share (0.10).
	ThrottledGain float64
	// PeakHalfLife is the half-life of the peak reserve: a region's peak short-window
	// demand is taken at once (fast attack) and decays by half every PeakHalfLife (10 min).
	PeakHalfLife time.Duration
	// FastPathThrottle: the check tick acts early when an ok region throttles more than
	// this fraction of its offered traffic (0.05) while the scope has at least this
	// fraction of its refill unused.
	FastPathThrottle float64
	// MinDemand is the smallest demand that moves a scope, as a fraction of its refill
	// (0.1): while its ok regions together offer less, their demand is noise (a trickle,
	// a new tenant's first requests) and they keep their shares (Quiet); only a dark
	// region still shrinks to the floor.
	MinDemand float64
}

// DefaultConfig is the configuration for a scope split over nRegions regions.
func DefaultConfig(nRegions int) Config {
	floor := 0.05
	if nRegions > 0 {
		floor = math.Min(0.05, 0.5/float64(nRegions))
	}
	return Config{
		Headroom:         0.25,
		Floor:            floor,
		MinChange:        0.02,
		ThrottledGain:    0.10,
		PeakHalfLife:     10 * time.Minute,
		FastPathThrottle: 0.05,
		MinDemand:        0.1,
	}
}

// Validate checks the configuration for a scope of nRegions regions.
func (c Config) Validate(nRegions int) error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(c.Headroom) || c.Headroom < 0:
		return fmt.Errorf("%w rebalancer config: headroom %v must be >= 0", ErrInvalid, c.Headroom)
	case !finite(c.Floor) || c.Floor <= 0 || c.Floor*float64(nRegions) > 1+1e-12:
		return fmt.Errorf("%w rebalancer config: floor %v must be > 0 and at most 1/%d", ErrInvalid, c.Floor, nRegions)
	case !finite(c.MinChange) || c.MinChange < 0 || c.MinChange > 1:
		return fmt.Errorf("%w rebalancer config: min change %v must be in [0, 1]", ErrInvalid, c.MinChange)
	case !finite(c.ThrottledGain) || c.ThrottledGain < 0:
		return fmt.Errorf("%w rebalancer config: throttled gain %v must be >= 0", ErrInvalid, c.ThrottledGain)
	case c.PeakHalfLife <= 0:
		return fmt.Errorf("%w rebalancer config: peak half-life %v must be > 0", ErrInvalid, c.PeakHalfLife)
	case !finite(c.FastPathThrottle) || c.FastPathThrottle <= 0 || c.FastPathThrottle >= 1:
		return fmt.Errorf("%w rebalancer config: fast-path throttle %v must be in (0, 1)", ErrInvalid, c.FastPathThrottle)
	case !finite(c.MinDemand) || c.MinDemand < 0 || c.MinDemand > 1:
		return fmt.Errorf("%w rebalancer config: min demand %v must be in [0, 1]", ErrInvalid, c.MinDemand)
	}
	return nil
}

// State is what the allocation remembers between ticks for one scope: each region's
// decaying peak and last known status. The zero value is a fresh start. Allocate never
// modifies the State it is given; it returns the next one.
type State struct {
	// At is the time the peaks were last updated.
	At      time.Time
	Regions map[string]RegionState
}

// RegionState is one region's memory.
type RegionState struct {
	// Peak is the decaying peak of the region's short-window offered rate (requests per
	// second) as of State.At.
	Peak float64
	// Status is the last status other than unknown (unknown is "no news").
	Status Status
}

// Basis says which rule produced a region's share.
type Basis string

const (
	BasisWaterfill Basis = "waterfill" // an ok region: demand, headroom, reserve, equal rest
	BasisFloor     Basis = "floor"     // a dark region, or every region when nothing is known
	BasisKept      Basis = "kept"      // an unknown region keeps its share
	BasisRescaled  Basis = "rescaled"  // an unknown share that had to move to fit the floors
)

// RegionAllocation explains one region's share, for history rows and logs.
type RegionAllocation struct {
	Region string
	Status Status
	// Demand is the offered rate the allocation used (requests per second); 0 unless ok.
	Demand float64
	// Peak is the decayed peak offered rate behind the reserve.
	Peak float64
	// Previous is the share in force before (the input), Share the new one.
	Previous, Share float64
	Basis           Basis
}

// Allocation is one scope's result.
type Allocation struct {
	// Shares maps every input region to its new share: each in [Floor, 1], summing to 1
	// within 1e-9.
	Shares map[string]float64
	// Regions explains each share, in input order.
	Regions []RegionAllocation
	// State is the state to pass to the next call.
	State State
}

// Allocate splits limit between the regions of in by water-filling the global refill R:
//
//  1. every ok region gets up to its demand; when the demands exceed what is left, the
//     split is weighted max-min fair with the demands as weights (each region admits the
//     same fraction of its demand, as one global bucket would), floors protected;
//  2. headroom (Config.Headroom of demand), in proportion to demand;
//  3. the peak reserve: up to each region's decaying peak demand;
//  4. what is left, equally among the ok regions.
//
// A dark region gets the floor; an unknown region keeps its share (clamped to
// [Floor, 1]) and the ok regions share what is left. Only when the kept shares leave
// less than a floor for every other region are they scaled down to fit. The demand of
// an ok region is its short-window offered rate; a fall is cushioned by the peak
// reserve, which only takes share nobody else needs.
//
// limit.Capacity is not used: burst capacity is split by the same shares
// (regions.Scale). Allocate reads no clock; now only ages the peak state.
func Allocate(cfg Config, limit regions.Limit, now time.Time, in []RegionInput, st State) (Allocation, error) {
	n := len(in)
	if n == 0 {
		return Allocation{}, fmt.Errorf("%w allocation: no regions", ErrInvalid)
	}
	if err := cfg.Validate(n); err != nil {
		return Allocation{}, err
	}
	R := limit.RefillPerSecond
	if math.IsNaN(R) || math.IsInf(R, 0) || R <= 0 {
		return Allocation{}, fmt.Errorf("%w allocation: refill %v must be > 0", ErrInvalid, R)
	}
	if err := validateInputs(in); err != nil {
		return Allocation{}, err
	}

	next := st.advance(cfg, now, in)
	f := cfg.Floor
	out := Allocation{
		Shares:  make(map[string]float64, n),
		Regions: make([]RegionAllocation, n),
		State:   next,
	}
	share := make([]float64, n)
	var ok, unknown []int
	fixed, nDark := 0.0, 0
	for i, r := range in {
		ra := RegionAllocation{Region: r.Region, Status: r.Status, Previous: r.Share, Peak: next.Regions[r.Region].Peak}
		switch r.Status {
		case StatusDark:
			share[i], ra.Basis = f, BasisFloor
			fixed += f
			nDark++
		case StatusUnknown:
			share[i], ra.Basis = clamp(r.Share, f, 1), BasisKept
			fixed += share[i]
			unknown = append(unknown, i)
		default:
			ra.Demand = demand(r)
			ra.Basis = BasisWaterfill
			ok = append(ok, i)
		}
		out.Regions[i] = ra
	}

	switch {
	case len(ok) == 0 && len(unknown) == 0:
		// Every region is dark: nothing is known, so keep the shares as they are.
		all := make([]int, n)
		for i := range all {
			all[i] = i
			share[i] = clamp(in[i].Share, f, 1)
			out.Regions[i].Basis = BasisKept
		}
		fit(share, all, f, 1)
	case len(ok) == 0:
		// Only unknown and dark regions: the unknown ones absorb what the dark ones left.
		fit(share, unknown, f, 1-float64(nDark)*f)
		markRescaled(out.Regions, unknown, in, share)
	default:
		budget := 1 - fixed
		if need := float64(len(ok)) * f; budget < need {
			// The kept shares leave less than a floor per ok region: scale them down.
			fit(share, unknown, f, 1-float64(nDark)*f-need)
			markRescaled(out.Regions, unknown, in, share)
			budget = need
		}
		d := make([]float64, len(ok))
		p := make([]float64, len(ok))
		for k, i := range ok {
			d[k] = out.Regions[i].Demand / R
			p[k] = out.Regions[i].Peak / R
		}
		a := waterfill(d, p, cfg.Headroom, f, budget)
		for k, i := range ok {
			share[i] = a[k]
		}
	}

	normalise(share, f)
	for i, r := range in {
		out.Shares[r.Region] = share[i]
		out.Regions[i].Share = share[i]
	}
	return out, nil
}

// demand is the offered rate an ok region is allocated for.
// It is the short window: the long one would hold a falling region's demand for a whole
// interval and, under overload, keep share from the region that needs it now. Stability
// comes from the peak reserve and the hysteresis instead.
func demand(r RegionInput) float64 { return r.Short.Offered() }

func validateInputs(in []RegionInput) error {
	seen := make(map[string]bool, len(in))
	for _, r := range in {
		if err := regions.ValidateID("region", r.Region); err != nil {
			return fmt.Errorf("allocation: %w", err)
		}
		if seen[r.Region] {
			return fmt.Errorf("%w allocation: region %s listed twice", ErrInvalid, r.Region)
		}
		seen[r.Region] = true
		switch r.Status {
		case StatusOK, StatusUnknown, StatusDark:
		default:
			return fmt.Errorf("%w allocation: region %s: status %q", ErrInvalid, r.Region, r.Status)
		}
		if math.IsNaN(r.Share) || r.Share < 0 || r.Share > 1 {
			return fmt.Errorf("%w allocation: region %s: share %v must be in [0, 1]", ErrInvalid, r.Region, r.Share)
		}
		if r.Status != StatusOK {
			continue
		}
		for _, v := range [...]float64{r.Long.Allowed, r.Long.Throttled, r.Short.Allowed, r.Short.Throttled} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return fmt.Errorf("%w allocation: region %s: rate %v must be finite and >= 0", ErrInvalid, r.Region, v)
			}
		}
		if math.IsInf(r.Long.Offered(), 0) || math.IsInf(r.Short.Offered(), 0) {
			return fmt.Errorf("%w allocation: region %s: offered rate overflows", ErrInvalid, r.Region)
		}
	}
	return nil
}

// advance ages the peaks to now and takes each ok region's short-window demand (fast
// attack). It returns a new State; st is not modified.
func (st State) advance(cfg Config, now time.Time, in []RegionInput) State {
	decay := 1.0
	if !st.At.IsZero() && now.After(st.At) {
		decay = math.Exp2(-float64(now.Sub(st.At)) / float64(cfg.PeakHalfLife))
	}
	at := st.At
	if now.After(at) {
		at = now
	}
	next := State{At: at, Regions: make(map[string]RegionState, len(in))}
	for _, r := range in {
		rs := st.Regions[r.Region]
		if math.IsNaN(rs.Peak) || math.IsInf(rs.Peak, 0) || rs.Peak < 0 {
			rs.Peak = 0 // a corrupt state is forgotten, not trusted
		}
		rs.Peak *= decay
		if r.Status == StatusOK {
			rs.Peak = math.Max(rs.Peak, r.Short.Offered())
		}
		if r.Status != StatusUnknown {
			rs.Status = r.Status
		}
		next.Regions[r.Region] = rs
	}
	return next
}

// waterfill allocates budget (a share of the refill) between regions with demands d and
// peaks p (both as shares of the refill), each getting at least f. budget >= len(d)*f.
func waterfill(d, p []float64, headroom, f, budget float64) []float64 {
	m := len(d)
	a := make([]float64, m)
	// Stage 1: demand, weighted max-min fair, floors protected.
	target := make([]float64, m)
	total := 0.0
	for k := range d {
		target[k] = math.Max(f, d[k])
		total += target[k]
	}
	if total > budget {
		return weightedFill(d, f, budget)
	}
	copy(a, target)
	rem := budget - total
	// Stage 2: headroom, in proportion to demand. Stage 3: the peak reserve.
	for stage := 0; stage < 2 && rem > 0; stage++ {
		need := make([]float64, m)
		sum := 0.0
		for k := range d {
			t := math.Max(f, (1+headroom)*d[k])
			if stage == 1 {
				t = math.Max(t, p[k])
			}
			need[k] = math.Max(0, t-a[k])
			sum += need[k]
		}
		if sum <= 0 {
			continue
		}
		scale := math.Min(1, rem/sum)
		for k := range a {
			a[k] += need[k] * scale
		}
		rem -= sum * scale
	}
	// Stage 4: the rest, equally.
	if rem > 0 {
		for k := range a {
			a[k] += rem / float64(m)
		}
	}
	return a
}

// weightedFill solves a_k = max(f, lambda*d_k) with sum a = budget, for demands whose
// floored sum exceeds budget (so lambda < 1).
func weightedFill(d []float64, f, budget float64) []float64 {
	m := len(d)
	a := make([]float64, m)
	floored := make([]bool, m)
	for range m { // each pass floors at least one more region, or ends
		fixedSum, weight := 0.0, 0.0
		for k := range d {
			if floored[k] {
				fixedSum += f
			} else {
				weight += d[k]
			}
		}
		if weight <= 0 {
			break
		}
		lambda := (budget - fixedSum) / weight
		changed := false
		for k := range d {
			if !floored[k] && lambda*d[k] < f {
				floored[k], changed = true, true
			}
		}
		if !changed {
			for k := range d {
				if floored[k] {
					a[k] = f
				} else {
					a[k] = lambda * d[k]
				}
			}
			return a
		}
	}
	// Every region floored (only when budget is about len(d)*f).
	for k := range a {
		a[k] = budget / float64(m)
	}
	return a
}

// fit makes the shares of idx sum to total, each at least f, keeping their excess over
// f in proportion. total >= len(idx)*f.
func fit(share []float64, idx []int, f, total float64) {
	if len(idx) == 0 {
		return
	}
	excess := 0.0
	for _, i := range idx {
		excess += share[i] - f
	}
	want := total - float64(len(idx))*f
	if want < 0 {
		want = 0
	}
	for _, i := range idx {
		if excess > 0 {
			share[i] = f + (share[i]-f)*want/excess
		} else {
			share[i] = f + want/float64(len(idx))
		}
	}
}

func markRescaled(ra []RegionAllocation, idx []int, in []RegionInput, share []float64) {
	for _, i := range idx {
		if share[i] != in[i].Share {
			ra[i].Basis = BasisRescaled
		}
	}
}

// normalise removes rounding error: the shares end in [f, 1] and sum to 1 within 1e-12,
// the correction going to the largest share.
func normalise(share []float64, f float64) {
	big, sum := 0, 0.0
	for i, s := range share {
		share[i] = clamp(s, f, 1)
		sum += share[i]
		if share[i] > share[big] {
			big = i
		}
	}
	share[big] = clamp(share[big]+1-sum, f, 1)
}

func clamp(v, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, v)) }
