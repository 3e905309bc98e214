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
	// Xid is the store's id of the transaction that wrote it (0: none, an expiry); a
	// raise of one region's share is enforced only once every gateway of the other
	// regions has loaded a snapshot that includes it (Pending). GateRatio is the share
	// in force before the raises not all acknowledged yet, over the new one.
	Xid       int64
	GateRatio float64
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

// BandRaise is Raise for the bucket of a rule's band (Rule.Bands), which takes fill to
// fill from empty: the raises of the region's shares of that pair (which scale every
// bucket of the rule, bands included) and the raises of that band itself, marked ("*",
// tenant, route#band) by the database when a band of the rule that applies grew
// (00012_bands.sql), for the pair, the tenant's every route, the route for every tenant
// and everything. A raise of the rule's own capacity does not hold its bands: a band it
// did not raise would be held to its ratio for the band's whole fill time (a month for a
// monthly band).
//
// Of those raises, the one that holds the bucket tightest now (the smallest ratio plus
// the fill since it) is returned, not a fold of them: each holds it on its own, and a
// fold of a share raise older than the band's fill time (which holds nothing any more)
// with a recent one would give the recent one the old one's small ratio. ok is false
// when none holds the bucket below full.
func (s *Snapshot) BandRaise(region, tenant, route, band string, fill, sinceLoad time.Duration) (ago time.Duration, ratio float64, ok bool) {
	best := 1.0
	consider := func(r Raise) {
		if r.At.IsZero() {
			return
		}
		a := max(s.loadedAt.Sub(r.At)+sinceLoad, time.Nanosecond)
		f := r.Ratio
		if fill > 0 {
			f += a.Seconds() / fill.Seconds()
		}
		if f < best {
			best, ago, ratio, ok = f, a, r.Ratio, true
		}
	}
	if m := s.regionRaises[region]; m != nil {
		for _, k := range [4]raiseKey{{tenant, route}, {tenant, Wildcard}, {Wildcard, route}, {Wildcard, Wildcard}} {
			consider(m[k])
		}
	}
	if m := s.raises[region]; m != nil {
		sfx := BandMarkSep + band
		for _, k := range [4]raiseKey{{tenant, route + sfx}, {tenant, Wildcard + sfx}, {Wildcard, route + sfx}, {Wildcard, Wildcard + sfx}} {
			consider(m[k])
		}
	}
	return ago, ratio, ok
}

// BandMarkSep joins a route and a band's name in the route of a band's raise marker
// ("orders#hour"): ids never hold it.
const BandMarkSep = "#"

// AckHorizon is how long after its last heartbeat a gateway may still be running on the
// snapshot it last reported: one that cannot reach the store keeps serving. A share
// increase of another region waits for its acknowledgment that long at most (Pending);
// after that it is taken for gone.
const AckHorizon = 5 * time.Minute

// regionRaises indexes the raises of one region (shares' raises; "*" rows are rules',
// which raise every region at once and need no acknowledgment).
func regionRaises(raises []Raise) map[string]map[raiseKey]Raise {
	var out map[string]map[raiseKey]Raise
	for _, r := range raises {
		if r.Region == Wildcard || r.Xid == 0 {
			continue
		}
		if out == nil {
			out = map[string]map[raiseKey]Raise{}
		}
		m := out[r.Region]
		if m == nil {
			m = map[raiseKey]Raise{}
			out[r.Region] = m
		}
		k := raiseKey{r.Tenant, r.Route}
		if p, ok := m[k]; !ok || r.Xid > p.Xid {
			m[k] = r
		}
	}
	return out
}

// ackedBy is, per region, the lowest transaction horizon reported by a gateway of
// another region seen within AckHorizon of at (any, when at is zero): a gateway that
// reported none acknowledges nothing (0). A region without such gateways is absent.
func ackedBy(instances []Instance, regions []string, at time.Time) map[string]int64 {
	out := map[string]int64{}
	for _, in := range instances {
		if !at.IsZero() && at.Sub(in.LastSeen) > AckHorizon {
			continue
		}
		for _, r := range regions {
			if r == in.Region {
				continue
			}
			if v, ok := out[r]; !ok || in.SnapshotXmin < v {
				out[r] = in.SnapshotXmin
			}
		}
	}
	return out
}

