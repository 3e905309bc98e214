package regions

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// SnapshotData is everything a Snapshot is built from: what the store loads, or what a
// standalone gateway reads from its configuration file.
type SnapshotData struct {
	Regions []string
	// Rules must include a default rule for tenant "*" and route "*".
	Rules []Rule
	// PlanRules are the plans' rules (Plan set, Tenant "*"), and TenantPlans the tenants
	// assigned to plans (at most one each). A plan without rules needs no entry.
	PlanRules   []Rule
	TenantPlans []TenantPlan
	Keys        []APIKey // revoked keys may be included; they never authenticate
	// KeyTenants maps the hashes of valid keys to their tenants (already validated), for a
	// store that streams millions of keys in bulk rather than through Keys; Keys are added
	// to it. The map becomes the snapshot's: do not reuse it.
	KeyTenants map[KeyHash]string
	Shares     []Share
	Instances  []Instance
	// InstanceTTL is how long after its last heartbeat an instance counts as live.
	InstanceTTL time.Duration
	// LoadedAt is when the data was read (the store's clock).
	LoadedAt time.Time
	// Skipped lists the rows the store could not accept and left out (see SkippedRow).
	Skipped []SkippedRow
	// Raises are the changes that may have raised tenants' regional capacities
	// (Raise; the store's limit_raise table).
	Raises []Raise
	// Xmin is the store's transaction horizon of the load (every transaction below it
	// had finished, so its writes are in the data); 0 when the store has none. A gateway
	// reports it with its heartbeats (Instance.SnapshotXmin).
	Xmin int64
}

// SkippedRow is a stored row a loader left out of a snapshot because it is invalid (an
// id the database accepted but ValidateID refuses, say): one bad row must not stop every
// gateway's reload. Table is the table's name (a bounded set, a metric label); ID
// identifies the row (its key columns) and Err says why.
type SkippedRow struct {
	Table string
	ID    string
	Err   error
}

// Snapshot is an immutable, validated view of the control-plane data. Gateways hold one
// behind an atomic pointer and answer every request from it; all methods are safe for
// concurrent use and allocate nothing.
type Snapshot struct {
	regions []string
	rules   map[ruleKey]Rule
	// planRules are keyed by {plan, route}; tenantPlan maps a tenant to its plan.
	planRules  map[ruleKey]Rule
	tenantPlan map[string]string
	keys       map[KeyHash]string // hash -> tenant, valid keys only
	shares     map[shareKey]Share
	live       map[string]int
	loadedAt   time.Time
	nRules     int
	skipped    []SkippedRow
	// nextExpiry is the next instant (store clock) at which a time-bounded share changes
	// state: it enters its transition (ExpiresAt - ExpiryGrace) or leaves it
	// (ExpiresAt + ExpiryGrace). Zero: none.
	nextExpiry time.Time
	// asOf is the store time the shares are judged at: loadedAt, or At's argument.
	asOf time.Time
	// rows are the share rows as given (validated, normalised) that are not yet gone,
	// so At can judge them again without the store.
	rows []Share
	// transitional marks the rows within ExpiryGrace of their expiry: they enforce the
	// lower of themselves and what replaces them (Share). nil when there are none.
	transitional map[shareKey]bool
	// rebScopes are the distinct scopes with rebalancer rows, sorted by String().
	rebScopes []Scope
	// raises are, per region, the latest raise of each (tenant, route), the rows for
	// every region ("*") folded in (raise.go).
	raises map[string]map[raiseKey]Raise
	// shareRaises are the raises of one region (a share's), not folded, and acked per
	// region the lowest transaction horizon the other regions' gateways have reported
	// (absent: none may be running); see Pending.
	shareRaises map[string]map[raiseKey]Raise
	// regionRaises are, per region, its own rows only (shares' raises, expiries
	// included), merged per (tenant, route): they hold a rule's bands too (BandRaise).
	regionRaises map[string]map[raiseKey]Raise
	acked        map[string]int64
	xmin         int64
}

type ruleKey struct{ tenant, route string }

