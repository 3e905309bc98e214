package migrations_test

import (
	"context"
	"testing"

	"github.com/quotaplane/quotaplane/migrations"
)

// TestDownPlansMarksTenants (G1): rolling back the plans unassigns their tenants with the
// raise triggers still in place, so a tenant whose plan was smaller than the defaults it
// falls back to is marked (free's 5 -> the default 20: 0.25), not left to start full.
func TestDownPlansMarksTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO plan (name) VALUES ('free')`,
		`INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second) VALUES ('free', '*', 5, 1)`,
		`INSERT INTO tenant_plan (tenant_id, plan) VALUES ('t1', 'free')`,
		`DELETE FROM limit_raise`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for v, err := migrations.Version(ctx, db); v > 10; v, err = migrations.Version(ctx, db) {
		if err != nil {
			t.Fatal(err)
		}
		if err := migrations.Down(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	var ratio float64
	if err := db.QueryRowContext(ctx, `SELECT ratio FROM limit_raise WHERE region = '*' AND tenant = 't1' AND route = '*'`).Scan(&ratio); err != nil {
		t.Fatalf("t1's marker after rolling back the plans: %v", err)
	}
	if ratio < 0.25-1e-9 || ratio > 0.25+1e-9 {
		t.Errorf("t1's marker: ratio %v, want 0.25 (free's 5 over the default 20)", ratio)
	}
}