// Pending is the share increase of tenant's route in region that some gateway of another
// region has not acknowledged yet, as the old share over the new: until it has, the
// region enforces its old share (the new one x ratio), so that a gateway cut off from
// the store, which keeps enforcing its old, larger share, never sums with this region's
// new one above 1. ok is false when every increase is acknowledged (or there is none).
// The region's own gateways see the increase one reload after the acknowledgment.
//
// Only a raise of the scope whose row decides the pair's share, or of a narrower one (a
// row removed, so the pair now follows a wider scope), can have raised it: a raise of
// "*" leaves a pair with rows of its own where it was, and holding that pair to the "*"
// gate advertised 12 of its 19 until the other regions acknowledged.
func (s *Snapshot) Pending(region, tenant, route string) (ratio float64, ok bool) {
	m := s.shareRaises[region]
	if m == nil {
		return 0, false
	}
	acked, wait := s.acked[region]
	if !wait {
		return 0, false
	}
	_, _, decided := s.shareScope(region, tenant, route)
	// Raise keys from the narrowest; keys[:n] are the pair's own, the tenant's, then the
	// wider ones ({*, route} is no share scope, but a wider one all the same).
	keys := [...]raiseKey{{tenant, route}, {tenant, Wildcard}, {Wildcard, route}, {Wildcard, Wildcard}}
	n := len(keys)
	switch decided {
	case 0:
		n = 1
	case 1:
		n = 2
	}
	ratio = 1
	for _, k := range keys[:n] {
		if r, found := m[k]; found && r.Xid >= acked {
			ratio, ok = min(ratio, r.GateRatio), true
		}
	}
	if !ok {
		return 0, false
	}
	return ratio, true
}

// HeldRaises is how many share increases of region (raise rows: a scope, a tenant or a
// pair) some gateway of another region has not acknowledged yet (Pending).
func (s *Snapshot) HeldRaises(region string) int {
	acked, wait := s.acked[region]
	if !wait {
		return 0
	}
	n := 0
	for _, r := range s.shareRaises[region] {
		if r.Xid >= acked {
			n++
		}
	}
	return n
}

// Xmin is the store's transaction horizon of the load (SnapshotData.Xmin), for the
// holder's heartbeats.
func (s *Snapshot) Xmin() int64 { return s.xmin }

// ChangedAgo is how long ago the limit of tenant's route in region may last have
// changed, as far as the snapshot knows: the latest of the updated_at of the rule in
// force, of the share rows that decide the region's share (both within an expiry's
// transition), and raised, the age of the pair's raise (Raise, which the caller has
// already looked up: deletions, region removals; 0 for none). Every change of a rule or
// a share writes one of them, so the limit is the same since then, barring what the
// snapshot cannot date (a region added, an override expired, a plan assigned): those
// make the age too old, and the script then converts at the call, or early for a bucket
// last empty before that date (decide.lua). 0 when nothing is dated (a configuration
// file's rules). sinceLoad as in Raise.
func (s *Snapshot) ChangedAgo(region, tenant, route string, rule Rule, raised, sinceLoad time.Duration) time.Duration {
	at := rule.UpdatedAt
	if sh, trans, _, ok := s.shareRow(region, tenant, route, false); ok {
		if sh.UpdatedAt.After(at) {
			at = sh.UpdatedAt
		}
		if trans { // what replaces it may be in force too
			if sh, _, _, ok := s.shareRow(region, tenant, route, true); ok && sh.UpdatedAt.After(at) {
				at = sh.UpdatedAt
			}
		}
	}
	ago := time.Duration(0)
	if !at.IsZero() {
		ago = max(s.loadedAt.Sub(at)+sinceLoad, time.Nanosecond)
	}
	if raised > 0 && (ago == 0 || raised < ago) {
		ago = raised
	}
	return ago
}