type shareKey struct {
	scope  Scope
	region string
	source Source
}

// ExpiryGrace bounds how far apart two holders' estimates of the store's clock may be
// at a share's expiry (see NewSnapshot): a holder times an expiry as a duration from its
// last load on its own monotonic clock, so its estimate runs ahead of the store's by up
// to one load's latency, and drifts by its clock's rate error (at 100 ppm, 2 s after
// 5.5 hours without a load).
const ExpiryGrace = 2 * time.Second

// NewSnapshot validates data and builds a Snapshot. Any invalid row fails the whole
// snapshot, so a reloader keeps its previous one (the store's loader leaves out, and
// lists in Skipped, the rows it cannot accept, so they never get here).
//
// Expiry is judged by LoadedAt (the store's clock: the database's now()), and again by
// At, which a holder that cannot reload calls with its own estimate of the store's
// clock, so a gateway cut off from the database ends an override when the others do.
// A share whose ExpiresAt is not after the judging time is left out. One within
// ExpiryGrace of its expiry (before or after: holders' estimates differ by up to that)
// is in transition: every lookup it decides gets the lower of it and what replaces it
// (the lookup without every transitional row). So whichever holders have passed the
// expiry and whichever have not, no region enforces more than both the old and the new
// shares allow, and a scope's enforced shares never sum above 1 across an expiry — in
// a partition too. NextExpiry is the next such change of state. No method takes the
// reader's clock. With LoadedAt zero nothing is left out.
func NewSnapshot(d SnapshotData) (*Snapshot, error) {
	validKeys := d.KeyTenants
	if validKeys == nil {
		validKeys = make(map[KeyHash]string, len(d.Keys))
	}
	s := &Snapshot{
		regions:  append([]string(nil), d.Regions...),
		rules:    make(map[ruleKey]Rule, len(d.Rules)),
		keys:     validKeys,
		shares:   make(map[shareKey]Share, len(d.Shares)),
		live:     make(map[string]int),
		loadedAt: d.LoadedAt,
		asOf:     d.LoadedAt,
		nRules:   len(d.Rules),
		skipped:  slices.Clone(d.Skipped),
	}
	known := make(map[string]bool, len(d.Regions))
	for _, r := range d.Regions {
		if err := ValidateID("region", r); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		if known[r] {
			return nil, fmt.Errorf("snapshot: %w: duplicate region %s", ErrInvalid, r)
		}
		known[r] = true
	}
	for _, r := range d.Rules {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		k := ruleKey{r.Tenant, r.Route}
		if _, dup := s.rules[k]; dup {
			return nil, fmt.Errorf("snapshot: %w: duplicate rule %s/%s", ErrInvalid, r.Tenant, r.Route)
		}
		s.rules[k] = r
	}
	if _, ok := s.rules[ruleKey{Wildcard, Wildcard}]; !ok {
		return nil, fmt.Errorf("snapshot: %w: no default rule for tenant * and route *", ErrInvalid)
	}
	if err := s.addPlans(d.PlanRules, d.TenantPlans); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	for _, k := range d.Keys {
		if err := ValidateID("tenant", k.Tenant); err != nil {
			return nil, fmt.Errorf("snapshot: key %d: %w", k.ID, err)
		}
		if k.RevokedAt.IsZero() {
			s.keys[k.Hash] = k.Tenant
		}
	}
	seen := make(map[shareKey]bool, len(d.Shares))
	rows := make([]Share, 0, len(d.Shares))
	for _, sh := range d.Shares {
		if err := sh.Scope.Validate(); err != nil {
			return nil, fmt.Errorf("snapshot: share of region %s: %w", sh.Region, err)
		}
		sh.Scope = sh.Scope.normal()
		if !known[sh.Region] {
			return nil, fmt.Errorf("snapshot: %w: share for unknown region %q", ErrInvalid, sh.Region)
		}
		if sh.Share < 0 || sh.Share > 1 || sh.Share != sh.Share {
			return nil, fmt.Errorf("snapshot: %w: share %v of region %s scope %s", ErrInvalid, sh.Share, sh.Region, sh.Scope)
		}
		if sh.Source != SourceOverride && sh.Source != SourceRebalancer {
			return nil, fmt.Errorf("snapshot: %w: share source %q", ErrInvalid, sh.Source)
		}
		k := shareKey{sh.Scope, sh.Region, sh.Source}
		if seen[k] {
			return nil, fmt.Errorf("snapshot: %w: duplicate %s share of region %s scope %s", ErrInvalid, sh.Source, sh.Region, sh.Scope)
		}
		seen[k] = true
		rows = append(rows, sh)
	}
	s.judge(rows, d.LoadedAt)
	s.raises = foldRaises(d.Raises, s.regions)
	s.regionRaises = foldRaises(d.Raises, nil) // "*" rows folded into no region
	s.shareRaises, s.acked, s.xmin = regionRaises(d.Raises), ackedBy(d.Instances, s.regions, d.LoadedAt), d.Xmin
	for _, in := range d.Instances {
		if d.InstanceTTL <= 0 || d.LoadedAt.Sub(in.LastSeen) <= d.InstanceTTL {
			s.live[in.Region]++
		}
	}
	return s, nil
}

