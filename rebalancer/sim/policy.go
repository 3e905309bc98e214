package sim

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Policy names accepted by ParsePolicy.
const (
	Waterfill           = "waterfill"
	ProportionalOffered = "proportional-offered"
	ProportionalAllowed = "proportional-allowed"
	Static              = "static"
)

// Policy is how a simulation sets shares:
//   - waterfill: the production rebalancer.Decide, every check interval (fast path) and
//     every interval (full run), with shrink-before-grow writes;
//   - proportional-offered: every interval, shares proportional to each region's offered
//     rate (allowed + throttled) over the interval, a missing series read as zero;
//   - proportional-allowed: the same with allowed traffic only;
//   - static[:s1,s2,...]: fixed shares in the trace's region order (the equal split
//     when none are given), never written.
//
// The proportional baselines write whenever a share moves by at least 0.001, in one
// step.
type Policy struct {
	kind   string
	static []float64 // nil: the equal split
}

// ParsePolicy reads "waterfill", "proportional-offered", "proportional-allowed",
// "static" or "static:0.7,0.3".
func ParsePolicy(s string) (Policy, error) {
	s = strings.TrimSpace(s)
	kind, args, hasArgs := strings.Cut(s, ":")
	switch kind {
	case Waterfill, ProportionalOffered, ProportionalAllowed:
		if hasArgs {
			return Policy{}, fmt.Errorf("policy %q takes no arguments", kind)
		}
		return Policy{kind: kind}, nil
	case Static:
		if !hasArgs {
			return Policy{kind: Static}, nil
		}
		var shares []float64
		sum := 0.0
		for _, f := range strings.Split(args, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || math.IsNaN(v) || v < 0 || v > 1 {
				return Policy{}, fmt.Errorf("policy %q: share %q must be a number in [0, 1]", s, f)
			}
			shares = append(shares, v)
			sum += v
		}
		if math.Abs(sum-1) > 1e-6 {
			return Policy{}, fmt.Errorf("policy %q: shares sum to %g, not 1", s, sum)
		}
		return Policy{kind: Static, static: shares}, nil
	}
	return Policy{}, fmt.Errorf("unknown policy %q (want %s, %s, %s or %s[:s1,s2,...])",
		s, Waterfill, ProportionalOffered, ProportionalAllowed, Static)
}

// String is the form ParsePolicy reads.
func (p Policy) String() string {
	if p.kind == Static && p.static != nil {
		parts := make([]string, len(p.static))
		for i, v := range p.static {
			parts[i] = strconv.FormatFloat(v, 'g', -1, 64)
		}
		return Static + ":" + strings.Join(parts, ",")
	}
	return p.kind
}

// ComparePolicies are the policies docs/rebalancer.md compares on a trace of nRegions
// regions: waterfill, both proportional baselines, and static 0.7/0.3 for two regions
// (the equal split otherwise).
func ComparePolicies(nRegions int) []Policy {
	static := Policy{kind: Static}
	if nRegions == 2 {
		static.static = []float64{0.7, 0.3}
	}
	return []Policy{{kind: Waterfill}, {kind: ProportionalOffered}, {kind: ProportionalAllowed}, static}
}

// initial is the shares in force at time 0.
func (p Policy) initial(nRegions int) ([]float64, error) {
	if p.kind == "" {
		return nil, errors.New("zero Policy: use ParsePolicy")
	}
	if p.static != nil {
		if len(p.static) != nRegions {
			return nil, fmt.Errorf("policy %s: %d shares for %d regions", p, len(p.static), nRegions)
		}
		return append([]float64(nil), p.static...), nil
	}
	s := make([]float64, nRegions)
	for i := range s {
		s[i] = 1 / float64(nRegions)
	}
	return s, nil
}
