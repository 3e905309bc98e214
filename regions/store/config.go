package store

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// Config is the declarative control-plane configuration that `ratectl apply -f` writes and
// `ratectl export` reads: regions, rules, operator share overrides and API key hashes.
//
// Each section is managed only when present: a nil section is left as it is in the
// database, and a present one adds what it lists and changes what differs. Deleting what
// a section does not list is explicit: only the sections named in Prune, which must be
// present and not empty (an empty section never deletes everything). Rebalancer shares
// are never touched, and keys are only ever revoked, never deleted. Lists are kept sorted
// by Normalize, so two equal configurations print the same.
type Config struct {
	Regions   *[]string
	Rules     *[]regions.Rule
	Overrides *[]Override
	Keys      *[]KeySpec
	// Plans are named sets of per-route rules (regions.Plan). A plan listed is described
	// whole: its rules the file does not list are deleted with it. TenantPlans assign
	// tenants to plans.
	// omitempty: the fingerprint (stateOf) of a configuration without them is what it
	// was before plans.
	Plans       *[]regions.Plan       `json:",omitempty"`
	TenantPlans *[]regions.TenantPlan `json:",omitempty"`
	Prune       Prune
}

// Prune names the sections of a Config whose objects it does not list are deleted (keys
// revoked).
type Prune struct {
	Regions, Rules, Overrides, Keys bool
	Plans                           bool `json:",omitempty"`
	TenantPlans                     bool `json:",omitempty"`
}

// Override is the operator override of one scope: a share per region (every region, summing
// to 1), an optional expiry, and why.
type Override struct {
	Scope     regions.Scope
	Shares    map[string]float64
	ExpiresAt time.Time // zero: never expires
	Reason    string
}

// KeySpec is one valid (unrevoked) API key, known by the SHA-256 of its secret: the
// secret itself never leaves the machine that made it (ratectl keys import --sha256).
type KeySpec struct {
	Hash   regions.KeyHash
	Tenant string
	Label  string
}

// Normalize validates c and sorts its lists; errors wrap regions.ErrInvalid.
func (c *Config) Normalize() error {
	var errs []error
	for _, p := range []struct {
		on      bool
		section string
		n       int // -1: absent
	}{
		{c.Prune.Regions, "regions", sectionLen(c.Regions)},
		{c.Prune.Rules, "rules", sectionLen(c.Rules)},
		{c.Prune.Overrides, "overrides", sectionLen(c.Overrides)},
		{c.Prune.Keys, "keys", sectionLen(c.Keys)},
		{c.Prune.Plans, "plans", sectionLen(c.Plans)},
		{c.Prune.TenantPlans, "tenant_plans", sectionLen(c.TenantPlans)},
	} {
		switch {
		case p.on && p.n < 0:
			errs = append(errs, fmt.Errorf("%w prune %s: there is no %s section to prune by", regions.ErrInvalid, p.section, p.section))
		case p.on && p.n == 0:
			errs = append(errs, fmt.Errorf("%w prune %s: the %s section is empty, and an empty section never deletes everything", regions.ErrInvalid, p.section, p.section))
		}
	}
	if c.Regions != nil {
		seen := map[string]bool{}
		for _, r := range *c.Regions {
			if err := regions.ValidateID("region", r); err != nil {
				errs = append(errs, fmt.Errorf("regions: %w", err))
			} else if seen[r] {
				errs = append(errs, fmt.Errorf("%w regions: %s listed twice", regions.ErrInvalid, r))
			}
			seen[r] = true
		}
		slices.Sort(*c.Regions)
	}
	if c.Rules != nil {
		seen := map[[2]string]bool{}
		for i := range *c.Rules {
			r := &(*c.Rules)[i]
			if r.Shards == 0 {
				r.Shards = 1
			}
			r.UpdatedAt = time.Time{}
			if err := r.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("rules %s/%s: %w", r.Tenant, r.Route, err))
			}
			k := [2]string{r.Tenant, r.Route}
			if seen[k] {
				errs = append(errs, fmt.Errorf("%w rules: %s/%s listed twice", regions.ErrInvalid, r.Tenant, r.Route))
			}
			seen[k] = true
		}
		if !seen[[2]string{regions.Wildcard, regions.Wildcard}] {
			errs = append(errs, fmt.Errorf("%w rules: the default rule (tenant *, route *) must be listed: it cannot be deleted", regions.ErrInvalid))
		}
		slices.SortFunc(*c.Rules, func(a, b regions.Rule) int {
			return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Route, b.Route))
		})
	}
	if c.Overrides != nil {
		seen := map[string]bool{}
		for i := range *c.Overrides {
			o := &(*c.Overrides)[i]
			o.Scope = normalScope(o.Scope)
			if err := o.Scope.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("overrides: %w", err))
				continue
			}
			s := o.Scope.String()
			if seen[s] {
				errs = append(errs, fmt.Errorf("%w overrides: scope %s listed twice", regions.ErrInvalid, s))
			}
			seen[s] = true
			if strings.TrimSpace(o.Reason) == "" {
				errs = append(errs, fmt.Errorf("%w overrides %s: a reason is required", regions.ErrInvalid, s))
			}
			if !o.ExpiresAt.IsZero() {
				o.ExpiresAt = o.ExpiresAt.UTC().Truncate(time.Microsecond)
			}
			if c.Regions != nil {
				if err := regions.ValidateShares(o.Shares, *c.Regions); err != nil {
					errs = append(errs, fmt.Errorf("overrides %s: %w", s, err))
				}
			}
		}
		slices.SortFunc(*c.Overrides, func(a, b Override) int { return cmp.Compare(a.Scope.String(), b.Scope.String()) })
	}
	if c.Keys != nil {
		seen := map[regions.KeyHash]bool{}
		for _, k := range *c.Keys {
			if err := regions.ValidateID("tenant", k.Tenant); err != nil {
				errs = append(errs, fmt.Errorf("keys sha256:%s: %w", shortHash(k.Hash), err))
			}
			if err := validateLabel(k.Label); err != nil {
				errs = append(errs, fmt.Errorf("keys sha256:%s: %w", shortHash(k.Hash), err))
			}
			if seen[k.Hash] {
				errs = append(errs, fmt.Errorf("%w keys: sha256:%s listed twice", regions.ErrInvalid, shortHash(k.Hash)))
			}
			seen[k.Hash] = true
		}
		slices.SortFunc(*c.Keys, func(a, b KeySpec) int {
			return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(hex.EncodeToString(a.Hash[:]), hex.EncodeToString(b.Hash[:])))
		})
	}
	errs = append(errs, c.normalizePlans()...)
	return errors.Join(errs...)
}

