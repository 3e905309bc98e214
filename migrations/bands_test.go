package migrations_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/quotaplane/quotaplane/migrations"
)

// TestBandsMarkAsBeforeWithoutBands (#24): with migration 12 the raise triggers leave the
// same limit_raise rows as migration 11's after every statement of a sequence of rule,
// plan rule and assignment changes that name no bands, so rules without bands are marked
// as before; rows written before migration 12 come through it unchanged, with no bands.
func TestBandsMarkAsBeforeWithoutBands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	oldDB, _ := openDB(t)
	newDB, _ := openDB(t)
	if err := migrations.UpTo(ctx, oldDB, 11); err != nil {
		t.Fatal(err)
	}
	if err := migrations.UpTo(ctx, newDB, 11); err != nil {
		t.Fatal(err)
	}
	seed := []string{
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('*', 'x', 10, 1), ('a', 'r', 50, 1)`,
		`INSERT INTO plan (name) VALUES ('free'), ('pro')`,
		`INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second) VALUES ('free', '*', 5, 1), ('pro', '*', 100, 10), ('pro', 'x', 300, 10)`,
		`INSERT INTO tenant_plan (tenant_id, plan) VALUES ('p1', 'free'), ('p2', 'pro')`,
	}
	for _, q := range seed {
		for _, db := range []*sql.DB{oldDB, newDB} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	before := raiseRows(t, newDB)
	if err := migrations.Up(ctx, newDB); err != nil {
		t.Fatal(err)
	}
	if got := raiseRows(t, newDB); got != before {
		t.Fatalf("migration 12 marked:\n%s\nwas\n%s", got, before)
	}
	var banded int
	if err := newDB.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM rate_limit_rule WHERE bands <> '[]') +
		(SELECT count(*) FROM plan_rule WHERE bands <> '[]')`).Scan(&banded); err != nil || banded != 0 {
		t.Fatalf("%d rows with bands after migration 12 (%v), want none", banded, err)
	}
	steps := []string{
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('p1', 'x', 40, 1), ('b', '*', 100, 1), ('p2', '*', 7, 1)`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second)
			SELECT 't' || i, CASE WHEN i % 3 = 0 THEN '*' ELSE 'r' || (i % 5) END, 10 + i, 1 FROM generate_series(1, 100) i`,
		`UPDATE rate_limit_rule SET capacity = capacity * 2 WHERE tenant_id IN ('a', 'b') OR tenant_id LIKE 't1%'`,
		`UPDATE rate_limit_rule SET shards = 4 WHERE tenant_id = 'b'`,
		`UPDATE rate_limit_rule SET capacity = 1 WHERE tenant_id = 'a'`,
		`UPDATE rate_limit_rule SET route_id = 'z' WHERE tenant_id = 't2'`,
		`DELETE FROM rate_limit_rule WHERE tenant_id IN ('p2', 'b') OR tenant_id LIKE 't3%'`,
		`UPDATE plan_rule SET capacity = 400 WHERE plan = 'pro' AND route_id = '*'`,
		`UPDATE plan_rule SET shards = 2 WHERE plan = 'free'`,
		`INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second) VALUES ('free', 'x', 60, 1)`,
		`UPDATE tenant_plan SET plan = 'pro' WHERE tenant_id = 'p1'`,
		`INSERT INTO tenant_plan (tenant_id, plan) VALUES ('p3', 'free'), ('t1', 'pro')`,
		`DELETE FROM plan_rule WHERE plan = 'pro' AND route_id = 'x'`,
		`DELETE FROM tenant_plan WHERE tenant_id IN ('p2', 'p3')`,
		`UPDATE rate_limit_rule SET capacity = 90 WHERE tenant_id = '*' AND route_id = '*'`,
	}
	for i, q := range steps {
		for _, db := range []*sql.DB{oldDB, newDB} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("step %d %s: %v", i, q, err)
			}
		}
		o, n := raiseRows(t, oldDB), raiseRows(t, newDB)
		if o != n {
			t.Fatalf("after step %d %s:\nmigration 11:\n%s\nmigration 12:\n%s", i, q, o, n)
		}
	}
	if raiseRows(t, newDB) == "" {
		t.Fatal("no raise marked at all: the test compares nothing")
	}
}

// TestBandMarksRowsAndDown (#24): a band's raise is a row of its own, route
// "route#band" (a route of every tenant's rule too: "*#band"), beside the rule's own
// pair's; rolling migration 12 back deletes the band rows and keeps the others.
func TestBandMarksRowsAndDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, bands) VALUES
			('a', 'r', 100, 1, '[{"name": "hour", "capacity": 1000, "refill_per_second": 1}]'),
			('a', '*', 100, 1, '[{"name": "day", "capacity": 1000, "refill_per_second": 1}]')`,
		`DELETE FROM limit_raise`,
		`UPDATE rate_limit_rule SET capacity = 200, bands = '[{"name": "hour", "capacity": 4000, "refill_per_second": 1}]'
			WHERE tenant_id = 'a' AND route_id = 'r'`,
		`UPDATE rate_limit_rule SET bands = '[{"name": "day", "capacity": 5000, "refill_per_second": 1}]'
			WHERE tenant_id = 'a' AND route_id = '*'`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	const want = "* a *#day 0.200000000 0.200000000\n* a r 0.500000000 0.500000000\n* a r#hour 0.250000000 0.250000000"
	if got := raiseRows(t, db); got != want {
		t.Fatalf("marks:\n%s\nwant\n%s", got, want)
	}
	for v, err := migrations.Version(ctx, db); v > 11; v, err = migrations.Version(ctx, db) {
		if err != nil {
			t.Fatal(err)
		}
		if err := migrations.Down(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := raiseRows(t, db), "* a r 0.500000000 0.500000000"; got != want {
		t.Fatalf("marks after rolling back migration 12:\n%s\nwant\n%s", got, want)
	}
}
