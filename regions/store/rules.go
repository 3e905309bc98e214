package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// TenantExists reports whether tenant has a rule, a key or a plan.
func (s *Store) TenantExists(ctx context.Context, tenant string) (bool, error) {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return false, fmt.Errorf("find tenant: %w", err)
	}
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM rate_limit_rule WHERE tenant_id = $1)
		OR EXISTS (SELECT 1 FROM api_key WHERE tenant_id = $1)
		OR EXISTS (SELECT 1 FROM tenant_plan WHERE tenant_id = $1)`, tenant).Scan(&ok)
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
	rows, _ := s.pool.Query(ctx, `SELECT tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at, bands
		FROM rate_limit_rule WHERE ($1 = '' OR tenant_id = $1) AND ($2 = '' OR route_id = $2)
		ORDER BY tenant_id, route_id`, tenant, route)
	rules, err := pgx.CollectRows(rows, scanRule)
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
		var rows ruleRows
		rows.add(r)
		return dbErr(rows.upsert(ctx, tx))
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
		var rows ruleRows
		rows.add(regions.Rule{Tenant: tenant, Route: route})
		n, err := rows.delete(ctx, tx)
		if err != nil {
			return dbErr(err)
		}
		if n == 0 {
			return ErrNotFound
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete rule %s/%s: %w", tenant, route, err)
	}
	return nil
}

// scanRule reads a row of tenant_id, route_id, capacity, refill_per_second, shadow,
// shards, updated_at, bands.
func scanRule(row pgx.CollectableRow) (regions.Rule, error) {
	var (
		r     regions.Rule
		bands []byte
	)
	if err := row.Scan(&r.Tenant, &r.Route, &r.Capacity, &r.RefillPerSecond, &r.Shadow, &r.Shards, &r.UpdatedAt, &bands); err != nil {
		return r, err
	}
	var err error
	r.Bands, err = decodeBands(bands)
	return r, err
}

// bandsJSON is the bands column of bs: "[]" for none.
func bandsJSON(bs []regions.Band) string {
	if len(bs) == 0 {
		return "[]"
	}
	b, err := json.Marshal(bs)
	if err != nil {
		panic(fmt.Sprintf("store: marshal bands: %v", err)) // plain values only
	}
	return string(b)
}

// decodeBands reads a bands column; none ("[]") is nil, as a rule without bands is.
func decodeBands(b []byte) ([]regions.Band, error) {
	if len(b) == 0 || string(b) == "[]" {
		return nil, nil
	}
	var bs []regions.Band
	if err := json.Unmarshal(b, &bs); err != nil {
		return nil, fmt.Errorf("bands %.40q: %w", b, err)
	}
	if len(bs) == 0 {
		return nil, nil
	}
	return bs, nil
}

// ruleRows are rules as the columns of rate_limit_rule, for the one upsert and the one
// delete of rules that SetRule and DeleteRule (one row) and Apply (every rule change of a
// file, 100,000 rules in one statement) share.
type ruleRows struct {
	tenant, route []string
	capacity      []int64
	refill        []float64
	shadow        []bool
	shards        []int32
	bands         []string // JSON
}

func (rs *ruleRows) add(r regions.Rule) {
	rs.tenant, rs.route = append(rs.tenant, r.Tenant), append(rs.route, r.Route)
	rs.capacity, rs.refill = append(rs.capacity, r.Capacity), append(rs.refill, r.RefillPerSecond)
	rs.shadow, rs.shards = append(rs.shadow, r.Shadow), append(rs.shards, int32(r.Shards))
	rs.bands = append(rs.bands, bandsJSON(r.Bands))
}

func (rs *ruleRows) len() int { return len(rs.tenant) }

// upsert creates or replaces the rules of rs (updated_at: the database's now()).
func (rs *ruleRows) upsert(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, shadow, shards, bands, updated_at)
		SELECT t, r, c, f, s, n, b, now() FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[], $5::bool[], $6::int[], $7::jsonb[]) AS u(t, r, c, f, s, n, b)
		ON CONFLICT (tenant_id, route_id) DO UPDATE SET capacity = EXCLUDED.capacity,
			refill_per_second = EXCLUDED.refill_per_second, shadow = EXCLUDED.shadow,
			shards = EXCLUDED.shards, bands = EXCLUDED.bands, updated_at = now()`,
		rs.tenant, rs.route, rs.capacity, rs.refill, rs.shadow, rs.shards, rs.bands)
	return err
}

// delete deletes the rules of rs by tenant and route (the other columns are ignored) and
// returns how many there were.
func (rs *ruleRows) delete(ctx context.Context, tx pgx.Tx) (int64, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM rate_limit_rule r USING unnest($1::text[], $2::text[]) AS d(tenant_id, route_id)
		WHERE r.tenant_id = d.tenant_id AND r.route_id = d.route_id`, rs.tenant, rs.route)
	return tag.RowsAffected(), err
}
