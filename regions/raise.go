package regions

import "time"

// Raise is a change that may have raised a regional capacity: a rule or share added,
// removed or raised, more shards, a region removed. Region, Tenant and Route may be "*"
// (every region: a rule change; every tenant: a default rule, a region-wide share; every
// route: a tenant's rule or share for all its routes). At is when it was made, by the
// store's clock; Ratio is the old capacity over the new (0: the change does not say).
//
// A gateway uses it for the buckets Redis no longer holds: one that expired full under
// the old limit would come back full at the new size, tokens no one earned. Within one
// fill time of a raise such a bucket holds at most Ratio x its capacity plus its refill
// since At (limiter.Request.RaisedAgo).
type Raise struct {
	Region, Tenant, Route string
	At                    time.Time
	Ratio                 float64
}

// raiseKey is a raise's (tenant, route) within its region.
type raiseKey struct{ tenant, route string }

// foldRaises indexes raises per region, folding the rows of every region ("*") into each
// known one: a lookup is then one map per region and up to four keys.
func foldRaises(raises []Raise, regions []string) map[string]map[raiseKey]Raise {
	if len(raises) == 0 {
		return nil
	}
	out := make(map[string]map[raiseKey]Raise, len(regions))
	put := func(region string, r Raise) {
		m := out[region]
		if m == nil {
			m = map[raiseKey]Raise{}
			out[region] = m
		}
		k := raiseKey{r.Tenant, r.Route}
		m[k] = merge(m[k], r)
	}
	for _, r := range raises {
		if r.Region != Wildcard {
			put(r.Region, r)
			continue
		}
		for _, region := range regions {
			put(region, r)
		}
	}
	return out
}

// merge is the tighter of two raises of one bucket: the later time and the smaller
// ratio (zero values are no raise). The buckets it holds may hold less than either
// raise alone would give them, never more.
func merge(a, b Raise) Raise {
	if a.At.IsZero() {
		return b
	}
	if b.At.IsZero() {
		return a
	}
	out := a
	if b.At.After(a.At) {
		out.At = b.At
	}
	out.Ratio = min(a.Ratio, b.Ratio)
	return out
}

// Raise is the latest possible raise of the capacity of tenant's route in region, folded
// from the raises of that pair, of the tenant's every route, of the route for every
// tenant and of everything ("*"), as ago, how long before now it was made, and its
// ratio; ok is false when none is known. sinceLoad is how long ago the caller got the
// snapshot (its own monotonic clock): ago is the raise's age by the store's clock at
// LoadedAt, plus that, so gateway clocks never enter.
func (s *Snapshot) Raise(region, tenant, route string, sinceLoad time.Duration) (ago time.Duration, ratio float64, ok bool) {
	m := s.raises[region]
	if m == nil {
		return 0, 0, false
	}
	r := merge(merge(m[raiseKey{tenant, route}], m[raiseKey{tenant, Wildcard}]),
		merge(m[raiseKey{Wildcard, route}], m[raiseKey{Wildcard, Wildcard}]))
	if r.At.IsZero() {
		return 0, 0, false
	}
	ago = s.loadedAt.Sub(r.At) + sinceLoad
	return max(ago, time.Nanosecond), r.Ratio, true
}