// normalizePlans validates and sorts the plans and tenant_plans sections: plan names and
// routes once each, every rule valid (Plan set to its plan's name, Tenant "*").
func (c *Config) normalizePlans() []error {
	var errs []error
	if c.Plans != nil {
		seen := map[string]bool{}
		for i := range *c.Plans {
			p := &(*c.Plans)[i]
			if err := regions.ValidateID("plan", p.Name); err != nil {
				errs = append(errs, fmt.Errorf("plans: %w", err))
				continue
			}
			if seen[p.Name] {
				errs = append(errs, fmt.Errorf("%w plans: %s listed twice", regions.ErrInvalid, p.Name))
			}
			seen[p.Name] = true
			if p.Rules == nil {
				p.Rules = []regions.Rule{}
			}
			routes := map[string]bool{}
			for j := range p.Rules {
				r := &p.Rules[j]
				r.Plan, r.Tenant, r.UpdatedAt = p.Name, regions.Wildcard, time.Time{}
				if r.Shards == 0 {
					r.Shards = 1
				}
				if err := r.Validate(); err != nil {
					errs = append(errs, fmt.Errorf("plans %s route %s: %w", p.Name, r.Route, err))
				}
				if routes[r.Route] {
					errs = append(errs, fmt.Errorf("%w plans %s: route %s listed twice", regions.ErrInvalid, p.Name, r.Route))
				}
				routes[r.Route] = true
			}
			slices.SortFunc(p.Rules, func(a, b regions.Rule) int { return cmp.Compare(a.Route, b.Route) })
		}
		slices.SortFunc(*c.Plans, func(a, b regions.Plan) int { return cmp.Compare(a.Name, b.Name) })
	}
	if c.TenantPlans != nil {
		seen := map[string]bool{}
		for _, tp := range *c.TenantPlans {
			if err := regions.ValidateID("tenant", tp.Tenant); err != nil {
				errs = append(errs, fmt.Errorf("tenant_plans: %w", err))
				continue
			}
			if err := regions.ValidateID("plan", tp.Plan); err != nil {
				errs = append(errs, fmt.Errorf("tenant_plans %s: %w", tp.Tenant, err))
			}
			if seen[tp.Tenant] {
				errs = append(errs, fmt.Errorf("%w tenant_plans: tenant %s listed twice (a tenant has one plan)", regions.ErrInvalid, tp.Tenant))
			}
			seen[tp.Tenant] = true
		}
		slices.SortFunc(*c.TenantPlans, func(a, b regions.TenantPlan) int { return cmp.Compare(a.Tenant, b.Tenant) })
	}
	return errs
}

