package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions"
)

// TestQuotaChecksAcceptExactlyValidate (migration 13): a band, token bucket or calendar
// quota, as the store writes it (its JSON), is accepted by the database if and only if
// regions.Rule.Validate accepts it.
func TestQuotaChecksAcceptExactlyValidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	for i, b := range []regions.Band{
		{Capacity: 1000, RefillPerSecond: 1},
		{Capacity: 1000, Period: regions.PeriodMonth},
		{Capacity: 1000, Period: regions.PeriodHour},
		{Capacity: 1000, Period: regions.PeriodDay, Zone: "Europe/Berlin"},
		{Capacity: 1000, Period: regions.PeriodWeek, Zone: "America/New_York"},
		{Capacity: regions.MaxCapacity, Period: regions.PeriodDay, Zone: "UTC"},
		{Capacity: regions.MaxCapacity + 1, Period: regions.PeriodDay},
		{Capacity: 0, Period: regions.PeriodDay},
		{Capacity: 1000, Period: "fortnight"},
		{Capacity: 1000, Period: "Month"},
		{Capacity: 1000, Period: regions.PeriodDay, RefillPerSecond: 0.5},
		{Capacity: 1000, Period: regions.PeriodDay, RefillPerSecond: -1},
		{Capacity: 1000, Period: regions.PeriodDay, Zone: "Nowhere/Atlantis"},
		{Capacity: 1000, Period: regions.PeriodDay, Zone: "europe/berlin"},
		{Capacity: 1000, Period: regions.PeriodDay, Zone: "UTC+3"},
		{Capacity: 1000, Period: regions.PeriodDay, Zone: "Local"},
		{Capacity: 1000, Period: regions.PeriodDay, Zone: "/etc/localtime"},
		{Capacity: 1000, RefillPerSecond: 1, Zone: "Europe/Berlin"}, // a zone without a period
		{Capacity: 1000}, // neither refill nor period
	} {
		b.Name = "q"
		rule := regions.Rule{Tenant: "t", Route: fmt.Sprintf("r%d", i), Capacity: 10, RefillPerSecond: 1, Shards: 1, Bands: []regions.Band{b}}
		goOK := rule.Validate() == nil
		js, err := json.Marshal(rule.Bands)
		if err != nil {
			t.Fatal(err)
		}
		_, err = db.ExecContext(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, bands) VALUES ($1, $2, 10, 1, $3)`,
			rule.Tenant, rule.Route, string(js))
		if dbOK := err == nil; goOK != dbOK {
			t.Errorf("band %s: Validate accepts=%v, database accepts=%v (%v)", js, goOK, dbOK, err)
		}
		var pgErr *pgconn.PgError
		if err != nil && (!errors.As(err, &pgErr) || pgErr.ConstraintName != "rate_limit_rule_bands_valid") {
			t.Errorf("band %s: refused by %v, want rate_limit_rule_bands_valid", js, err)
		}
	}
	// What Go never writes, but plain SQL might.
	for _, bands := range []string{
		`[{"name": "q", "capacity": 10, "period": "day"}]`,                                                                              // no refill_per_second
		`[{"name": "q", "capacity": 10, "refill_per_second": 0, "period": 1}]`,                                                          // period a number
		`[{"name": "q", "capacity": 10, "refill_per_second": 0, "period": "day", "zone": 1}]`,                                           // zone a number
		`[{"name": "q", "capacity": 10, "refill_per_second": 0, "period": "day", "zone": ""}]`,                                          // zone empty
		`[{"name": "q", "capacity": 10, "refill_per_second": 0, "zone": "UTC"}]`,                                                        // zone alone
		`[{"name": "q", "capacity": 10, "refill_per_second": 0, "period": "day", "every": "1"}]`,                                        // unknown key
		`[{"name": "q", "capacity": 10.5, "refill_per_second": 0, "period": "day"}]`,                                                    // fractional
		`[{"name": "rate", "capacity": 10, "refill_per_second": 0, "period": "day"}]`,                                                   // the rule's own name
		`[{"name": "q", "capacity": 1, "refill_per_second": 0, "period": "day"}, {"name": "q", "capacity": 2, "refill_per_second": 1}]`, // twice
		`[{}]`,
	} {
		_, err := db.ExecContext(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, bands) VALUES ('t', 'raw', 10, 1, $1)`, bands)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.ConstraintName != "rate_limit_rule_bands_valid" {
			t.Errorf("bands %s: %v, want refused by rate_limit_rule_bands_valid", bands, err)
		}
	}
}

