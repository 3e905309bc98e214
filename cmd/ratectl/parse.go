package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/quotaplane/quotaplane/regions"
)

// parseShares reads a list of REGION=SHARE items, given as separate arguments, comma
// separated, or both ("us-east=0.7 eu-west=0.3", "us-east=0.7,eu-west=0.3"). Each region
// is a valid id named once; each share is a plain decimal number in (0, 1]. Whether the
// shares name every region and sum to 1 is checked against the database by the caller
// (regions.ValidateShares).
func parseShares(args []string) (map[string]float64, error) {
	out := make(map[string]float64)
	for _, arg := range args {
		for _, item := range strings.Split(arg, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			region, value, ok := strings.Cut(item, "=")
			if !ok {
				return nil, usagef("share %q: want REGION=SHARE, for example us-east=0.7", item)
			}
			region = strings.TrimSpace(region)
			if err := regions.ValidateID("region", region); err != nil {
				return nil, usagef("share %q: %v", item, err)
			}
			v, err := parseShare(strings.TrimSpace(value))
			if err != nil {
				return nil, usagef("share %q: %v", item, err)
			}
			if _, dup := out[region]; dup {
				return nil, usagef("share %q: region %s is named twice", item, region)
			}
			out[region] = v
		}
	}
	if len(out) == 0 {
		return nil, usagef("no shares given: name every region as REGION=SHARE, for example us-east=0.7 eu-west=0.3")
	}
	return out, nil
}

// parseShare reads one share: a plain decimal in (0, 1]. Zero is refused: a region with
// share 0 would reject all its traffic; give it a small share instead.
func parseShare(s string) (float64, error) {
	v, err := parseDecimal(s)
	if err != nil {
		return 0, err
	}
	switch {
	case v < 0:
		return 0, fmt.Errorf("share %s is negative", s)
	case v == 0:
		return 0, fmt.Errorf("share 0 would reject all of the region's traffic; give it a small share such as 0.01")
	case v > 1:
		return 0, fmt.Errorf("share %s is more than 1", s)
	}
	return v, nil
}

// parseDecimal accepts only plain decimal notation (digits, one '.', an optional sign and
// exponent): no hex, no underscores, no inf or nan.
func parseDecimal(s string) (float64, error) {
	if s == "" {
		return 0, fmt.Errorf("empty number")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E') {
			return 0, fmt.Errorf("%q is not a decimal number", s)
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a decimal number", s)
	}
	return v, nil
}

// formatShares is the canonical REGION=SHARE,... form of a share map, sorted by region.
func formatShares(m map[string]float64) string {
	keys := sortedKeys(m)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.FormatFloat(m[k], 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// parsePositiveInt reads a flag value that must be a whole number > 0.
func checkPositiveInt(flag string, v int64) error {
	if v <= 0 {
		return usagef("--%s %d: must be > 0", flag, v)
	}
	return nil
}

// checkPositiveFloat checks a flag value that must be a finite number > 0.
func checkPositiveFloat(flag string, v float64) error {
	if !(v > 0) || math.IsInf(v, 0) {
		return usagef("--%s %v: must be a number > 0", flag, v)
	}
	return nil
}

// checkID validates a tenant, route or region id given in a flag or argument.
func checkID(kind, id string) error {
	if err := regions.ValidateID(kind, id); err != nil {
		return usageError{err}
	}
	return nil
}

// checkIDOrWildcard also accepts "*" (a default rule).
func checkIDOrWildcard(kind, id string) error {
	if id == regions.Wildcard {
		return nil
	}
	return checkID(kind, id)
}

// checkRuleFlags checks the route and the bucket flags given to rules set or plans set
// (a flag left out keeps the stored value).
func checkRuleFlags(f *pflag.FlagSet, r *regions.Rule) error {
	if err := checkIDOrWildcard("route", r.Route); err != nil {
		return err
	}
	if f.Changed("capacity") {
		if err := checkPositiveInt("capacity", r.Capacity); err != nil {
			return err
		}
	}
	if f.Changed("refill") {
		if err := checkPositiveFloat("refill", r.RefillPerSecond); err != nil {
			return err
		}
	}
	if f.Changed("shards") && (r.Shards < 1 || r.Shards > regions.MaxShards) {
		return usagef("--shards %d: must be between 1 and %d", r.Shards, regions.MaxShards)
	}
	return nil
}
