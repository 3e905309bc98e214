package main

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/migrations"
)

func sqlExec(t *testing.T, url, q string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestMigrateDownRefuses (issue 25): `migrate down --apply` refuses while gateways are
// live and when the step would remove the audit protections, naming each reason and the
// flag that overrides it, exits 1 and writes nothing; the plan (table and JSON) shows the
// same; with the flags it rolls back.
func TestMigrateDownRefuses(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	version := func() int {
		return sqlInt(t, url, `SELECT max(version_id) FROM goose_db_version WHERE is_applied`)
	}
	latest := int(migrations.Latest())
	sqlExec(t, url, `INSERT INTO gateway_instance (id, region) VALUES ('gw-1', 'us-east')`)

	checkError(t, c.run("migrate", "down", "--apply"), exitFailure, "gateways are live on this schema (heartbeat within 15s, not stopped): gw-1 (us-east)", "")
	checkError(t, c.run("migrate", "down", "--apply"), exitFailure, "override with --allow-live-gateways", "")
	if v := version(); v != latest {
		t.Fatalf("a refused roll back changed the version to %d", v)
	}
	r := c.ok("migrate", "down")
	if !strings.Contains(r.stdout, "refused (--allow-live-gateways): gateways are live") {
		t.Errorf("plan does not show the refusal:\n%s", r.stdout)
	}
	r = c.ok("migrate", "down", "-o", "json")
	var plan struct {
		Version  int64 `json:"version"`
		Applied  bool  `json:"applied"`
		Blocking []struct {
			Kind string `json:"kind"`
		} `json:"blocking"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &plan); err != nil {
		t.Fatalf("plan JSON: %v\n%s", err, r.stdout)
	}
	if plan.Version != int64(latest) || plan.Applied || len(plan.Blocking) != 1 || plan.Blocking[0].Kind != "live_gateways" {
		t.Errorf("plan JSON %+v, want migration %d not applied, blocked by live_gateways", plan, latest)
	}

	c.ok("migrate", "down", "--apply", "--allow-live-gateways")
	if v := version(); v != latest-1 {
		t.Fatalf("after the forced roll back: version %d, want %d", v, latest-1)
	}
	// 00012 (bands) without bands, 00011 (plans) without plans, and 00010 (statement-level
	// raise triggers), lose nothing.
	for v := version(); v > 9; v = version() {
		c.ok("migrate", "down", "--apply", "--allow-live-gateways")
	}
	// 00009 removes the append-only triggers and the roles' grants.
	checkError(t, c.run("migrate", "down", "--apply", "--allow-live-gateways"), exitFailure, "override with --remove-protection", "")
	if v := version(); v != 9 {
		t.Fatalf("a refused roll back changed the version to %d", v)
	}
	r = c.ok("migrate", "down", "--apply", "--allow-live-gateways", "--remove-protection")
	if !strings.Contains(r.stdout, "rolled back migration 9 (00009_roles.sql)") || !strings.Contains(r.stdout, "overridden (--remove-protection)") {
		t.Errorf("roll back output:\n%s", r.stdout)
	}
	c.ok("migrate", "up")
	if v := version(); v != latest {
		t.Fatalf("after migrate up: version %d, want %d", v, latest)
	}
}

// TestActorIsTheDatabaseRole (issue 25): run as an operator's login role, --actor is
// recorded as on_behalf_of and the audit actor is the role, so a flag cannot forge it.
func TestActorIsTheDatabaseRole(t *testing.T) {
	t.Parallel()
	_, owner := newDB(t)
	opURL := testenv.LoginRole(t, owner, migrations.RoleOperator, "op")
	u, err := url.Parse(opURL)
	if err != nil {
		t.Fatal(err)
	}
	role := u.User.Username()
	op := newCLI(t, map[string]string{envDatabaseURL: opURL})
	op.ok("regions", "add", "r1", "--actor", "rebalancer", "--reason", "forged?")
	if n := sqlInt(t, owner, `SELECT count(*) FROM audit_log WHERE object = 'region' AND actor = $1 AND on_behalf_of = 'rebalancer' AND reason = 'forged?'`, role); n != 1 {
		t.Errorf("%d audit rows by %s on behalf of rebalancer, want 1", n, role)
	}
	if n := sqlInt(t, owner, `SELECT count(*) FROM audit_log WHERE actor = 'rebalancer'`); n != 0 {
		t.Errorf("%d audit rows with the actor rebalancer: --actor forged the actor", n)
	}
	// The operator role cannot erase it either.
	sqlExecAs := func(q string) error {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, opURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	for _, q := range []string{`DELETE FROM audit_log`, `UPDATE audit_log SET actor = 'x'`, `TRUNCATE rate_limit_rule`} {
		if err := sqlExecAs(q); err == nil || !strings.Contains(err.Error(), "42501") {
			t.Errorf("%s as the operator: %v, want a permission error", q, err)
		}
	}
}