// sectionLen is the length of a section, -1 when absent.
func sectionLen[T any](s *[]T) int {
	if s == nil {
		return -1
	}
	return len(*s)
}

func normalScope(s regions.Scope) regions.Scope {
	if s.Route == "" || s.Tenant == regions.Wildcard {
		s.Route = regions.Wildcard
	}
	return s
}

func shortHash(h regions.KeyHash) string { return hex.EncodeToString(h[:6]) }

// querier is what reading the configuration needs: the pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Export reads the whole configuration, every section present: regions, rules, operator
// overrides in force (an expired one is over, though its rows stay until the rebalancer
// deletes them), the unrevoked keys, the plans and the tenants' plans. Apply of the result plans no change.
func (s *Store) Export(ctx context.Context) (Config, error) {
	c, _, err := readConfig(ctx, s.pool)
	if err != nil {
		return Config{}, fmt.Errorf("export: %w", err)
	}
	return c, nil
}

// readConfig reads the whole configuration as of the database's clock, which it returns:
// overrides expired by then are left out (gateways no longer apply them).
func readConfig(ctx context.Context, q querier) (Config, time.Time, error) {
	rows, _ := q.Query(ctx, `SELECT now()`)
	now, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[time.Time])
	if err != nil {
		return Config{}, now, fmt.Errorf("read the database clock: %w", err)
	}
	names, err := regionNames(ctx, q)
	if err != nil {
		return Config{}, now, fmt.Errorf("read regions: %w", err)
	}
	rows, _ = q.Query(ctx, `SELECT tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at, bands
		FROM rate_limit_rule ORDER BY tenant_id, route_id`)
	rules, err := pgx.CollectRows(rows, scanRule)
	if err != nil {
		return Config{}, now, fmt.Errorf("read rules: %w", err)
	}
	for i := range rules {
		rules[i].UpdatedAt = time.Time{}
	}
	rows, _ = q.Query(ctx, `SELECT scope, region, share, source, expires_at, updated_at, reason
		FROM region_share WHERE source = 'override' AND (expires_at IS NULL OR expires_at > $1)
		ORDER BY scope, region`, now)
	shares, err := pgx.CollectRows(rows, scanShare)
	if err != nil {
		return Config{}, now, fmt.Errorf("read overrides: %w", err)
	}
	overrides := []Override{}
	for _, sh := range shares {
		n := len(overrides)
		if n == 0 || overrides[n-1].Scope != sh.Scope {
			overrides = append(overrides, Override{Scope: sh.Scope, Shares: map[string]float64{}, Reason: sh.Reason})
			n++
		}
		o := &overrides[n-1]
		o.Shares[sh.Region] = sh.Share
		if !sh.ExpiresAt.IsZero() {
			o.ExpiresAt = sh.ExpiresAt.UTC()
		}
	}
	rows, _ = q.Query(ctx, `SELECT key_hash, tenant_id, label FROM api_key WHERE revoked_at IS NULL ORDER BY tenant_id, key_hash`)
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeySpec, error) {
		var (
			k    KeySpec
			hash []byte
		)
		err := row.Scan(&hash, &k.Tenant, &k.Label)
		copy(k.Hash[:], hash)
		return k, err
	})
	if err != nil {
		return Config{}, now, fmt.Errorf("read keys: %w", err)
	}
	plans, err := readPlans(ctx, q, "")
	if err != nil {
		return Config{}, now, err
	}
	for i := range plans {
		for j := range plans[i].Rules {
			plans[i].Rules[j].UpdatedAt = time.Time{}
		}
	}
	tenantPlans, err := readTenantPlans(ctx, q)
	if err != nil {
		return Config{}, now, err
	}
	c := Config{Regions: &names, Rules: &rules, Overrides: &overrides, Keys: &keys, Plans: &plans, TenantPlans: &tenantPlans}
	if err := c.Normalize(); err != nil {
		// Only an incomplete database gets here (no default rule); report, do not hide.
		return c, now, fmt.Errorf("the stored configuration is not valid: %w", err)
	}
	return c, now, nil
}