// addPlans validates and indexes the plans' rules and the tenants' plans.
func (s *Snapshot) addPlans(rules []Rule, tps []TenantPlan) error {
	if len(rules) > 0 {
		s.planRules = make(map[ruleKey]Rule, len(rules))
	}
	for _, r := range rules {
		if r.Plan == "" {
			return fmt.Errorf("%w: plan rule %s/%s names no plan", ErrInvalid, r.Tenant, r.Route)
		}
		if err := r.Validate(); err != nil {
			return fmt.Errorf("plan %s: %w", r.Plan, err)
		}
		k := ruleKey{r.Plan, r.Route}
		if _, dup := s.planRules[k]; dup {
			return fmt.Errorf("%w: duplicate rule %s of plan %s", ErrInvalid, r.Route, r.Plan)
		}
		s.planRules[k] = r
	}
	if len(tps) > 0 {
		s.tenantPlan = make(map[string]string, len(tps))
	}
	for _, tp := range tps {
		if err := ValidateID("tenant", tp.Tenant); err != nil {
			return fmt.Errorf("tenant plan: %w", err)
		}
		if err := ValidateID("plan", tp.Plan); err != nil {
			return fmt.Errorf("plan of tenant %s: %w", tp.Tenant, err)
		}
		if _, dup := s.tenantPlan[tp.Tenant]; dup {
			return fmt.Errorf("%w: tenant %s assigned two plans", ErrInvalid, tp.Tenant)
		}
		s.tenantPlan[tp.Tenant] = tp.Plan
	}
	return nil
}

// judge fills the share maps from rows (valid, without duplicates) as of store time at
// (zero: nothing expires); see NewSnapshot.
func (s *Snapshot) judge(rows []Share, at time.Time) {
	s.asOf, s.nextExpiry, s.transitional, s.rebScopes = at, time.Time{}, nil, nil
	s.shares = make(map[shareKey]Share, len(rows))
	s.rows = rows[:0:0]
	next := func(t time.Time) {
		if s.nextExpiry.IsZero() || t.Before(s.nextExpiry) {
			s.nextExpiry = t
		}
	}
	rebScope := make(map[Scope]bool)
	for _, sh := range rows {
		k := shareKey{sh.Scope, sh.Region, sh.Source}
		if !sh.ExpiresAt.IsZero() && !at.IsZero() {
			switch {
			case !at.Before(sh.ExpiresAt.Add(ExpiryGrace)):
				continue // gone for every holder
			case !at.Before(sh.ExpiresAt.Add(-ExpiryGrace)):
				if s.transitional == nil {
					s.transitional = map[shareKey]bool{}
				}
				s.transitional[k] = true
				next(sh.ExpiresAt.Add(ExpiryGrace))
			default:
				next(sh.ExpiresAt.Add(-ExpiryGrace))
			}
		}
		s.rows = append(s.rows, sh)
		s.shares[k] = sh
		if sh.Source == SourceRebalancer && !rebScope[sh.Scope] {
			rebScope[sh.Scope] = true
			s.rebScopes = append(s.rebScopes, sh.Scope)
		}
	}
	slices.SortFunc(s.rebScopes, func(a, b Scope) int { return strings.Compare(a.String(), b.String()) })
}

