package store

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
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
	Prune     Prune
}

// Prune names the sections of a Config whose objects it does not list are deleted (keys
// revoked).
type Prune struct {
	Regions, Rules, Overrides, Keys bool
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
	return errors.Join(errs...)
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
// deletes them) and the unrevoked keys. Apply of the result plans no change.
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
	rows, _ = q.Query(ctx, `SELECT name FROM region ORDER BY name`)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return Config{}, now, fmt.Errorf("read regions: %w", err)
	}
	rows, _ = q.Query(ctx, `SELECT tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at
		FROM rate_limit_rule ORDER BY tenant_id, route_id`)
	rules, err := pgx.CollectRows(rows, pgx.RowToStructByPos[regions.Rule])
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
	c := Config{Regions: &names, Rules: &rules, Overrides: &overrides, Keys: &keys}
	if err := c.Normalize(); err != nil {
		// Only an incomplete database gets here (no default rule); report, do not hide.
		return c, now, fmt.Errorf("the stored configuration is not valid: %w", err)
	}
	return c, now, nil
}

// Plan is what Apply(desired) would write to the database as it is now, in order.
func (s *Store) Plan(ctx context.Context, desired Config) ([]Change, error) {
	changes, _, err := s.PlanState(ctx, desired)
	return changes, err
}

// PlanState is Plan and the state of the database it was made against: a fingerprint of
// the sections desired manages (regions too when it manages overrides), for ApplyState.
func (s *Store) PlanState(ctx context.Context, desired Config) ([]Change, string, error) {
	if err := desired.Normalize(); err != nil {
		return nil, "", err
	}
	cur, now, err := readConfig(ctx, s.pool)
	if err != nil {
		return nil, "", fmt.Errorf("plan: %w", err)
	}
	changes, err := plan(cur, desired, now)
	if err != nil {
		return nil, "", err
	}
	return changes, stateOf(cur, desired), nil
}

// ErrStateChanged is ApplyState's refusal: the database is no longer as the plan found it.
var ErrStateChanged = errors.New("the database changed since the plan was made")