// TestQuotaBandsNeverMark (migration 13): a quota band has no bucket, so no raise marks
// it: not its capacity raised, not the key of its rule changed, not a bucket band turned
// into a quota; token-bucket bands beside it are marked as before.
func TestQuotaBandsNeverMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, bands) VALUES
			('a', 'r', 100, 1, '[{"name": "hour", "capacity": 1000, "refill_per_second": 1}, {"name": "month", "capacity": 1000, "refill_per_second": 0, "period": "month"}]'),
			('a', 'x', 100, 1, '[{"name": "day", "capacity": 1000, "refill_per_second": 1}]')`,
		`INSERT INTO plan (name) VALUES ('pro')`,
		`INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second, bands) VALUES
			('pro', '*', 100, 1, '[{"name": "month", "capacity": 1000, "refill_per_second": 0, "period": "month"}]')`,
		`INSERT INTO tenant_plan (tenant_id, plan) VALUES ('p', 'pro')`,
		`DELETE FROM limit_raise`,
		// The quota raised tenfold, the bucket band fourfold.
		`UPDATE rate_limit_rule SET bands = '[{"name": "hour", "capacity": 4000, "refill_per_second": 1}, {"name": "month", "capacity": 10000, "refill_per_second": 0, "period": "month"}]'
			WHERE tenant_id = 'a' AND route_id = 'r'`,
		// A bucket band turned into a larger quota of the same name.
		`UPDATE rate_limit_rule SET bands = '[{"name": "day", "capacity": 5000, "refill_per_second": 0, "period": "day", "zone": "Europe/Berlin"}]'
			WHERE tenant_id = 'a' AND route_id = 'x'`,
		// A plan's quota raised.
		`UPDATE plan_rule SET bands = '[{"name": "month", "capacity": 5000, "refill_per_second": 0, "period": "month"}]' WHERE plan = 'pro'`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if got, want := raiseRows(t, db), "* a r#hour 0.250000000 0.250000000"; got != want {
		t.Fatalf("marks:\n%s\nwant\n%s", got, want)
	}
	// A key change marks the old and new key and their bucket bands, not the quota.
	if _, err := db.ExecContext(ctx, `DELETE FROM limit_raise`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE rate_limit_rule SET route_id = 'z' WHERE tenant_id = 'a' AND route_id = 'r'`); err != nil {
		t.Fatal(err)
	}
	const want = "* a r 0.000000000 0.000000000\n* a r#hour 0.000000000 0.000000000\n* a z 0.000000000 0.000000000\n* a z#hour 0.000000000 0.000000000"
	if got := raiseRows(t, db); got != want {
		t.Fatalf("marks of a key change:\n%s\nwant\n%s", got, want)
	}
}

// TestQuotaUsageTable (migration 13): quota_usage refuses negative usage and bad ids,
// and goes with a roll back; a region's usage outlives the region (no foreign key).
func TestQuotaUsageTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	row := func(tenant, region, used string) string {
		return `INSERT INTO quota_usage (tenant, route, band, period_start, region, used) VALUES ('` + tenant +
			`', 'r', 'month', '2026-12-01T00:00:00Z', '` + region + `', ` + used + `)`
	}
	for _, tc := range []struct{ sql, want string }{
		{`INSERT INTO region (name) VALUES ('us-east')`, ""},
		{row("t", "us-east", "5"), ""},
		{row("t", "eu-west", "0"), ""}, // a region not added yet
		{row("u", "us-east", "-1"), "quota_usage_used_nonnegative"},
		{row("*", "us-east", "1"), "quota_usage_tenant_syntax"},
		{row("u", "us east", "1"), "quota_usage_region_syntax"},
		{row("t", "us-east", "7"), "quota_usage_pkey"},
		{`DELETE FROM region WHERE name = 'us-east'`, ""},
	} {
		_, err := db.ExecContext(ctx, tc.sql)
		var pgErr *pgconn.PgError
		switch {
		case tc.want == "" && err != nil:
			t.Fatalf("%s: %v", tc.sql, err)
		case tc.want != "" && (!errors.As(err, &pgErr) || pgErr.ConstraintName != tc.want):
			t.Fatalf("%s: %v, want refused by %s", tc.sql, err, tc.want)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM quota_usage`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d usage rows after removing us-east (%v), want 2: what a region spent stays spent", n, err)
	}
}