// At returns a copy of s with its time-bounded shares judged again as of store time at
// (NewSnapshot): what a holder that cannot reload enforces once its own estimate of the
// store's clock passes NextExpiry. Everything else is shared with s; s is unchanged. An
// at before AsOf returns s.
func (s *Snapshot) At(at time.Time) *Snapshot {
	if !at.After(s.asOf) || s.asOf.IsZero() {
		return s
	}
	c := *s
	c.judge(s.rows, at)
	return &c
}

// InTransition reports whether some share of the snapshot is within ExpiryGrace of its
// expiry: its lookups then get the lower of it and its replacement, so a scope may sum
// below 1 (never above) until the transition ends.
func (s *Snapshot) InTransition() bool { return len(s.transitional) > 0 }

// AsOf is the store time the snapshot's shares are judged at: LoadedAt, or At's time.
func (s *Snapshot) AsOf() time.Time { return s.asOf }

// KnowsRegion reports whether region is one of the snapshot's regions.
func (s *Snapshot) KnowsRegion(region string) bool { return slices.Contains(s.regions, region) }

// Regions lists the known regions in the order they were loaded.
func (s *Snapshot) Regions() []string { return append([]string(nil), s.regions...) }

// RebalancerScopes lists the distinct scopes that have rebalancer rows (in any region),
// sorted by String(); a new slice on every call. The rebalancer uses it to find the pairs
// whose rows outlived their demand.
func (s *Snapshot) RebalancerScopes() []Scope { return slices.Clone(s.rebScopes) }

// LoadedAt is when the data behind the snapshot was read.
func (s *Snapshot) LoadedAt() time.Time { return s.loadedAt }

// NextExpiry is the next instant, by the store's clock, at which a time-bounded share of
// the snapshot changes state (enters or leaves its transition: ExpiresAt -/+
// ExpiryGrace); zero when none does. The holder must then reload, or, when it cannot,
// enforce At(NextExpiry): both after NextExpiry minus AsOf has passed since the load (a
// duration, so the holder's time of day never enters).
func (s *Snapshot) NextExpiry() time.Time { return s.nextExpiry }

// Skipped lists the rows the loader left out (SnapshotData.Skipped); a new slice.
func (s *Snapshot) Skipped() []SkippedRow { return slices.Clone(s.skipped) }

// RuleCount is the number of rules loaded.
func (s *Snapshot) RuleCount() int { return s.nRules }

// Tenant returns the tenant of a valid (known, unrevoked) API key.
func (s *Snapshot) Tenant(h KeyHash) (string, bool) {
	t, ok := s.keys[h]
	return t, ok
}

// Rule resolves the rule for a request: tenant+route, else tenant+"*", else the
// tenant's plan's rule for route, else its plan's for "*", else "*"+route, else the
// default rule. A plan's rule comes back with Plan set; the caller's buckets stay the
// tenant's own (they are keyed by the request's tenant, never the rule's).
func (s *Snapshot) Rule(tenant, route string) Rule {
	if r, ok := s.rules[ruleKey{tenant, route}]; ok {
		return r
	}
	if r, ok := s.rules[ruleKey{tenant, Wildcard}]; ok {
		return r
	}
	if p, ok := s.tenantPlan[tenant]; ok {
		if r, ok := s.planRules[ruleKey{p, route}]; ok {
			return r
		}
		if r, ok := s.planRules[ruleKey{p, Wildcard}]; ok {
			return r
		}
	}
	if r, ok := s.rules[ruleKey{Wildcard, route}]; ok {
		return r
	}
	return s.rules[ruleKey{Wildcard, Wildcard}]
}

