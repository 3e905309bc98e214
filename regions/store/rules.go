package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// TenantExists reports whether tenant has a rule or a key.
func (s *Store) TenantExists(ctx context.Context, tenant string) (bool, error) {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return false, fmt.Errorf("find tenant: %w", err)
	}
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM rate_limit_rule WHERE tenant_id = $1)
		OR EXISTS (SELECT 1 FROM api_key WHERE tenant_id = $1)`, tenant).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("find tenant %s: %w", tenant, err)
	}
	return ok, nil
}

// Rules lists the rules matching tenant and route exactly ("" = any; "*" = the wildcard
// rules), sorted by tenant then route.
func (s *Store) Rules(ctx context.Context, tenant, route string) ([]regions.Rule, error) {
	if tenant != "" {
		if err := regions.ValidateIDOrWildcard("tenant", tenant); err != nil {
			return nil, fmt.Errorf("list rules: %w", err)
		}
	}
	if route != "" {
		if err := regions.ValidateIDOrWildcard("route", route); err != nil {
			return nil, fmt.Errorf("list rules: %w", err)
		}
	}
	rows, _ := s.pool.Query(ctx, `SELECT tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at
		FROM rate_limit_rule WHERE ($1 = '' OR tenant_id = $1) AND ($2 = '' OR route_id = $2)
		ORDER BY tenant_id, route_id`, tenant, route)
	rules, err := pgx.CollectRows(rows, pgx.RowToStructByPos[regions.Rule])
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	return rules, nil
}

// SetRule creates or replaces the rule for r.Tenant and r.Route. Shards 0 means 1;
// UpdatedAt is ignored (the database sets it).
func (s *Store) SetRule(ctx context.Context, r regions.Rule) error {
	if r.Shards == 0 {
		r.Shards = 1
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("set rule: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, now())
			ON CONFLICT (tenant_id, route_id) DO UPDATE SET capacity = EXCLUDED.capacity,
				refill_per_second = EXCLUDED.refill_per_second, shadow = EXCLUDED.shadow,
				shards = EXCLUDED.shards, updated_at = now()`,
			r.Tenant, r.Route, r.Capacity, r.RefillPerSecond, r.Shadow, r.Shards)
		return dbErr(err)
	})
	if err != nil {
		return fmt.Errorf("set rule %s/%s: %w", r.Tenant, r.Route, err)
	}
	return nil
}

// DeleteRule deletes the rule for tenant and route; ErrNotFound if there is none. The
// default rule (*, *) cannot be deleted (ErrInvalid): set it instead. Any id the database
// may hold is accepted (RawID), so a row written with plain SQL that ValidateID refuses
// (a reserved name) can be deleted too.
func (s *Store) DeleteRule(ctx context.Context, tenant, route string) error {
	if err := RawID("tenant", tenant); err != nil {
		return fmt.Errorf("delete rule: %w", err)
	}
	if err := RawID("route", route); err != nil {
		return fmt.Errorf("delete rule: %w", err)
	}
	if tenant == regions.Wildcard && route == regions.Wildcard {
		return fmt.Errorf("delete rule */*: %w: the default rule cannot be deleted; set it instead", regions.ErrInvalid)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM rate_limit_rule WHERE tenant_id = $1 AND route_id = $2`, tenant, route)
		if err != nil {
			return dbErr(err)
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete rule %s/%s: %w", tenant, route, err)
	}
	return nil
}
