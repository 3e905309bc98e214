package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlans: ratectl plans set, get, list, assign, unassign and delete, dry run by
// default as rules set is; one plans set changes the plan of 1,000 tenants with one
// audit row; a tenant's own rule wins in shares get; refusals are worded.
func TestPlans(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("regions", "add", "us-east")

	// Dry run: the change, nothing written.
	r := c.ok("plans", "set", "pro", "--route", "*", "--capacity", "200", "--refill", "100")
	if !strings.Contains(r.stdout, "+ plan pro\n") || !strings.Contains(r.stdout, "+ plan_rule pro/*: capacity 200, refill 100/s") ||
		!strings.Contains(r.stdout, "Nothing written") {
		t.Errorf("plans set dry run:\n%s", r.stdout)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM plan`); n != 0 {
		t.Fatalf("a dry run wrote %d plans", n)
	}
	c.ok("plans", "set", "pro", "--route", "*", "--capacity", "200", "--refill", "100", "--apply")
	c.ok("plans", "set", "pro", "--route", "search", "--capacity", "20", "--refill", "1", "--apply")
	r = c.ok("plans", "set", "free", "--route", "*", "--capacity", "10", "--refill", "1", "--apply", "-o", "json")
	var got usagePlanJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.Name != "free" || len(got.Rules) != 1 || got.Rules[0].Capacity != 10 {
		t.Fatalf("plans set -o json: %+v, %v\n%s", got, err, r.stdout)
	}

	// 1,000 tenants on pro, one with a rule of its own.
	r = c.ok("plans", "assign", "acme", "pro")
	if !strings.Contains(r.stdout, "+ tenant_plan acme: plan pro") || sqlInt(t, url, `SELECT count(*) FROM tenant_plan`) != 0 {
		t.Errorf("plans assign dry run:\n%s", r.stdout)
	}
	c.ok("plans", "assign", "acme", "pro", "--apply")
	c.ok("rules", "set", "--tenant", "own", "--route", "*", "--capacity", "5", "--refill", "1", "--apply")
	if n := sqlInt(t, url, `WITH ins AS (INSERT INTO tenant_plan (tenant_id, plan) SELECT 't' || i, 'pro' FROM generate_series(1, 998) i RETURNING 1),
		own AS (INSERT INTO tenant_plan (tenant_id, plan) VALUES ('own', 'pro') RETURNING 1)
		SELECT (SELECT count(*) FROM ins) + (SELECT count(*) FROM own)`); n != 999 {
		t.Fatalf("seeded %d tenants", n)
	}
	audits := sqlInt(t, url, `SELECT count(*) FROM audit_log`)
	r = c.ok("plans", "set", "pro", "--route", "*", "--capacity", "400", "--apply")
	if !strings.Contains(r.stderr, "WARNING: plan pro: this changes the limit of EVERY tenant of the plan without a rule of its own (1000 tenants)") {
		t.Errorf("plans set of a plan in use: stderr %q", r.stderr)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM audit_log`) - audits; n != 1 {
		t.Errorf("one plans set wrote %d audit rows, want 1", n)
	}
	r = c.ok("plans", "get", "pro", "-o", "json")
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.Tenants != 1000 || len(got.Rules) != 2 ||
		got.Rules[0].Route != "*" || got.Rules[0].Capacity != 400 || got.Rules[0].RefillPerSecond != 100 {
		t.Errorf("plans get pro: %+v, %v", got, err)
	}
	r = c.ok("plans", "list")
	if !strings.Contains(r.stdout, "PLAN") || !strings.Contains(r.stdout, "free") || !strings.Contains(r.stdout, "pro") {
		t.Errorf("plans list:\n%s", r.stdout)
	}

	// Which rule applies: the plan's, but the tenant's own where it has one.
	r = c.ok("shares", "get", "--tenant", "acme")
	if !strings.Contains(r.stdout, "plan pro/*") || !strings.Contains(r.stdout, "plan pro/search") {
		t.Errorf("shares get of a tenant on pro:\n%s", r.stdout)
	}
	r = c.ok("shares", "get", "--tenant", "own", "-o", "json")
	if !strings.Contains(r.stdout, `"rule_tenant": "own"`) || strings.Contains(r.stdout, `"rule_plan"`) {
		t.Errorf("shares get of a tenant with its own rule on pro: %s", r.stdout)
	}

	// Refusals, worded.
	checkError(t, c.run("plans", "assign", "x", "gold", "--apply"), exitFailure, "plan gold does not exist", "")
	checkError(t, c.run("plans", "get", "gold"), exitFailure, "plan gold does not exist", "")
	checkError(t, c.run("plans", "delete", "pro", "--apply"), exitFailure, "plan pro is in use by 1000 tenants: unassign them first", "")
	checkError(t, c.run("plans", "delete", "pro", "--route", "nope"), exitFailure, "plan pro has no rule for route nope", "")
	checkError(t, c.run("plans", "get", "bad plan"), exitUsage, "plan", "")
	checkError(t, c.run("plans", "assign", "*", "pro"), exitUsage, "tenant", "")
	checkError(t, c.run("plans", "set", "pro", "--route", "new", "--capacity", "3"), exitUsage, "a new rule needs --capacity and --refill", "")
	checkError(t, c.run("plans", "set", "pro", "--route", "*", "--capacity", "0"), exitUsage, "capacity", "")
	checkError(t, c.run("plans", "unassign", "nobody", "--apply"), exitFailure, "tenant nobody has no plan", "")
	checkError(t, c.run("plans"), exitUsage, "ratectl plans needs a subcommand", "")

	// Delete a rule, unassign, delete the plan.
	r = c.ok("plans", "delete", "pro", "--route", "search", "--apply")
	if !strings.Contains(r.stdout, "- plan_rule pro/search") || sqlInt(t, url, `SELECT count(*) FROM plan_rule WHERE plan = 'pro'`) != 1 {
		t.Errorf("plans delete --route:\n%s", r.stdout)
	}
	if n := strings.Count(r.stderr, "WARNING: plan pro:"); n != 1 {
		t.Errorf("plans delete --route --apply warned %d times, want once: %q", n, r.stderr)
	}
	c.ok("plans", "unassign", "acme", "--apply")
	if n := sqlInt(t, url, `SELECT count(*) FROM tenant_plan WHERE tenant_id = 'acme'`); n != 0 {
		t.Errorf("acme still on a plan")
	}
	r = c.ok("plans", "delete", "free")
	if !strings.Contains(r.stdout, "- plan free") || sqlInt(t, url, `SELECT count(*) FROM plan WHERE name = 'free'`) != 1 {
		t.Errorf("plans delete dry run:\n%s", r.stdout)
	}
	c.ok("plans", "delete", "free", "--apply")
	if n := sqlInt(t, url, `SELECT count(*) FROM plan WHERE name = 'free'`); n != 0 {
		t.Errorf("free not deleted")
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM audit_log WHERE object IN ('plan', 'plan_rule', 'tenant_plan') AND on_behalf_of = 'alice'`); n < 8 {
		t.Errorf("%d audit rows of plan changes name alice", n)
	}
}

// TestApplyPlansFile: a limits file with plans and tenant_plans is planned, applied,
// exported and applied again with no change; --prune plans,tenant_plans deletes what it
// no longer lists.
func TestApplyPlansFile(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "limits.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`plans:
  - name: pro
    rules:
      - {route: "*", capacity: 200, refill_per_second: 100}
      - {route: search, capacity: 20, refill_per_second: 1}
  - name: free
    rules:
      - {route: "*", capacity: 10, refill_per_second: 1}
tenant_plans:
  - {tenant: acme, plan: pro}
  - {tenant: bob, plan: free}
`)
	r := c.ok("diff", "-f", file)
	if !strings.Contains(r.stdout, "+ plan pro") || !strings.Contains(r.stdout, "+ tenant_plan bob: plan free") {
		t.Errorf("diff:\n%s", r.stdout)
	}
	c.ok("apply", "-f", file, "--apply")
	if n := sqlInt(t, url, `SELECT count(*) FROM tenant_plan`); n != 2 {
		t.Fatalf("%d tenants assigned, want 2", n)
	}
	export := c.ok("export").stdout
	if !strings.Contains(export, "plans:") || !strings.Contains(export, "tenant_plans:") || !strings.Contains(export, "name: pro") {
		t.Errorf("export:\n%s", export)
	}
	write(export)
	if r := c.ok("diff", "-f", file); !strings.Contains(r.stdout, "No changes") {
		t.Errorf("diff of the export:\n%s", r.stdout)
	}
	write(`plans:
  - name: pro
    rules:
      - {route: "*", capacity: 300, refill_per_second: 100}
tenant_plans:
  - {tenant: acme, plan: pro}
`)
	checkError(t, c.run("diff", "-f", file, "--prune", "plans"), exitUsage, "plan free: removed, but tenant bob is assigned to it", "")
	r = c.ok("apply", "-f", file, "--prune", "plans,tenant_plans", "--apply")
	for _, want := range []string{"~ plan_rule pro/*: capacity 200, refill 100/s -> capacity 300, refill 100/s", "- plan_rule pro/search", "- tenant_plan bob", "- plan free"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("apply --prune: no %q in\n%s", want, r.stdout)
		}
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM plan`); n != 1 {
		t.Errorf("%d plans left, want 1", n)
	}
}

