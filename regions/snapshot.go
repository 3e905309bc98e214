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
	Keys  []APIKey // revoked keys may be included; they never authenticate
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
	regions  []string
	rules    map[ruleKey]Rule
	keys     map[KeyHash]string // hash -> tenant, valid keys only
	shares   map[shareKey]Share
	live     map[string]int
	loadedAt time.Time
	nRules   int
	skipped  []SkippedRow
	// nextExpiry is the earliest expiry of an override in force (zero: none).
	nextExpiry time.Time
	// rebScopes are the distinct scopes with rebalancer rows, sorted by String().
	rebScopes []Scope
	// raises are, per region, the latest raise of each (tenant, route), the rows for
	// every region ("*") folded in (raise.go).
	raises map[string]map[raiseKey]Raise
}

type ruleKey struct{ tenant, route string }

type shareKey struct {
	scope  Scope
	region string
	source Source
}

// NewSnapshot validates data and builds a Snapshot. Any invalid row fails the whole
// snapshot, so a reloader keeps its previous one (the store's loader leaves out, and
// lists in Skipped, the rows it cannot accept, so they never get here).
//
// Expiry is judged once, here, by LoadedAt (the store's clock: the database's now()): a
// share whose ExpiresAt is not after LoadedAt is left out, and NextExpiry is the earliest
// expiry of those kept, when the holder must load a new snapshot (the Reloader does).
// No method takes the reader's clock, so gateways whose clocks disagree still apply the
// same shares. With LoadedAt zero nothing is left out.
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
	for _, k := range d.Keys {
		if err := ValidateID("tenant", k.Tenant); err != nil {
			return nil, fmt.Errorf("snapshot: key %d: %w", k.ID, err)
		}
		if k.RevokedAt.IsZero() {
			s.keys[k.Hash] = k.Tenant
		}
	}
	rebScope := make(map[Scope]bool)
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
		if !sh.ExpiresAt.IsZero() && !d.LoadedAt.IsZero() {
			if !d.LoadedAt.Before(sh.ExpiresAt) {
				continue // expired by the store's clock
			}
			if s.nextExpiry.IsZero() || sh.ExpiresAt.Before(s.nextExpiry) {
				s.nextExpiry = sh.ExpiresAt
			}
		}
		k := shareKey{sh.Scope, sh.Region, sh.Source}
		if _, dup := s.shares[k]; dup {
			return nil, fmt.Errorf("snapshot: %w: duplicate %s share of region %s scope %s", ErrInvalid, sh.Source, sh.Region, sh.Scope)
		}
		s.shares[k] = sh
		if sh.Source == SourceRebalancer && !rebScope[sh.Scope] {
			rebScope[sh.Scope] = true
			s.rebScopes = append(s.rebScopes, sh.Scope)
		}
	}
	slices.SortFunc(s.rebScopes, func(a, b Scope) int { return strings.Compare(a.String(), b.String()) })
	s.raises = foldRaises(d.Raises, s.regions)
	for _, in := range d.Instances {
		if d.InstanceTTL <= 0 || d.LoadedAt.Sub(in.LastSeen) <= d.InstanceTTL {
			s.live[in.Region]++
		}
	}
	return s, nil
}

// Regions lists the known regions in the order they were loaded.
func (s *Snapshot) Regions() []string { return append([]string(nil), s.regions...) }

// RebalancerScopes lists the distinct scopes that have rebalancer rows (in any region),
// sorted by String(); a new slice on every call. The rebalancer uses it to find the pairs
// whose rows outlived their demand.
func (s *Snapshot) RebalancerScopes() []Scope { return slices.Clone(s.rebScopes) }

// LoadedAt is when the data behind the snapshot was read.
func (s *Snapshot) LoadedAt() time.Time { return s.loadedAt }

// NextExpiry is the earliest expiry of an override in the snapshot, by the store's clock
// (zero: none expires). The snapshot is stale from then on: reload after NextExpiry minus
// LoadedAt has passed (a duration, so the holder's clock never enters).
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

// Rule resolves the rule for a request: tenant+route, else tenant+"*", else "*"+route,
// else the default rule.
func (s *Snapshot) Rule(tenant, route string) Rule {
	for _, k := range [...]ruleKey{{tenant, route}, {tenant, Wildcard}, {Wildcard, route}} {
		if r, ok := s.rules[k]; ok {
			return r
		}
	}
	return s.rules[ruleKey{Wildcard, Wildcard}]
}

// Share is region's share of tenant's rule for route. Overrides (most specific scope
// first: tenant/route, tenant, "*") beat rebalancer values (most specific first); an
// override at a scope covers everything inside it. With neither, the regions split
// equally. Only shares in force at LoadedAt are in the snapshot (see NewSnapshot).
func (s *Snapshot) Share(region, tenant, route string) (float64, Source) {
	scopes := [...]Scope{{tenant, route}, {tenant, Wildcard}, GlobalScope}
	for _, src := range [...]Source{SourceOverride, SourceRebalancer} {
		for _, sc := range scopes {
			if sh, ok := s.shares[shareKey{sc, region, src}]; ok {
				return sh.Share, src
			}
		}
	}
	n := len(s.regions)
	if n == 0 {
		n = 1
	}
	return 1 / float64(n), SourceDefault
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
