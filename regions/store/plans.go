package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/quotaplane/quotaplane/regions"
)

// Plans (tables plan, plan_rule, tenant_plan; migration 00011): a plan is a named set of
// per-route rules that its tenants resolve through. Changing a plan's rule is one row,
// so it changes every tenant of the plan in one statement and one audit row.

// ErrPlanInUse is DeletePlan's refusal: tenants are assigned to the plan.
var ErrPlanInUse = errors.New("plan has tenants")

// Plans lists the plans named name ("" = every plan) with their rules, sorted by name
// then route.
func (s *Store) Plans(ctx context.Context, name string) ([]regions.Plan, error) {
	if name != "" {
		if err := regions.ValidateID("plan", name); err != nil {
			return nil, fmt.Errorf("list plans: %w", err)
		}
	}
	ps, err := readPlans(ctx, s.pool, name)
	if err != nil {
		return nil, fmt.Errorf("list plans: %w", err)
	}
	return ps, nil
}

// readPlans reads the plans named name ("" = all) and their rules, sorted.
func readPlans(ctx context.Context, q querier, name string) ([]regions.Plan, error) {
	rows, _ := q.Query(ctx, `SELECT name FROM plan WHERE $1 = '' OR name = $1 ORDER BY name`, name)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read plans: %w", err)
	}
	rules, err := readPlanRules(ctx, q, name)
	if err != nil {
		return nil, err
	}
	out := make([]regions.Plan, 0, len(names))
	byName := make(map[string]int, len(names))
	for _, n := range names {
		byName[n] = len(out)
		out = append(out, regions.Plan{Name: n, Rules: []regions.Rule{}})
	}
	for _, r := range rules {
		if i, ok := byName[r.Plan]; ok {
			out[i].Rules = append(out[i].Rules, r)
		}
	}
	return out, nil
}

// readPlanRules reads the rules of plan name ("" = every plan), sorted by plan then route,
// as regions.Rule with Plan set and Tenant "*".
func readPlanRules(ctx context.Context, q querier, name string) ([]regions.Rule, error) {
	rows, _ := q.Query(ctx, `SELECT plan, route_id, capacity, refill_per_second, shadow, shards, updated_at, bands
		FROM plan_rule WHERE $1 = '' OR plan = $1 ORDER BY plan, route_id`, name)
	rules, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (regions.Rule, error) {
		var bands []byte
		r := regions.Rule{Tenant: regions.Wildcard}
		if err := row.Scan(&r.Plan, &r.Route, &r.Capacity, &r.RefillPerSecond, &r.Shadow, &r.Shards, &r.UpdatedAt, &bands); err != nil {
			return r, err
		}
		var err error
		r.Bands, err = decodeBands(bands)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("read plan rules: %w", err)
	}
	return rules, nil
}

// readTenantPlans reads every tenant's plan, sorted by tenant.
func readTenantPlans(ctx context.Context, q querier) ([]regions.TenantPlan, error) {
	rows, _ := q.Query(ctx, `SELECT tenant_id, plan FROM tenant_plan ORDER BY tenant_id`)
	tps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[regions.TenantPlan])
	if err != nil {
		return nil, fmt.Errorf("read tenant plans: %w", err)
	}
	return tps, nil
}

// PlanTenants is how many tenants are assigned to plan.
func (s *Store) PlanTenants(ctx context.Context, plan string) (int64, error) {
	if err := regions.ValidateID("plan", plan); err != nil {
		return 0, fmt.Errorf("count plan tenants: %w", err)
	}
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM tenant_plan WHERE plan = $1`, plan).Scan(&n); err != nil {
		return 0, fmt.Errorf("count tenants of plan %s: %w", plan, err)
	}
	return n, nil
}

// TenantPlan is tenant's plan, "" when it has none.
func (s *Store) TenantPlan(ctx context.Context, tenant string) (string, error) {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return "", fmt.Errorf("find tenant plan: %w", err)
	}
	var p string
	err := s.pool.QueryRow(ctx, `SELECT plan FROM tenant_plan WHERE tenant_id = $1`, tenant).Scan(&p)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("find plan of tenant %s: %w", tenant, err)
	}
	return p, nil
}

// SetPlanRule creates or replaces r.Plan's rule for r.Route, creating the plan when it
// does not exist. Shards 0 means 1; Tenant "" means "*"; UpdatedAt is ignored. It is one
// row whatever the plan's tenants: they all resolve through it in this transaction.
func (s *Store) SetPlanRule(ctx context.Context, r regions.Rule) error {
	r = planRuleDefaults(r)
	if r.Plan == "" {
		return fmt.Errorf("set plan rule: %w: no plan named", regions.ErrInvalid)
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("set plan rule: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		return dbErr(upsertPlanRule(ctx, tx, r))
	})
	if err != nil {
		return fmt.Errorf("set rule %s of plan %s: %w", r.Route, r.Plan, err)
	}
	return nil
}

func planRuleDefaults(r regions.Rule) regions.Rule {
	if r.Shards == 0 {
		r.Shards = 1
	}
	if r.Tenant == "" {
		r.Tenant = regions.Wildcard
	}
	return r
}

// upsertPlanRule writes r (valid), adding its plan first when missing.
func upsertPlanRule(ctx context.Context, tx pgx.Tx, r regions.Rule) error {
	if err := insertPlan(ctx, tx, r.Plan); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second, shadow, shards, bands, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, now())
		ON CONFLICT (plan, route_id) DO UPDATE SET capacity = EXCLUDED.capacity,
			refill_per_second = EXCLUDED.refill_per_second, shadow = EXCLUDED.shadow,
			shards = EXCLUDED.shards, bands = EXCLUDED.bands, updated_at = now()
		WHERE (plan_rule.capacity, plan_rule.refill_per_second, plan_rule.shadow, plan_rule.shards, plan_rule.bands)
			IS DISTINCT FROM (EXCLUDED.capacity, EXCLUDED.refill_per_second, EXCLUDED.shadow, EXCLUDED.shards, EXCLUDED.bands)`,
		r.Plan, r.Route, r.Capacity, r.RefillPerSecond, r.Shadow, int32(r.Shards), bandsJSON(r.Bands))
	return err
}