// stateOf fingerprints the sections of cur that desired manages.
func stateOf(cur, desired Config) string {
	var v Config
	if desired.Regions != nil || desired.Overrides != nil {
		v.Regions = cur.Regions
	}
	if desired.Rules != nil {
		v.Rules = cur.Rules
	}
	if desired.Overrides != nil {
		v.Overrides = cur.Overrides
	}
	if desired.Keys != nil {
		v.Keys = cur.Keys
	}
	b, err := json.Marshal(v) // sorted lists (Normalize) and map keys: deterministic
	if err != nil {
		panic(fmt.Sprintf("store: marshal a configuration: %v", err)) // plain values only
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Apply makes the database equal to desired, section by section, in one transaction that
// first locks the four tables against writers (readers, gateways among them, go on): the
// plan is recomputed inside it, so what is written is exactly the returned plan. Every
// change is recorded with actor and reason (audit_log for regions, rules and keys,
// region_share_history for overrides). An empty plan writes nothing.
func (s *Store) Apply(ctx context.Context, desired Config, actor, reason string) ([]Change, error) {
	return s.ApplyState(ctx, desired, "", actor, reason)
}

// ApplyState is Apply of a plan made against state (PlanState): under the lock, before
// writing anything, it refuses with ErrStateChanged when the sections desired manages
// are no longer in that state, so what is written is the plan that was reviewed. An empty
// state skips the check (Apply).
func (s *Store) ApplyState(ctx context.Context, desired Config, state, actor, reason string) ([]Change, error) {
	if err := desired.Normalize(); err != nil {
		return nil, err
	}
	if actor == "" || reason == "" {
		return nil, fmt.Errorf("apply: %w: an actor and a reason are required", regions.ErrInvalid)
	}
	var changes []Change
	err := s.write(ctx, audit{actor, reason}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE `+strings.Join(desired.tables(), ", ")+` IN EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		cur, now, err := readConfig(ctx, tx)
		if err != nil {
			return err
		}
		if got := stateOf(cur, desired); state != "" && got != state {
			return fmt.Errorf("%w (planned against %s, now %s)", ErrStateChanged, shortState(state), shortState(got))
		}
		if changes, err = plan(cur, desired, now); err != nil {
			return err
		}
		return applyChanges(ctx, tx, changes)
	})
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	return changes, nil
}

// tables are the tables Apply(c) locks against writers while it plans and writes: those
// of the sections c manages, and region for any of them that reads the region set (the
// overrides' shares name every region). A rules-only file leaves keys and shares free.
func (c Config) tables() []string {
	var ts []string
	if c.Regions != nil || c.Overrides != nil {
		ts = append(ts, "region", "region_share")
	}
	if c.Rules != nil {
		ts = append(ts, "rate_limit_rule")
	}
	if c.Keys != nil {
		ts = append(ts, "api_key")
	}
	if len(ts) == 0 {
		ts = []string{"region"} // nothing managed: the plan is empty; lock the least
	}
	return ts
}

// applyChanges writes changes in order. The rule changes, however many (a file of 100,000
// rules), are written together at the place of the first: one DELETE and one
// INSERT ... ON CONFLICT of arrays, not a statement per rule.
func applyChanges(ctx context.Context, tx pgx.Tx, changes []Change) error {
	rulesDone := false
	for _, c := range changes {
		if c.Object == "rule" {
			if !rulesDone {
				if err := applyRuleChanges(ctx, tx, changes); err != nil {
					return fmt.Errorf("rules: %w", dbErr(err))
				}
				rulesDone = true
			}
			continue
		}
		if err := c.apply(ctx, tx); err != nil {
			return fmt.Errorf("%s %s %s: %w", c.Action, c.Object, c.ID, dbErr(err))
		}
	}
	return nil
}

// applyRuleChanges writes every rule change of changes in two statements: the deletes,
// then the adds and changes as one upsert.
func applyRuleChanges(ctx context.Context, tx pgx.Tx, changes []Change) error {
	var (
		delTenant, delRoute []string
		tenant, route       []string
		capacity            []int64
		refill              []float64
		shadow              []bool
		shards              []int32
	)
	for _, c := range changes {
		if c.Object != "rule" {
			continue
		}
		r := c.rule
		if c.Action == ActionDelete {
			delTenant, delRoute = append(delTenant, r.Tenant), append(delRoute, r.Route)
			continue
		}
		tenant, route = append(tenant, r.Tenant), append(route, r.Route)
		capacity, refill = append(capacity, r.Capacity), append(refill, r.RefillPerSecond)
		shadow, shards = append(shadow, r.Shadow), append(shards, int32(r.Shards))
	}
	if len(delTenant) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM rate_limit_rule r USING unnest($1::text[], $2::text[]) AS d(tenant_id, route_id)
			WHERE r.tenant_id = d.tenant_id AND r.route_id = d.route_id`, delTenant, delRoute); err != nil {
			return fmt.Errorf("delete %d: %w", len(delTenant), err)
		}
	}
	if len(tenant) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at)
			SELECT t, r, c, f, s, n, now() FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[], $5::bool[], $6::int[]) AS u(t, r, c, f, s, n)
			ON CONFLICT (tenant_id, route_id) DO UPDATE SET capacity = EXCLUDED.capacity,
				refill_per_second = EXCLUDED.refill_per_second, shadow = EXCLUDED.shadow,
				shards = EXCLUDED.shards, updated_at = now()`,
			tenant, route, capacity, refill, shadow, shards); err != nil {
			return fmt.Errorf("write %d: %w", len(tenant), err)
		}
	}
	return nil
}

func shortState(s string) string {
	if len(s) > len("sha256:")+12 {
		return s[:len("sha256:")+12]
	}
	return s
}

// Order of the writes: regions are added first (rules and overrides may name them),
// removed last (after the overrides that named them are gone).
const (
	orderAddRegion = iota
	orderRule
	orderOverride
	orderKey
	orderRemoveRegion
)