// TestAuditPlans: ratectl audit names plan changes by plan, plan/route and tenant, with
// the rule's numbers and the tenant's plan before and after.
func TestAuditPlans(t *testing.T) {
	t.Parallel()
	c, _ := newDB(t)
	c.ok("plans", "set", "pro", "--route", "*", "--capacity", "200", "--refill", "100", "--apply")
	c.ok("plans", "set", "pro", "--route", "*", "--capacity", "400", "--apply")
	c.ok("plans", "set", "free", "--route", "*", "--capacity", "10", "--refill", "1", "--apply")
	c.ok("plans", "assign", "acme", "pro", "--apply")
	c.ok("plans", "assign", "acme", "free", "--apply")
	r := c.ok("audit")
	for _, want := range []string{"plan_rule", "pro/*", "capacity 200, refill 100/s -> capacity 400, refill 100/s", "tenant_plan", "acme", "plan pro -> plan free"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("audit: no %q in\n%s", want, r.stdout)
		}
	}
}

// TestApplyPlanLosesRules (G2): a plan listed in a limits file without some of its rules
// loses them, which reaches every tenant of the plan: diff and apply warn on stderr, as
// plans set and delete do; a plan without tenants loses its rules without a warning.
func TestApplyPlanLosesRules(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	file := filepath.Join(t.TempDir(), "limits.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`plans:
  - name: pro
    rules:
      - {route: "*", capacity: 200, refill_per_second: 100}
      - {route: search, capacity: 20, refill_per_second: 1}
  - name: free
    rules:
      - {route: "*", capacity: 10, refill_per_second: 1}
tenant_plans:
  - {tenant: acme, plan: pro}
`)
	c.ok("apply", "-f", file, "--apply")
	write(`plans:
  - name: pro
  - name: free
`)
	want := "WARNING: plan pro: the file does not list its rules for routes *, search: they are deleted, which changes the limit of EVERY tenant of the plan without a rule of its own (1 tenants)"
	for _, args := range [][]string{{"diff", "-f", file}, {"apply", "-f", file}, {"apply", "-f", file, "--apply"}} {
		r := c.ok(args...)
		if !strings.Contains(r.stderr, want) || strings.Count(r.stderr, "WARNING") != 1 {
			t.Errorf("%v: stderr %q, want one WARNING %q (none for free, which has no tenants)", args, r.stderr, want)
		}
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM plan_rule`); n != 0 {
		t.Errorf("%d plan rules left, want 0", n)
	}
}