// insertPlan adds plan name when it does not exist.
func insertPlan(ctx context.Context, tx pgx.Tx, name string) error {
	_, err := tx.Exec(ctx, `INSERT INTO plan (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name)
	return err
}

// DeletePlanRule deletes plan's rule for route; ErrNotFound if there is none. The plan
// stays (its tenants fall back to its other rules, then the defaults).
func (s *Store) DeletePlanRule(ctx context.Context, plan, route string) error {
	if err := regions.ValidateID("plan", plan); err != nil {
		return fmt.Errorf("delete plan rule: %w", err)
	}
	if err := regions.ValidateIDOrWildcard("route", route); err != nil {
		return fmt.Errorf("delete plan rule: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		return deletePlanRule(ctx, tx, plan, route)
	})
	if err != nil {
		return fmt.Errorf("delete rule %s of plan %s: %w", route, plan, err)
	}
	return nil
}

func deletePlanRule(ctx context.Context, tx pgx.Tx, plan, route string) error {
	tag, err := tx.Exec(ctx, `DELETE FROM plan_rule WHERE plan = $1 AND route_id = $2`, plan, route)
	if err != nil {
		return dbErr(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// DeletePlan deletes plan and its rules; ErrNotFound if there is none, ErrPlanInUse
// while tenants are assigned to it (unassign them first: none falls back to the
// defaults by accident).
func (s *Store) DeletePlan(ctx context.Context, plan string) error {
	if err := regions.ValidateID("plan", plan); err != nil {
		return fmt.Errorf("delete plan: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		return deletePlan(ctx, tx, plan)
	})
	if err != nil {
		return fmt.Errorf("delete plan %s: %w", plan, err)
	}
	return nil
}

func deletePlan(ctx context.Context, tx pgx.Tx, plan string) error {
	var n int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM tenant_plan WHERE plan = $1`, plan).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%w: %d tenants are assigned to it (unassign them first)", ErrPlanInUse, n)
	}
	tag, err := tx.Exec(ctx, `DELETE FROM plan WHERE name = $1`, plan)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23503" { // assigned since the count
		return fmt.Errorf("%w: tenants are assigned to it (unassign them first)", ErrPlanInUse)
	}
	if err != nil {
		return dbErr(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// AssignPlan assigns tenant to plan (replacing its plan, if any); ErrNotFound (wrapped,
// naming the plan) when the plan does not exist.
func (s *Store) AssignPlan(ctx context.Context, tenant, plan string) error {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return fmt.Errorf("assign plan: %w", err)
	}
	if err := regions.ValidateID("plan", plan); err != nil {
		return fmt.Errorf("assign plan: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		return assignPlan(ctx, tx, tenant, plan)
	})
	if err != nil {
		return fmt.Errorf("assign tenant %s to plan %s: %w", tenant, plan, err)
	}
	return nil
}

func assignPlan(ctx context.Context, tx pgx.Tx, tenant, plan string) error {
	_, err := tx.Exec(ctx, `INSERT INTO tenant_plan (tenant_id, plan, updated_at) VALUES ($1, $2, now())
		ON CONFLICT (tenant_id) DO UPDATE SET plan = EXCLUDED.plan, updated_at = now()
		WHERE tenant_plan.plan <> EXCLUDED.plan`, tenant, plan)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23503" {
		return fmt.Errorf("%w: plan %s does not exist (create it with a rule first)", ErrNotFound, plan)
	}
	return dbErr(err)
}

// UnassignPlan removes tenant's plan; ErrNotFound if it has none.
func (s *Store) UnassignPlan(ctx context.Context, tenant string) error {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return fmt.Errorf("unassign plan: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		return unassignPlan(ctx, tx, tenant)
	})
	if err != nil {
		return fmt.Errorf("unassign the plan of tenant %s: %w", tenant, err)
	}
	return nil
}

func unassignPlan(ctx context.Context, tx pgx.Tx, tenant string) error {
	tag, err := tx.Exec(ctx, `DELETE FROM tenant_plan WHERE tenant_id = $1`, tenant)
	if err != nil {
		return dbErr(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}