// plan compares the sections desired manages with cur (a whole configuration, read at
// now on the database's clock). An override of desired that expires by now is refused: it
// would be written and never apply.
func plan(cur, desired Config, now time.Time) ([]Change, error) {
	if desired.Overrides != nil {
		for _, o := range *desired.Overrides {
			if !o.ExpiresAt.IsZero() && !o.ExpiresAt.After(now) {
				return nil, fmt.Errorf("%w override %s: expires_at %s is in the past (the database's clock reads %s): drop the override or give a later time",
					regions.ErrInvalid, o.Scope, o.ExpiresAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
			}
		}
	}
	var out []Change
	regionSet := *cur.Regions
	if desired.Regions != nil {
		out = append(out, planRegions(*cur.Regions, *desired.Regions, desired.Prune.Regions)...)
		regionSet = kept(*cur.Regions, *desired.Regions, desired.Prune.Regions, func(r string) string { return r })
	}
	if desired.Rules != nil {
		out = append(out, planRules(*cur.Rules, *desired.Rules, desired.Prune.Rules)...)
	}
	overrides := *cur.Overrides
	if desired.Overrides != nil {
		for _, o := range *desired.Overrides {
			if err := regions.ValidateShares(o.Shares, regionSet); err != nil {
				return nil, fmt.Errorf("overrides %s: %w", o.Scope, err)
			}
		}
		out = append(out, planOverrides(*cur.Overrides, *desired.Overrides, desired.Prune.Overrides)...)
		overrides = kept(*cur.Overrides, *desired.Overrides, desired.Prune.Overrides, func(o Override) string { return o.Scope.String() })
	}
	if desired.Regions != nil {
		// An override the file leaves alone must not name a region the file removes.
		for _, o := range overrides {
			for r := range o.Shares {
				if !slices.Contains(regionSet, r) {
					return nil, fmt.Errorf("%w region %s: removed, but the override of %s names it (change the override too)", regions.ErrInvalid, r, o.Scope)
				}
			}
		}
	}
	if desired.Keys != nil {
		ks, err := planKeys(*cur.Keys, *desired.Keys, desired.Prune.Keys)
		if err != nil {
			return nil, err
		}
		out = append(out, ks...)
	}
	slices.SortStableFunc(out, func(a, b Change) int { return cmp.Compare(a.order, b.order) })
	return out, nil
}

// kept is what a section holds after the plan: want, and unless pruned the objects of cur
// it does not list (by key).
func kept[T any](cur, want []T, prune bool, key func(T) string) []T {
	out := slices.Clone(want)
	if prune {
		return out
	}
	listed := map[string]bool{}
	for _, v := range want {
		listed[key(v)] = true
	}
	for _, v := range cur {
		if !listed[key(v)] {
			out = append(out, v)
		}
	}
	return out
}

func planRegions(cur, want []string, prune bool) []Change {
	var out []Change
	for _, r := range want {
		if !slices.Contains(cur, r) {
			out = append(out, Change{Action: ActionAdd, Object: "region", ID: r, order: orderAddRegion,
				apply: func(ctx context.Context, tx pgx.Tx) error {
					// As AddRegion: the new region starts at the floor of every rebalancer
					// scope and at 0 of every override (one in the file rewrites its own).
					return addRegionTx(ctx, tx, r)
				}})
		}
	}
	for _, r := range cur {
		if prune && !slices.Contains(want, r) {
			out = append(out, Change{Action: ActionDelete, Object: "region", ID: r, order: orderRemoveRegion,
				apply: func(ctx context.Context, tx pgx.Tx) error {
					n, err := sharesInForce(ctx, tx, r)
					if err != nil {
						return err
					}
					if n > 0 {
						return fmt.Errorf("%w: %d rebalancer share rows name it: remove it with ratectl regions remove --force, which rescales them", ErrRegionInUse, n)
					}
					if err := deleteExpiredOverrideRows(ctx, tx, r); err != nil {
						return err
					}
					_, err = tx.Exec(ctx, `DELETE FROM region WHERE name = $1`, r)
					return err
				}})
		}
	}
	return out
}

func planRules(cur, want []regions.Rule, prune bool) []Change {
	key := func(r regions.Rule) string { return r.Tenant + "/" + r.Route }
	have := map[string]regions.Rule{}
	for _, r := range cur {
		have[key(r)] = r
	}
	var out []Change
	for _, r := range want {
		old, ok := have[key(r)]
		delete(have, key(r))
		if ok && old == r {
			continue
		}
		c := Change{Action: ActionAdd, Object: "rule", ID: key(r), New: RuleValueOf(r), order: orderRule, rule: r}
		if ok {
			c.Action, c.Old = ActionChange, RuleValueOf(old)
		}
		out = append(out, c)
	}
	if !prune {
		return out
	}
	for _, k := range slices.Sorted(maps.Keys(have)) {
		r := have[k]
		out = append(out, Change{Action: ActionDelete, Object: "rule", ID: k, Old: RuleValueOf(r), order: orderRule, rule: r})
	}
	return out
}

func sameOverride(a, b Override) bool {
	if len(a.Shares) != len(b.Shares) || !a.ExpiresAt.Equal(b.ExpiresAt) {
		return false
	}
	for r, v := range a.Shares {
		w, ok := b.Shares[r]
		if !ok || math.Abs(v-w) > 1e-12 {
			return false
		}
	}
	return true
}

func planOverrides(cur, want []Override, prune bool) []Change {
	have := map[string]Override{}
	for _, o := range cur {
		have[o.Scope.String()] = o
	}
	var out []Change
	for _, o := range want {
		id := o.Scope.String()
		old, ok := have[id]
		delete(have, id)
		if ok && sameOverride(old, o) {
			continue // the reason alone is no change: it lives in the history rows
		}
		c := Change{Action: ActionAdd, Object: "override", ID: id, New: overrideValueOf(o), order: orderOverride,
			apply: func(ctx context.Context, tx pgx.Tx) error {
				var expires *time.Time
				if !o.ExpiresAt.IsZero() {
					expires = &o.ExpiresAt
				}
				regionsNamed := slices.Sorted(maps.Keys(o.Shares))
				for _, r := range regionsNamed {
					if _, err := tx.Exec(ctx, `INSERT INTO region_share (scope, region, share, source, expires_at, updated_at, reason)
						VALUES ($1, $2, $3, 'override', $4, now(), $5)
						ON CONFLICT (scope, region, source) DO UPDATE SET share = EXCLUDED.share,
							expires_at = EXCLUDED.expires_at, updated_at = now(), reason = EXCLUDED.reason`,
						id, r, o.Shares[r], expires, o.Reason); err != nil {
						return err
					}
				}
				_, err := tx.Exec(ctx, `DELETE FROM region_share WHERE scope = $1 AND source = 'override' AND NOT (region = ANY($2))`, id, regionsNamed)
				return err
			}}
		if ok {
			c.Action, c.Old = ActionChange, overrideValueOf(old)
		}
		out = append(out, c)
	}
	if !prune {
		return out
	}
	for _, id := range slices.Sorted(maps.Keys(have)) {
		out = append(out, Change{Action: ActionDelete, Object: "override", ID: id, Old: overrideValueOf(have[id]), order: orderOverride,
			apply: func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `DELETE FROM region_share WHERE scope = $1 AND source = 'override'`, id)
				return err
			}})
	}
	return out
}

