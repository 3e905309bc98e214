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
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

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
	if desired.Plans != nil || desired.TenantPlans != nil {
		v.Plans, v.TenantPlans = cur.Plans, cur.TenantPlans
	}
	b, err := json.Marshal(v) // sorted lists (Normalize) and map keys: deterministic
	if err != nil {
		panic(fmt.Sprintf("store: marshal a configuration: %v", err)) // plain values only
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
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
	orderAddPlan // plans before their rules, and before the tenants assigned to them
	orderPlanRule
	orderTenantPlan
	orderRemovePlan // after the tenants assigned to it have left
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
	if desired.Plans != nil || desired.TenantPlans != nil {
		ps, err := planPlanSections(cur, desired)
		if err != nil {
			return nil, err
		}
		out = append(out, ps...)
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
					return deleteRegion(ctx, tx, r)
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
		if ok && old.Equal(r) {
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
				return setOverrideRows(ctx, tx, id, o.Shares, overrideExpiry{at: o.ExpiresAt}, o.Reason)
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
				return clearOverrideRows(ctx, tx, id)
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
					err := insertKey(ctx, tx, &regions.APIKey{Hash: k.Hash, Tenant: k.Tenant, Label: k.Label})
					if errors.Is(err, ErrExists) {
						// Under Apply's lock, a stored hash the plan adds is a revoked key's.
						return fmt.Errorf("%w: this key was revoked, and a revoked key cannot come back: make a new one", regions.ErrInvalid)
					}
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
				_, err := revokeKey(ctx, tx, 0, h[:])
				return err
			}})
	}
	return out, nil
}

// planPlanSections plans the plans and tenant_plans sections of desired against cur,
// and refuses a result in which a tenant is assigned to a plan that does not exist (one
// the file removes, or one never made).
func planPlanSections(cur, desired Config) ([]Change, error) {
	var out []Change
	plans := *cur.Plans
	if desired.Plans != nil {
		out = append(out, planPlans(*cur.Plans, *desired.Plans, desired.Prune.Plans)...)
		plans = kept(*cur.Plans, *desired.Plans, desired.Prune.Plans, func(p regions.Plan) string { return p.Name })
	}
	tps := *cur.TenantPlans
	if desired.TenantPlans != nil {
		out = append(out, planTenantPlans(*cur.TenantPlans, *desired.TenantPlans, desired.Prune.TenantPlans)...)
		tps = kept(*cur.TenantPlans, *desired.TenantPlans, desired.Prune.TenantPlans, func(tp regions.TenantPlan) string { return tp.Tenant })
	}
	exists := map[string]bool{}
	for _, p := range plans {
		exists[p.Name] = true
	}
	had := map[string]bool{}
	for _, p := range *cur.Plans {
		had[p.Name] = true
	}
	for _, tp := range tps {
		switch {
		case exists[tp.Plan]:
		case had[tp.Plan]:
			return nil, fmt.Errorf("%w plan %s: removed, but tenant %s is assigned to it (assign the tenant another plan, or unassign it, in tenant_plans)", regions.ErrInvalid, tp.Plan, tp.Tenant)
		default:
			return nil, fmt.Errorf("%w tenant_plans %s: plan %s does not exist (add it to plans)", regions.ErrInvalid, tp.Tenant, tp.Plan)
		}
	}
	return out, nil
}

// planPlans: a plan listed is described whole (its rules the file does not list are
// deleted); a plan not listed is deleted, its rules with it, only when pruned.
func planPlans(cur, want []regions.Plan, prune bool) []Change {
	have := map[string]regions.Plan{}
	for _, p := range cur {
		have[p.Name] = p
	}
	var out []Change
	for _, p := range want {
		old, ok := have[p.Name]
		delete(have, p.Name)
		if !ok {
			name := p.Name
			out = append(out, Change{Action: ActionAdd, Object: "plan", ID: name, order: orderAddPlan,
				apply: func(ctx context.Context, tx pgx.Tx) error { return insertPlan(ctx, tx, name) }})
		}
		out = append(out, planPlanRules(old.Rules, p.Rules)...)
	}
	if !prune {
		return out
	}
	for _, name := range slices.Sorted(maps.Keys(have)) {
		out = append(out, Change{Action: ActionDelete, Object: "plan", ID: name, order: orderRemovePlan,
			apply: func(ctx context.Context, tx pgx.Tx) error { return deletePlan(ctx, tx, name) }})
	}
	return out
}

// planPlanRules is the changes that make one plan's rules cur into want.
func planPlanRules(cur, want []regions.Rule) []Change {
	have := map[string]regions.Rule{}
	for _, r := range cur {
		have[r.Route] = r
	}
	var out []Change
	for _, r := range want {
		old, ok := have[r.Route]
		delete(have, r.Route)
		if ok && old.Equal(r) {
			continue
		}
		c := Change{Action: ActionAdd, Object: "plan_rule", ID: r.Plan + "/" + r.Route, New: RuleValueOf(r), order: orderPlanRule,
			apply: func(ctx context.Context, tx pgx.Tx) error { return upsertPlanRule(ctx, tx, r) }}
		if ok {
			c.Action, c.Old = ActionChange, RuleValueOf(old)
		}
		out = append(out, c)
	}
	for _, route := range slices.Sorted(maps.Keys(have)) {
		r := have[route]
		out = append(out, Change{Action: ActionDelete, Object: "plan_rule", ID: r.Plan + "/" + r.Route, Old: RuleValueOf(r), order: orderPlanRule,
			apply: func(ctx context.Context, tx pgx.Tx) error { return deletePlanRule(ctx, tx, r.Plan, r.Route) }})
	}
	return out
}

func planTenantPlans(cur, want []regions.TenantPlan, prune bool) []Change {
	have := map[string]string{}
	for _, tp := range cur {
		have[tp.Tenant] = tp.Plan
	}
	var out []Change
	for _, tp := range want {
		old, ok := have[tp.Tenant]
		delete(have, tp.Tenant)
		if ok && old == tp.Plan {
			continue
		}
		c := Change{Action: ActionAdd, Object: "tenant_plan", ID: tp.Tenant, New: &TenantPlanValue{Plan: tp.Plan}, order: orderTenantPlan,
			apply: func(ctx context.Context, tx pgx.Tx) error { return assignPlan(ctx, tx, tp.Tenant, tp.Plan) }}
		if ok {
			c.Action, c.Old = ActionChange, &TenantPlanValue{Plan: old}
		}
		out = append(out, c)
	}
	if !prune {
		return out
	}
	for _, tenant := range slices.Sorted(maps.Keys(have)) {
		out = append(out, Change{Action: ActionDelete, Object: "tenant_plan", ID: tenant, Old: &TenantPlanValue{Plan: have[tenant]}, order: orderTenantPlan,
			apply: func(ctx context.Context, tx pgx.Tx) error { return unassignPlan(ctx, tx, tenant) }})
	}
	return out
}
