package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m)) }

func openDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	url := testenv.PostgresDB(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, url
}

// fingerprint describes the public schema: columns, constraints, indexes and triggers.
func fingerprint(t *testing.T, db *sql.DB) string {
	t.Helper()
	const q = `
SELECT coalesce(string_agg(x, E'\n' ORDER BY x), '') FROM (
  SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || coalesce(column_default, '') || ' ' || is_nullable AS x
    FROM information_schema.columns WHERE table_schema = 'public' AND table_name <> 'goose_db_version'
  UNION ALL
  SELECT conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text <> 'goose_db_version'
  UNION ALL
  SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename <> 'goose_db_version'
  UNION ALL
  SELECT tgrelid::regclass::text || ' trigger ' || tgname FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL
  SELECT 'function ' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
) s`
	var fp string
	if err := db.QueryRowContext(context.Background(), q).Scan(&fp); err != nil {
		t.Fatalf("fingerprint: %v", err)
	}
	return fp
}

func TestUpEmptyDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if fp := fingerprint(t, db); fp != "" {
		t.Fatalf("fresh database is not empty:\n%s", fp)
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	v, err := migrations.Version(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if v != migrations.Latest() || v < 3 {
		t.Fatalf("version %d, want latest %d (>= 3)", v, migrations.Latest())
	}
	for _, table := range []string{"rate_limit_rule", "api_key", "region", "region_share", "region_share_history", "gateway_instance", "audit_log"} {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Errorf("table %s: %v", table, err)
		}
	}
	var capacity int64
	var refill float64
	if err := db.QueryRowContext(ctx, `SELECT capacity, refill_per_second FROM rate_limit_rule WHERE tenant_id = '*' AND route_id = '*'`).Scan(&capacity, &refill); err != nil {
		t.Fatalf("default rule: %v", err)
	}
	if capacity != 20 || refill != 10 {
		t.Fatalf("default rule %d/%v, want 20/10", capacity, refill)
	}
	st, err := migrations.Status(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != int(migrations.Latest()) {
		t.Fatalf("status has %d migrations, want %d", len(st), migrations.Latest())
	}
	for _, s := range st {
		if !s.Applied || s.AppliedAt.IsZero() || !strings.HasSuffix(s.Name, ".sql") {
			t.Errorf("status %+v: want applied .sql with a time", s)
		}
	}
}

func TestReapplyIsNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	before := fingerprint(t, db)
	var rows0 int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM goose_db_version").Scan(&rows0); err != nil {
		t.Fatal(err)
	}
	// Two concurrent migrators plus one more: the advisory lock serialises them.
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Go(func() { errs <- migrations.Up(ctx, db) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows1 int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM goose_db_version").Scan(&rows1); err != nil {
		t.Fatal(err)
	}
	if rows1 != rows0 {
		t.Fatalf("goose_db_version grew from %d to %d rows", rows0, rows1)
	}
	if after := fingerprint(t, db); after != before {
		t.Fatalf("schema changed on re-apply:\n%s\n---\n%s", before, after)
	}
	var rules int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM rate_limit_rule").Scan(&rules); err != nil || rules != 1 {
		t.Fatalf("rules after re-apply: %d, %v; want the one default rule", rules, err)
	}
}

func TestDownUpRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	want := fingerprint(t, db)

	// One step down and up again.
	if err := migrations.Down(ctx, db); err != nil {
		t.Fatal(err)
	}
	if v, err := migrations.Version(ctx, db); err != nil || v != migrations.Latest()-1 {
		t.Fatalf("after one down: version %d, %v; want %d", v, err, migrations.Latest()-1)
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got := fingerprint(t, db); got != want {
		t.Fatalf("schema after down/up differs:\n%s\n---\n%s", want, got)
	}

	// Everything down: nothing of ours is left.
	if err := migrations.DownAll(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got := fingerprint(t, db); got != "" {
		t.Fatalf("schema left after down-all:\n%s", got)
	}
	if v, err := migrations.Version(ctx, db); err != nil || v != 0 {
		t.Fatalf("after down-all: version %d, %v; want 0", v, err)
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got := fingerprint(t, db); got != want {
		t.Fatalf("schema after down-all/up differs:\n%s\n---\n%s", want, got)
	}
}

func TestChecksRejectBadRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO region (name) VALUES ('us-east'), ('eu-west')`); err != nil {
		t.Fatal(err)
	}
	const hash = `'\x` + "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff" + `'`
	long := strings.Repeat("a", 65)
	max := strings.Repeat("a", 64)
	rule := func(tenant, route, capacity, refill, shards string) string {
		return `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, shards) VALUES ('` +
			tenant + `', '` + route + `', ` + capacity + `, ` + refill + `, ` + shards + `)`
	}
	band := func(tenant, bands, shards string) string {
		return `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, shards, bands) VALUES ('` +
			tenant + `', 'r', 1, 1, ` + shards + `, '` + bands + `')`
	}
	share := func(scope, region, value, source, expires string) string {
		return `INSERT INTO region_share (scope, region, share, source, expires_at) VALUES ('` +
			scope + `', '` + region + `', ` + value + `, '` + source + `', ` + expires + `)`
	}
	tests := []struct {
		name string
		sql  string
		want string // constraint name; "" = the row is accepted
	}{
		{"rule ok", rule("shop-a", "create-order", "10", "0.5", "1"), ""},
		{"rule wildcard tenant ok", rule("*", "create-order", "10", "1", "1"), ""},
		{"rule wildcard route ok", rule("shop-b", "*", "10", "1", "1"), ""},
		{"rule max length id ok", rule(max, max, "1", "1", "1024"), ""},
		{"rule tenant empty", rule("", "r", "1", "1", "1"), "rate_limit_rule_tenant_syntax"},
		{"rule tenant too long", rule(long, "r", "1", "1", "1"), "rate_limit_rule_tenant_syntax"},
		{"rule tenant space", rule("shop a", "r", "1", "1", "1"), "rate_limit_rule_tenant_syntax"},
		{"rule tenant quote", rule("shop''--", "r", "1", "1", "1"), "rate_limit_rule_tenant_syntax"},
		{"rule tenant unicode look-alike", rule("shop-а", "r", "1", "1", "1"), "rate_limit_rule_tenant_syntax"},
		{"rule tenant newline", rule("shop\n", "r", "1", "1", "1"), "rate_limit_rule_tenant_syntax"},
		{"rule tenant star prefix", rule("*a", "r", "1", "1", "1"), "rate_limit_rule_tenant_syntax"},
		{"rule route slash", rule("t", "a/b", "1", "1", "1"), "rate_limit_rule_route_syntax"},
		{"rule route too long", rule("t", long, "1", "1", "1"), "rate_limit_rule_route_syntax"},
		{"rule capacity zero", rule("t", "r", "0", "1", "1"), "rate_limit_rule_capacity_positive"},
		{"rule capacity negative", rule("t", "r", "-5", "1", "1"), "rate_limit_rule_capacity_positive"},
		{"rule refill zero", rule("t", "r", "1", "0", "1"), "rate_limit_rule_refill_positive"},
		{"rule refill negative", rule("t", "r", "1", "-0.1", "1"), "rate_limit_rule_refill_positive"},
		{"rule refill NaN", rule("t", "r", "1", "'NaN'", "1"), "rate_limit_rule_refill_bound"}, // NaN sorts above every number in PostgreSQL
		{"rule refill infinity", rule("t", "r", "1", "'Infinity'", "1"), "rate_limit_rule_refill_bound"},
		{"rule shards zero", rule("t", "r", "1", "1", "0"), "rate_limit_rule_shards_range"},
		{"rule shards too many", rule("t", "r", "1", "1", "1025"), "rate_limit_rule_shards_range"},
		{"rule duplicate", rule("shop-a", "create-order", "1", "1", "1"), "rate_limit_rule_pkey"},

		{"key ok", `INSERT INTO api_key (key_hash, tenant_id, label) VALUES (` + hash + `, 'shop-a', 'ci')`, ""},
		{"key duplicate hash", `INSERT INTO api_key (key_hash, tenant_id) VALUES (` + hash + `, 'shop-b')`, "api_key_hash_unique"},
		{"key short hash", `INSERT INTO api_key (key_hash, tenant_id) VALUES ('\x0011', 'shop-a')`, "api_key_hash_sha256"},
		{"key wildcard tenant", `INSERT INTO api_key (key_hash, tenant_id) VALUES (sha256('x'), '*')`, "api_key_tenant_syntax"},
		{"key bad tenant", `INSERT INTO api_key (key_hash, tenant_id) VALUES (sha256('y'), 'a;b')`, "api_key_tenant_syntax"},
		{"key long label", `INSERT INTO api_key (key_hash, tenant_id, label) VALUES (sha256('z'), 'a', repeat('x', 201))`, "api_key_label_length"},

		{"region bad name", `INSERT INTO region (name) VALUES ('us east')`, "region_name_syntax"},
		{"region wildcard", `INSERT INTO region (name) VALUES ('*')`, "region_name_syntax"},
		{"region too long", `INSERT INTO region (name) VALUES ('` + long + `')`, "region_name_syntax"},

		{"share ok", share("*", "us-east", "0.7", "rebalancer", "NULL"), ""},
		{"share tenant ok", share("shop-a", "us-east", "1", "override", "now() + interval '1 hour'"), ""},
		{"share tenant route ok", share("shop-a/create-order", "eu-west", "0", "override", "NULL"), ""},
		{"share above one", share("shop-b", "us-east", "1.01", "rebalancer", "NULL"), "region_share_range"},
		{"share negative", share("shop-b", "us-east", "-0.01", "rebalancer", "NULL"), "region_share_range"},
		{"share NaN", share("shop-b", "us-east", "'NaN'", "rebalancer", "NULL"), "region_share_range"},
		{"share bad source", share("shop-b", "us-east", "0.5", "operator", "NULL"), "region_share_source"},
		{"share unknown region", share("shop-b", "ap-south", "0.5", "rebalancer", "NULL"), "region_share_region_fkey"},
		{"share scope empty", share("", "us-east", "0.5", "rebalancer", "NULL"), "region_share_scope_syntax"},
		{"share scope three parts", share("a/b/c", "us-east", "0.5", "rebalancer", "NULL"), "region_share_scope_syntax"},
		{"share scope wildcard route", share("*/r", "us-east", "0.5", "rebalancer", "NULL"), "region_share_scope_syntax"},
		{"share scope trailing slash", share("a/", "us-east", "0.5", "rebalancer", "NULL"), "region_share_scope_syntax"},
		{"share rebalancer with expiry", share("shop-c", "us-east", "0.5", "rebalancer", "now()"), "region_share_expiry_override_only"},

		{"rule tenant reserved", rule("_other", "r", "1", "1", "1"), "rate_limit_rule_tenant_reserved"},
		{"rule route reserved", rule("t", "_other", "1", "1", "1"), "rate_limit_rule_route_reserved"},
		{"rule like reserved ok", rule("_other2", "_other-x", "1", "1", "1"), ""},
		{"key reserved tenant", `INSERT INTO api_key (key_hash, tenant_id) VALUES (sha256('r'), '_other')`, "api_key_tenant_reserved"},
		{"share scope reserved tenant", share("_other", "us-east", "0.5", "rebalancer", "NULL"), "region_share_scope_reserved"},
		{"share scope reserved route", share("t/_other", "us-east", "0.5", "rebalancer", "NULL"), "region_share_scope_reserved"},
		{"share scope reserved pair", share("_other/r", "us-east", "0.5", "rebalancer", "NULL"), "region_share_scope_reserved"},

		{"instance ok", `INSERT INTO gateway_instance (id, region) VALUES ('gw-1.us-east', 'us-east')`, ""},
		{"instance bad id", `INSERT INTO gateway_instance (id, region) VALUES ('gw 1', 'us-east')`, "gateway_instance_id_syntax"},
		{"instance bad region", `INSERT INTO gateway_instance (id, region) VALUES ('gw-2', 'us/east')`, "gateway_instance_region_syntax"},

		{"rule bands ok", band("b-ok", `[{"name": "hour", "capacity": 10000, "refill_per_second": 2.7777777777777777}, {"name": "day", "capacity": 1000000000000000, "refill_per_second": 1000000000000}]`, "1"), ""},
		{"rule bands empty ok", band("b-empty", `[]`, "4"), ""},
		{"rule bands not an array", band("b1", `{"name": "hour"}`, "1"), "rate_limit_rule_bands_valid"},
		{"rule bands null", band("b2", `null`, "1"), "rate_limit_rule_bands_valid"},
		{"rule bands too many", band("b3", `[`+strings.TrimSuffix(strings.Repeat(`{"name": "x", "capacity": 1, "refill_per_second": 1}, `, 9), ", ")+`]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band not an object", band("b4", `[1]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band unknown key", band("b5", `[{"name": "h", "capacity": 1, "refill_per_second": 1, "per": "1h"}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band missing key", band("b6", `[{"name": "h", "capacity": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band name rate", band("b7", `[{"name": "rate", "capacity": 1, "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band name bad", band("b8", `[{"name": "a b", "capacity": 1, "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band name long", band("b9", `[{"name": "`+long+`", "capacity": 1, "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band name number", band("b10", `[{"name": 1, "capacity": 1, "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band names twice", band("b11", `[{"name": "h", "capacity": 1, "refill_per_second": 1}, {"name": "h", "capacity": 2, "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band capacity zero", band("b12", `[{"name": "h", "capacity": 0, "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band capacity fraction", band("b13", `[{"name": "h", "capacity": 1.5, "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band capacity too large", band("b14", `[{"name": "h", "capacity": 1000000000000001, "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band capacity text", band("b15", `[{"name": "h", "capacity": "1", "refill_per_second": 1}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band refill zero", band("b16", `[{"name": "h", "capacity": 1, "refill_per_second": 0}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule band refill too large", band("b17", `[{"name": "h", "capacity": 1, "refill_per_second": 1000000000001}]`, "1"), "rate_limit_rule_bands_valid"},
		{"rule bands sharded", band("b18", `[{"name": "h", "capacity": 1, "refill_per_second": 1}]`, "2"), "rate_limit_rule_bands_unsharded"},
		{"plan for bands", `INSERT INTO plan (name) VALUES ('p-b')`, ""},
		{"plan rule bands sharded", `INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second, shards, bands) VALUES ('p-b', '*', 1, 1, 2, '[{"name": "h", "capacity": 1, "refill_per_second": 1}]')`, "plan_rule_bands_unsharded"},
		{"plan rule band name rate", `INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second, bands) VALUES ('p-b', '*', 1, 1, '[{"name": "rate", "capacity": 1, "refill_per_second": 1}]')`, "plan_rule_bands_valid"},
		{"plan rule bands ok", `INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second, bands) VALUES ('p-b', '*', 1, 1, '[{"name": "hour", "capacity": 1, "refill_per_second": 1}]')`, ""},

		{"default rule cannot be deleted", `DELETE FROM rate_limit_rule WHERE tenant_id = '*' AND route_id = '*'`, "rate_limit_rule_keep_default"},
		{"default rule cannot be renamed", `UPDATE rate_limit_rule SET tenant_id = 'x' WHERE tenant_id = '*' AND route_id = '*'`, "rate_limit_rule_keep_default"},
		{"default rule can change", `UPDATE rate_limit_rule SET capacity = 30 WHERE tenant_id = '*' AND route_id = '*'`, ""},
		{"region with shares cannot be deleted", `DELETE FROM region WHERE name = 'us-east'`, "region_share_region_fkey"},
	}
	for _, tt := range tests {
		// Rows run in order on one database (later rows rely on earlier ones), so no t.Parallel.
		t.Run(tt.name, func(t *testing.T) {
			_, err := db.ExecContext(ctx, tt.sql)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("rejected a good row: %v", err)
				}
				return
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				t.Fatalf("accepted a bad row (want %s), err %v", tt.want, err)
			}
			if pgErr.ConstraintName != tt.want {
				t.Fatalf("rejected by %q (%s), want %q", pgErr.ConstraintName, pgErr.Message, tt.want)
			}
		})
	}
}

func TestTriggerNotifies(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db, url := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+migrations.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	hash := func(s string) string { return `sha256('` + s + `')` }
	steps := []struct {
		sql     string
		payload string // "" = must not notify
	}{
		{`INSERT INTO region (name) VALUES ('us-east')`, "region"},
		{`INSERT INTO gateway_instance (id, region) VALUES ('gw-1', 'us-east')`, ""},
		{`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('a', '*', 5, 1)`, "rate_limit_rule"},
		{`UPDATE gateway_instance SET last_seen = now()`, ""},
		{`UPDATE rate_limit_rule SET capacity = 6 WHERE tenant_id = 'a'`, "rate_limit_rule"},
		{`INSERT INTO api_key (key_hash, tenant_id) VALUES (` + hash("k") + `, 'a')`, "api_key"},
		{`UPDATE api_key SET revoked_at = now()`, "api_key"},
		{`INSERT INTO region_share (scope, region, share, source) VALUES ('*', 'us-east', 1, 'rebalancer')`, "region_share"},
		{`UPDATE region_share SET share = 0.9`, "region_share"},
		{`DELETE FROM gateway_instance`, ""},
		{`DELETE FROM region_share`, "region_share"},
		{`DELETE FROM api_key`, "api_key"},
		{`DELETE FROM rate_limit_rule WHERE tenant_id = 'a'`, "rate_limit_rule"},
		{`DELETE FROM region`, "region"},
	}
	for i, st := range steps {
		if _, err := db.ExecContext(ctx, st.sql); err != nil {
			t.Fatalf("step %d %s: %v", i, st.sql, err)
		}
		if st.payload == "" {
			continue // checked by the next notifying step: it must be the next notification
		}
		n, err := listener.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("step %d %s: no notification: %v", i, st.sql, err)
		}
		if n.Channel != migrations.NotifyChannel || n.Payload != st.payload {
			t.Fatalf("step %d %s: notification %s %q, want %s %q", i, st.sql, n.Channel, n.Payload, migrations.NotifyChannel, st.payload)
		}
	}
	// One bulk statement is one notification.
	if _, err := db.ExecContext(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) SELECT 't' || i, '*', 1, 1 FROM generate_series(1, 500) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO region (name) VALUES ('sentinel')`); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rate_limit_rule", "region"} {
		n, err := listener.WaitForNotification(ctx)
		if err != nil || n.Payload != want {
			t.Fatalf("after bulk insert: notification %v, %v; want %q", n, err, want)
		}
	}
}

func TestHistoryAndAuditTriggers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`INSERT INTO region (name) VALUES ('us-east')`)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `SELECT set_config($1, 'rebalancer-1', true), set_config($2, 'demand shift', true), set_config($3, '{"demand": {"us-east": 12.5}}', true)`,
		migrations.SettingActor, migrations.SettingReason, migrations.SettingInputs); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO region_share (scope, region, share, source) VALUES ('*', 'us-east', 0.5, 'rebalancer')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE region_share SET share = 0.5`) // unchanged: no history row
	exec(`UPDATE region_share SET share = 0.6`) // plain SQL: the role is the actor
	exec(`DELETE FROM region_share`)

	rows, err := db.QueryContext(ctx, `SELECT coalesce(old_share, -1), coalesce(new_share, -1), actor, reason, coalesce(inputs->'demand'->>'us-east', '') FROM region_share_history ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var o, n float64
		var actor, reason, in string
		if err := rows.Scan(&o, &n, &actor, &reason, &in); err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Join([]string{ftoa(o), ftoa(n), actor, reason, in}, " "))
	}
	want := []string{
		"-1 0.5 rebalancer-1 demand shift 12.5",
		"0.5 0.6 postgres  ",
		"0.6 -1 postgres  ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("history:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	var audits int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM audit_log WHERE object = 'region' AND action = 'insert' AND new->>'name' = 'us-east'`).Scan(&audits); err != nil || audits != 1 {
		t.Fatalf("audit rows for the region insert: %d, %v; want 1", audits, err)
	}
	exec(`INSERT INTO api_key (key_hash, tenant_id) VALUES (sha256('k'), 'a')`)
	var leaked bool
	if err := db.QueryRowContext(ctx, `SELECT new ? 'key_hash' FROM audit_log WHERE object = 'api_key'`).Scan(&leaked); err != nil || leaked {
		t.Fatalf("audit of api_key holds key_hash=%v (%v)", leaked, err)
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// TestChecksAcceptExactlyValidateID: a tenant, route or scope id is accepted by the
// database if and only if regions.ValidateID accepts it, so no row the database holds can
// be one the loader must refuse.
func TestChecksAcceptExactlyValidateID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO region (name) VALUES ('r1')`); err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "_other", "_OTHER", "_other2", "other", "_", ".", "-", "..", "a.b_c-D9",
		strings.Repeat("x", 64), strings.Repeat("x", 65), "", "*", "a b", "a/b", "é", "a\n", "ａ", "a\x00b",
		"tab\there", "%", "a*", "Ω", "ß"}
	ids = append(ids, migrations.ReservedIDs...)
	try := func(sql string, args ...any) bool {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		_, err = tx.ExecContext(ctx, sql, args...)
		return err == nil
	}
	for i, id := range ids {
		if id == "*" {
			continue // the wildcard is a default rule, not an id
		}
		for _, kind := range []string{"tenant", "route"} {
			goOK := regions.ValidateID(kind, id) == nil
			var dbOK bool
			if kind == "tenant" {
				dbOK = try(`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ($1, 'r', 1, 1)`, id) &&
					try(`INSERT INTO api_key (key_hash, tenant_id) VALUES (sha256($2::bytea), $1)`, id, fmt.Sprint(i)) &&
					try(`INSERT INTO region_share (scope, region, share, source) VALUES ($1, 'r1', 1, 'override')`, id)
			} else {
				dbOK = try(`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('t', $1, 1, 1)`, id) &&
					try(`INSERT INTO region_share (scope, region, share, source) VALUES ('t/' || $1, 'r1', 1, 'override')`, id)
			}
			if goOK != dbOK {
				t.Errorf("%s id %q: ValidateID accepts=%v, database accepts=%v", kind, id, goOK, dbOK)
			}
		}
	}
}

// TestReservedMigrationNamesExistingRows: rows written before migration 4 with a reserved
// id stop it with an error that names every one of them.
func TestReservedMigrationNamesExistingRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.UpTo(ctx, db, 3); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO region (name) VALUES ('r1')`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('_other', 'r', 1, 1)`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('t', '_other', 1, 1)`,
		`INSERT INTO api_key (key_hash, tenant_id) VALUES (sha256('k'), '_other')`,
		`INSERT INTO region_share (scope, region, share, source) VALUES ('t/_other', 'r1', 1, 'rebalancer')`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	err := migrations.Up(ctx, db)
	if err == nil {
		t.Fatal("migration 4 accepted rows with a reserved id")
	}
	for _, want := range []string{"tenant=_other route=r", "tenant=t route=_other", "api_key id=", "scope=t/_other region=r1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
	if v, _ := migrations.Version(ctx, db); v != 3 {
		t.Fatalf("version %d after the refused migration, want 3", v)
	}
	// Deleting them lets it through.
	for _, q := range []string{`DELETE FROM region_share`, `DELETE FROM api_key`, `DELETE FROM rate_limit_rule WHERE tenant_id <> '*'`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
}

// TestChecksAcceptExactlyValidRules: a rule's capacity and refill are accepted by the
// database if and only if regions.Rule.Validate accepts them (issue 14 item 5: above
// the bounds the limiter could not decide, and the gateway failed open).
func TestChecksAcceptExactlyValidRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		capacity int64
		refill   float64
	}{
		{1, 1}, {0, 1}, {-1, 1}, {1, 0}, {1, 1e-9},
		{regions.MaxCapacity, 1}, {regions.MaxCapacity + 1, 1}, {math.MaxInt64, 1},
		{1, regions.MaxRefillPerSecond}, {1, regions.MaxRefillPerSecond * 1.000001}, {1, 1e300},
	} {
		rule := regions.Rule{Tenant: "t", Route: fmt.Sprintf("r%d", i), Capacity: tc.capacity, RefillPerSecond: tc.refill, Shards: 1}
		goOK := rule.Validate() == nil
		_, err := db.ExecContext(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ($1, $2, $3, $4)`,
			rule.Tenant, rule.Route, rule.Capacity, rule.RefillPerSecond)
		if dbOK := err == nil; goOK != dbOK {
			t.Errorf("capacity %d refill %v: Validate accepts=%v, database accepts=%v (%v)", tc.capacity, tc.refill, goOK, dbOK, err)
		}
	}
}