func planKeys(cur, want []KeySpec, prune bool) ([]Change, error) {
	have := map[regions.KeyHash]KeySpec{}
	for _, k := range cur {
		have[k.Hash] = k
	}
	var out []Change
	for _, k := range want {
		id := "sha256:" + shortHash(k.Hash)
		old, ok := have[k.Hash]
		delete(have, k.Hash)
		switch {
		case ok && old == k:
			continue
		case ok && old.Tenant != k.Tenant:
			return nil, fmt.Errorf("%w key %s: belongs to tenant %s, the file says %s (a key cannot move: revoke it and import a new one)",
				regions.ErrInvalid, id, old.Tenant, k.Tenant)
		case ok:
			out = append(out, Change{Action: ActionChange, Object: "key", ID: id, Old: keyValueOf(old), New: keyValueOf(k), order: orderKey,
				apply: func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE api_key SET label = $2 WHERE key_hash = $1 AND revoked_at IS NULL`, k.Hash[:], k.Label)
					return err
				}})
		default:
			out = append(out, Change{Action: ActionAdd, Object: "key", ID: id, New: keyValueOf(k), order: orderKey,
				apply: func(ctx context.Context, tx pgx.Tx) error {
					var revoked bool
					err := tx.QueryRow(ctx, `SELECT true FROM api_key WHERE key_hash = $1`, k.Hash[:]).Scan(&revoked)
					if err == nil {
						return fmt.Errorf("%w: this key was revoked, and a revoked key cannot come back: make a new one", regions.ErrInvalid)
					}
					if !errors.Is(err, pgx.ErrNoRows) {
						return err
					}
					_, err = tx.Exec(ctx, `INSERT INTO api_key (key_hash, tenant_id, label) VALUES ($1, $2, $3)`, k.Hash[:], k.Tenant, k.Label)
					return err
				}})
		}
	}
	if !prune {
		return out, nil
	}
	for _, h := range slices.SortedFunc(maps.Keys(have), func(a, b regions.KeyHash) int { return cmp.Compare(hex.EncodeToString(a[:]), hex.EncodeToString(b[:])) }) {
		k := have[h]
		out = append(out, Change{Action: ActionDelete, Object: "key", ID: "sha256:" + shortHash(h), Old: keyValueOf(k), New: &KeyValue{Tenant: k.Tenant, Label: k.Label, Revoked: true}, order: orderKey,
			apply: func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE api_key SET revoked_at = now() WHERE key_hash = $1 AND revoked_at IS NULL`, h[:])
				return err
			}})
	}
	return out, nil
}

// ImportKey stores an API key known only by the SHA-256 of its secret, for tenant: the
// secret was made elsewhere (a secrets manager) and never reaches the database or ratectl.
// ErrExists if that hash is stored already (revoked or not).
func (s *Store) ImportKey(ctx context.Context, hash regions.KeyHash, tenant, label string) (regions.APIKey, error) {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return regions.APIKey{}, fmt.Errorf("import key: %w", err)
	}
	if err := validateLabel(label); err != nil {
		return regions.APIKey{}, fmt.Errorf("import key for %s: %w", tenant, err)
	}
	k := regions.APIKey{Hash: hash, Tenant: tenant, Label: label}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO api_key (key_hash, tenant_id, label) VALUES ($1, $2, $3)
			ON CONFLICT (key_hash) DO NOTHING RETURNING id, created_at`, hash[:], tenant, label).Scan(&k.ID, &k.CreatedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrExists
		}
		return dbErr(err)
	})
	if err != nil {
		return regions.APIKey{}, fmt.Errorf("import key sha256:%s for %s: %w", shortHash(hash), tenant, err)
	}
	return k, nil
}
