package migrations_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/migrations"
)

// TestRaiseStatementTriggersMatchRowTriggers: the statement-level raise triggers of
// migration 10 leave the same limit_raise rows as the row-level ones of migration 8 (as
// migration 9 left them) after every statement of a sequence of single- and multi-row
// changes of rules and shares, whose rows interact (a tenant's rule of every route beside
// route rules, a key moved, overrides over rebalancer shares, an expired override).
func TestRaiseStatementTriggersMatchRowTriggers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rowDB, _ := openDB(t)
	stmtDB, _ := openDB(t)
	if err := migrations.UpTo(ctx, rowDB, 9); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, stmtDB); err != nil {
		t.Fatal(err)
	}
	steps := []string{
		`INSERT INTO region (name) VALUES ('us-east'), ('eu-west'), ('ap-south')`,
		// A gateway of every region that has acknowledged nothing: raises compound in
		// gate_ratio too.
		`INSERT INTO gateway_instance (id, region, snapshot_xmin) VALUES ('g1', 'us-east', 1), ('g2', 'eu-west', 1), ('g3', 'ap-south', 1)`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('*', 'x', 10, 1)`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES
			('a', '*', 100, 1), ('a', 'r', 50, 1), ('b', 'x', 5, 1), ('c', '*', 30, 1), ('*', 'y', 40, 1), ('e', '*', 8, 1)`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second)
			SELECT 't' || i, CASE WHEN i % 3 = 0 THEN '*' ELSE 'r' || (i % 5) END, 10 + i, 1 FROM generate_series(1, 200) i`,
		`UPDATE rate_limit_rule SET capacity = capacity * 2 WHERE tenant_id IN ('a', 'b') OR tenant_id LIKE 't1%'`,
		`UPDATE rate_limit_rule SET capacity = capacity * 2 WHERE tenant_id = 'a'`, // compounds within the hour
		`UPDATE rate_limit_rule SET shards = 4 WHERE tenant_id = 'c'`,
		`UPDATE rate_limit_rule SET capacity = 1 WHERE tenant_id = 'e'`, // a lowering
		`UPDATE rate_limit_rule SET route_id = 'z' WHERE tenant_id = 'b'`,
		`DELETE FROM rate_limit_rule WHERE tenant_id = 'a'`,
		`DELETE FROM rate_limit_rule WHERE tenant_id = '*' AND route_id = 'x'`,
		`DELETE FROM rate_limit_rule WHERE tenant_id LIKE 't2%' OR tenant_id LIKE 't3%'`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('c', '*', 60, 1), ('d', '*', 10, 1), ('d', 'y', 90, 1)
			ON CONFLICT (tenant_id, route_id) DO UPDATE SET capacity = EXCLUDED.capacity`,
		`UPDATE rate_limit_rule SET capacity = 40 WHERE tenant_id = '*' AND route_id = '*'`,

		`INSERT INTO region_share (scope, region, share, source) VALUES ('*', 'us-east', 0.5, 'rebalancer'), ('*', 'eu-west', 0.3, 'rebalancer'), ('*', 'ap-south', 0.2, 'rebalancer')`,
		`INSERT INTO region_share (scope, region, share, source, expires_at) VALUES ('a', 'us-east', 0.6, 'override', now() + interval '1 hour'), ('a/r', 'us-east', 0.1, 'rebalancer', NULL), ('a/s', 'eu-west', 0.9, 'rebalancer', NULL)`,
		`UPDATE region_share SET share = share / 2 WHERE region = 'us-east'`,
		`UPDATE region_share SET share = 0.95 WHERE scope = 'a/s'`,
		`UPDATE region_share SET region = 'eu-west' WHERE scope = 'a/r'`,
		`INSERT INTO region_share (scope, region, share, source) VALUES ('*', 'us-east', 0.7, 'rebalancer')
			ON CONFLICT (scope, region, source) DO UPDATE SET share = EXCLUDED.share`,
		`DELETE FROM region_share WHERE region = 'ap-south'`,
		`DELETE FROM region WHERE name = 'ap-south'`,
		`INSERT INTO region_share (scope, region, share, source, expires_at) VALUES ('f', 'us-east', 0.1, 'override', now() - interval '1 minute'), ('g', 'us-east', 0.1, 'override', now() + interval '1 hour')`,
		`UPDATE region_share SET share = 0.05 WHERE scope IN ('f', 'g')`,
		`DELETE FROM region_share WHERE source = 'override'`,
		`DELETE FROM region_share`,
	}
	for i, q := range steps {
		for _, db := range []*sql.DB{rowDB, stmtDB} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("step %d %s: %v", i, q, err)
			}
		}
		row, stmt := raiseRows(t, rowDB), raiseRows(t, stmtDB)
		if row != stmt {
			t.Fatalf("after step %d %s:\nrow triggers:\n%s\nstatement triggers:\n%s", i, q, row, stmt)
		}
	}
	if raiseRows(t, stmtDB) == "" {
		t.Fatal("no raise marked at all: the test compares nothing")
	}
}

// raiseRows is limit_raise as text, ratios to 9 digits (the statement triggers multiply
// the ratios of one key in another order), times left out.
func raiseRows(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT region || ' ' || tenant || ' ' || route || ' ' ||
		round(ratio::numeric, 9) || ' ' || round(gate_ratio::numeric, 9) FROM limit_raise ORDER BY region, tenant, route`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "\n")
}