// TenantPlan is tenant's plan, and false when it has none.
func (s *Snapshot) TenantPlan(tenant string) (string, bool) {
	p, ok := s.tenantPlan[tenant]
	return p, ok
}

// PlanRuleCount is the number of plans' rules loaded.
func (s *Snapshot) PlanRuleCount() int { return len(s.planRules) }

// Share is region's share of tenant's rule for route. Overrides (most specific scope
// first: tenant/route, tenant, "*") beat rebalancer values (most specific first); an
// override at a scope covers everything inside it. With neither, the regions split
// equally. Only shares in force at LoadedAt are in the snapshot (see NewSnapshot).
func (s *Snapshot) Share(region, tenant, route string) (float64, Source) {
	v, src, _ := s.shareScope(region, tenant, route)
	return v, src
}

// shareScope is Share with how specific the row that decided is: 0 the pair's, 1 the
// tenant's, 2 the "*" scope's, 3 none (the equal split). Within a transition it is the
// wider of the two rows that may decide, since either may be in force.
func (s *Snapshot) shareScope(region, tenant, route string) (float64, Source, int) {
	v, src, trans, sc := s.share(region, tenant, route, false)
	if trans {
		// A share in transition: the lower of it and what replaces it (NewSnapshot).
		after, asrc, _, asc := s.share(region, tenant, route, true)
		sc = max(sc, asc)
		if after < v {
			return after, asrc, sc
		}
	}
	return v, src, sc
}

// share resolves Share; skip leaves out the transitional rows, and trans says whether the
// row that decided is transitional, scope how specific it is (shareScope).
func (s *Snapshot) share(region, tenant, route string, skip bool) (float64, Source, bool, int) {
	if sh, trans, i, ok := s.shareRow(region, tenant, route, skip); ok {
		return sh.Share, sh.Source, trans, i
	}
	n := len(s.regions)
	if n == 0 {
		n = 1
	}
	return 1 / float64(n), SourceDefault, false, 3
}

// shareRow is the row that decides region's share of tenant's route (skip leaves out the
// transitional rows), whether it is transitional, and how specific its scope is
// (shareScope); false when none does (the equal split).
func (s *Snapshot) shareRow(region, tenant, route string, skip bool) (Share, bool, int, bool) {
	scopes := [...]Scope{{tenant, route}, {tenant, Wildcard}, GlobalScope}
	for _, src := range [...]Source{SourceOverride, SourceRebalancer} {
		for i, sc := range scopes {
			k := shareKey{sc, region, src}
			if sh, ok := s.shares[k]; ok {
				t := s.transitional != nil && s.transitional[k]
				if t && skip {
					continue
				}
				sh.Source = src
				return sh, t, i, true
			}
		}
	}
	return Share{}, false, 0, false
}

// ScopeRow is region's share for exactly this scope (an override before a rebalancer
// value; no fallback to wider scopes), and false when there is none; ratectl and the
// rebalancer use it.
func (s *Snapshot) ScopeRow(region string, scope Scope) (Share, bool) {
	scope = scope.normal()
	for _, src := range [...]Source{SourceOverride, SourceRebalancer} {
		if sh, ok := s.shares[shareKey{scope, region, src}]; ok {
			return sh, true
		}
	}
	return Share{}, false
}

// ScopeShareOf is region's row of source for exactly this scope, and false when there is
// none. The rebalancer uses it to compare the rows it read with those it writes over.
func (s *Snapshot) ScopeShareOf(region string, scope Scope, src Source) (Share, bool) {
	sh, ok := s.shares[shareKey{scope.normal(), region, src}]
	return sh, ok
}

// RegionalRule is the rule for a request scaled by region's share (Share).
func (s *Snapshot) RegionalRule(region, tenant, route string) (Rule, Limit, float64) {
	r := s.Rule(tenant, route)
	share, _ := s.Share(region, tenant, route)
	return r, Scale(r.Capacity, r.RefillPerSecond, share), share
}

// LiveInstances is the number of gateways of region whose heartbeat is fresh; 0 when
// unknown.
func (s *Snapshot) LiveInstances(region string) int { return s.live[region] }
