package main

import (
	"context"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// newDB is a migrated, empty control-plane database and a cli pointed at it through the
// environment, as an operator would set it.
func newDB(t *testing.T) (*cli, string) {
	t.Helper()
	url := testenv.PostgresDB(t)
	c := newCLI(t, map[string]string{envDatabaseURL: url})
	c.ok("migrate", "up")
	return c, url
}

// sql runs one query returning a single integer (a count).
func sqlInt(t *testing.T, url, q string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// goldenBoth runs args with -o table and -o json and compares both with golden files,
// times normalised.
func goldenBoth(t *testing.T, c *cli, name string, args ...string) {
	t.Helper()
	for _, format := range []string{"table", "json"} {
		r := c.ok(append(args, "-o", format)...)
		golden(t, name+"."+format, normTimes(r.stdout))
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresDB(t)
	c := newCLI(t, map[string]string{envDatabaseURL: url})
	goldenBoth(t, c, "migrate_status_empty", "migrate", "status")
	golden(t, "migrate_up.table", normTimes(c.ok("migrate", "up").stdout))
	goldenBoth(t, c, "migrate_status", "migrate", "status")
	// Up again changes nothing.
	if r := c.ok("migrate", "up"); !strings.Contains(r.stdout, "applied 0 migration(s)") {
		t.Errorf("second migrate up: %s", r.stdout)
	}
}

func TestRegions(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	if r := c.ok("regions", "add", "us-east"); r.stdout != "added region us-east\n" || r.stderr != "" {
		t.Errorf("add: %+v", r)
	}
	c.ok("regions", "add", "eu-west", "--reason", "new region")
	c.ok("regions", "add", "ap-south")
	// Two live gateways in us-east, one in eu-west (heartbeats as the gateways write them).
	st, err := store.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	for id, region := range map[string]string{"gw-1": "us-east", "gw-2": "us-east", "gw-3": "eu-west"} {
		if err := st.Heartbeat(context.Background(), id, region); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	goldenBoth(t, c, "regions_list", "regions", "list")
	// One liveness definition (issue 22): a gateway last seen 20 s ago is not live for
	// ratectl either, as for the rebalancer and its status page (15 s; ratectl said 30 s).
	if _, err := pgxExec(url, `UPDATE gateway_instance SET last_seen = now() - interval '20 seconds' WHERE id = 'gw-3'`); err != nil {
		t.Fatal(err)
	}
	if r := c.ok("regions", "list", "-o", "json"); !strings.Contains(r.stdout, `"region": "eu-west"`) ||
		strings.Contains(strings.SplitN(r.stdout[strings.Index(r.stdout, `"region": "eu-west"`):], "}", 2)[0], `"live_gateways": 1`) {
		t.Errorf("regions list with eu-west's only gateway seen 20 s ago: %s; want eu-west with no live gateway", r.stdout)
	}
	if _, err := pgxExec(url, `UPDATE gateway_instance SET last_seen = now() WHERE id = 'gw-3'`); err != nil {
		t.Fatal(err)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM audit_log WHERE object LIKE 'region%' AND actor = 'alice' AND reason = 'new region'`); n != 1 {
		t.Errorf("audit rows for eu-west: %d", n)
	}

	// A scope under an override: the new region gets 0 of it, and the operator is warned.
	c.ok("regions", "remove", "ap-south")
	c.ok("shares", "set", "us-east=0.6", "eu-west=0.4", "--reason", "test", "--apply")
	r := c.ok("regions", "add", "ap-south")
	if !strings.Contains(r.stderr, "warning: scopes * are under an operator override: ap-south gets 0 of them") {
		t.Errorf("no warning on add: %q", r.stderr)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM region_share WHERE region = 'ap-south' AND source = 'override' AND share = 0`); n != 1 {
		t.Errorf("ap-south override rows with 0: %d, want 1", n)
	}
	// Rebalancer rows: the new region starts at the floor, as the command says.
	c.ok("shares", "clear", "--reason", "test")
	c.ok("regions", "remove", "ap-south", "--force")
	if _, err := pgxExec(url, `INSERT INTO region_share (scope, region, share, source) VALUES ('*', 'us-east', 0.7, 'rebalancer'), ('*', 'eu-west', 0.3, 'rebalancer')`); err != nil {
		t.Fatal(err)
	}
	r = c.ok("regions", "add", "ap-south")
	if !strings.Contains(r.stdout, "ap-south starts at the floor (0.05) of the rebalancer's shares of *") || r.stderr != "" {
		t.Errorf("add under rebalancer rows: %+v", r)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM region_share WHERE region = 'ap-south' AND source = 'rebalancer' AND abs(share - 0.05) < 1e-12`); n != 1 {
		t.Errorf("ap-south rebalancer rows at the floor 0.05: %d, want 1", n)
	}
	if _, err := pgxExec(url, `DELETE FROM region_share`); err != nil {
		t.Fatal(err)
	}
	c.ok("shares", "set", "us-east=0.5", "eu-west=0.3", "ap-south=0.2", "--reason", "test", "--apply")

	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"add existing", []string{"regions", "add", "us-east"}, exitFailure, "region us-east already exists"},
		{"add bad id", []string{"regions", "add", "us east"}, exitUsage, `invalid region id "us east"`},
		{"add no name", []string{"regions", "add"}, exitUsage, "ratectl regions add needs a region NAME"},
		{"remove unknown", []string{"regions", "remove", "mars"}, exitFailure, "region mars does not exist"},
		{"remove in use", []string{"regions", "remove", "eu-west"}, exitFailure, "region eu-west still has shares"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkError(t, c.run(tc.args...), tc.code, tc.contains, "") })
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM region WHERE name = 'eu-west'`); n != 1 {
		t.Fatalf("eu-west removed by a refused remove")
	}
	c.ok("regions", "remove", "eu-west", "--force")
	if n := sqlInt(t, url, `SELECT count(*) FROM region_share WHERE region = 'eu-west'`); n != 0 {
		t.Errorf("%d shares of eu-west left after --force", n)
	}
}

var secretRE = regexp.MustCompile(store.KeyPrefix + `[A-Za-z0-9_-]{20,}`)

func TestKeys(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "*", "--capacity", "100", "--refill", "50")

	// Known tenant: no warning; the secret is printed once and only its hash is stored.
	r := c.ok("keys", "create", "--tenant", "shop-a", "--label", "ci")
	if r.stderr != "" {
		t.Errorf("stderr: %q", r.stderr)
	}
	secret := secretRE.FindString(r.stdout)
	if secret == "" {
		t.Fatalf("no key in %q", r.stdout)
	}
	h := regions.HashKey(secret)
	if n := sqlInt(t, url, `SELECT count(*) FROM api_key WHERE key_hash = $1 AND tenant_id = 'shop-a' AND label = 'ci'`, h[:]); n != 1 {
		t.Errorf("hash of the printed key stored %d times", n)
	}
	golden(t, "keys_create.table", secretRE.ReplaceAllString(normTimes(r.stdout), "qp_SECRET"))

	// Unknown tenant: warned, created.
	r = c.ok("keys", "create", "--tenant", "new-co", "-o", "json")
	if !strings.Contains(r.stderr, "warning: tenant new-co has no rules and no keys yet") {
		t.Errorf("no warning for an unknown tenant: %q", r.stderr)
	}
	secret2 := secretRE.FindString(r.stdout)

	golden(t, "keys_create.json", secretRE.ReplaceAllString(normTimes(r.stdout), "qp_SECRET"))

	c.ok("keys", "create", "--tenant", "shop-a", "--label", "old")
	c.ok("keys", "revoke", "3", "--reason", "leaked")
	if n := sqlInt(t, url, `SELECT count(*) FROM audit_log WHERE object LIKE 'api_key%' AND actor = 'alice' AND reason = 'leaked'`); n != 1 {
		t.Errorf("audit rows for the revoke: %d", n)
	}
	goldenBoth(t, c, "keys_list", "keys", "list")
	goldenBoth(t, c, "keys_list_tenant", "keys", "list", "--tenant", "shop-a")
	for _, args := range [][]string{{"keys", "list"}, {"keys", "list", "-o", "json"}} {
		if out := c.ok(args...).stdout; strings.Contains(out, secret) || strings.Contains(out, secret2) || strings.Contains(out, store.KeyPrefix) {
			t.Errorf("keys list shows a secret: %s", out)
		}
	}

	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"create without tenant", []string{"keys", "create"}, exitUsage, `required flag(s) "tenant" not set`},
		{"create bad tenant", []string{"keys", "create", "--tenant", "shop/a"}, exitUsage, `invalid tenant id "shop/a"`},
		{"create wildcard tenant", []string{"keys", "create", "--tenant", "*"}, exitUsage, `invalid tenant id "*"`},
		{"revoke unknown", []string{"keys", "revoke", "999"}, exitFailure, "key 999 does not exist"},
		{"revoke bad id", []string{"keys", "revoke", "abc"}, exitUsage, `key id "abc": must be a whole number > 0`},
		{"revoke zero", []string{"keys", "revoke", "0"}, exitUsage, `key id "0": must be a whole number > 0`},
		{"list bad tenant", []string{"keys", "list", "--tenant", "a b"}, exitUsage, `invalid tenant id "a b"`},
	} {
		t.Run(tc.name, func(t *testing.T) { checkError(t, c.run(tc.args...), tc.code, tc.contains, "") })
	}
}

// TestKeyForTenantOnPlan: a tenant on a plan, with no rule or key of its own, is known,
// so creating its first key does not warn that it gets the default rules.
func TestKeyForTenantOnPlan(t *testing.T) {
	t.Parallel()
	c, _ := newDB(t)
	c.ok("plans", "set", "free", "--route", "*", "--capacity", "5", "--refill", "1", "--apply")
	c.ok("plans", "assign", "plan-co", "free", "--apply")
	if r := c.ok("keys", "create", "--tenant", "plan-co", "-o", "json"); strings.Contains(r.stderr, "no rules and no keys") {
		t.Errorf("a tenant on a plan warned as unknown: %q", r.stderr)
	}
	if r := c.ok("keys", "create", "--tenant", "other-co", "-o", "json"); !strings.Contains(r.stderr, "no rules and no keys") {
		t.Errorf("an unknown tenant not warned: %q", r.stderr)
	}
}

func TestRules(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "create-order", "--capacity", "100", "--refill", "50", "--shadow", "--reason", "launch")
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "*", "--capacity", "300", "--refill", "0.5", "--shards", "4")
	c.ok("rules", "set", "--apply", "--tenant", "*", "--route", "search", "--capacity", "10", "--refill", "5")
	// Changing the capacity keeps shadow and shards.
	r := c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "create-order", "--capacity", "120")
	golden(t, "rules_set.table", normTimes(r.stdout))
	goldenBoth(t, c, "rules_list", "rules", "list")
	goldenBoth(t, c, "rules_list_tenant", "rules", "list", "--tenant", "shop-a")
	goldenBoth(t, c, "rules_list_defaults", "rules", "list", "--tenant", "*")
	if n := sqlInt(t, url, `SELECT count(*) FROM audit_log WHERE object LIKE 'rate_limit_rule%' AND actor = 'alice' AND reason = 'launch'`); n != 1 {
		t.Errorf("audit rows for the launch: %d", n)
	}

	// Without --apply: a plan, a loud warning for a * rule, and nothing written.
	plan := c.ok("rules", "delete", "--tenant", "*", "--route", "search")
	if !strings.Contains(plan.stdout, "- rule */search") || !strings.Contains(plan.stdout, "Nothing written") || !strings.Contains(plan.stderr, "WARNING") {
		t.Errorf("rules delete without --apply: %+v", plan)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM rate_limit_rule WHERE route_id = 'search'`); n != 1 {
		t.Errorf("rules delete without --apply deleted the rule")
	}
	c.ok("rules", "delete", "--tenant", "*", "--route", "search", "--apply")
	if n := sqlInt(t, url, `SELECT count(*) FROM rate_limit_rule WHERE route_id = 'search'`); n != 0 {
		t.Errorf("rule not deleted")
	}

	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"zero capacity", []string{"rules", "set", "--apply", "--tenant", "t", "--route", "r", "--capacity", "0", "--refill", "1"}, exitUsage, "--capacity 0: must be > 0"},
		{"negative capacity", []string{"rules", "set", "--apply", "--tenant", "t", "--route", "r", "--capacity", "-5", "--refill", "1"}, exitUsage, "--capacity -5: must be > 0"},
		{"fractional capacity", []string{"rules", "set", "--apply", "--tenant", "t", "--route", "r", "--capacity", "1.5", "--refill", "1"}, exitUsage, `--capacity "1.5": want a whole number`},
		{"zero refill", []string{"rules", "set", "--apply", "--tenant", "t", "--route", "r", "--capacity", "5", "--refill", "0"}, exitUsage, "--refill 0: must be a number > 0"},
		{"negative refill", []string{"rules", "set", "--apply", "--tenant", "t", "--route", "r", "--capacity", "5", "--refill=-1"}, exitUsage, "--refill -1: must be a number > 0"},
		{"nan refill", []string{"rules", "set", "--apply", "--tenant", "t", "--route", "r", "--capacity", "5", "--refill", "NaN"}, exitUsage, "--refill NaN: must be a number > 0"},
		{"bad shards", []string{"rules", "set", "--apply", "--tenant", "t", "--route", "r", "--capacity", "5", "--refill", "1", "--shards", "0"}, exitUsage, "--shards 0: must be between 1 and 1024"},
		{"bad tenant", []string{"rules", "set", "--apply", "--tenant", "shop a", "--route", "r", "--capacity", "5", "--refill", "1"}, exitUsage, `invalid tenant id "shop a"`},
		{"long route", []string{"rules", "set", "--apply", "--tenant", "t", "--route", strings.Repeat("r", 65), "--capacity", "5", "--refill", "1"}, exitUsage, "longer than 64 characters"},
		{"new rule without numbers", []string{"rules", "set", "--apply", "--tenant", "t", "--route", "r", "--capacity", "5"}, exitUsage, "rule t/r does not exist yet: a new rule needs --capacity and --refill"},
		{"missing route", []string{"rules", "set", "--apply", "--tenant", "t"}, exitUsage, `required flag(s) "route" not set`},
		{"delete unknown", []string{"rules", "delete", "--tenant", "t", "--route", "r"}, exitFailure, "rule t/r does not exist"},
		{"delete unknown, apply", []string{"rules", "delete", "--tenant", "t", "--route", "r", "--apply"}, exitFailure, "rule t/r does not exist"},
		{"delete default", []string{"rules", "delete", "--tenant", "*", "--route", "*"}, exitUsage, "the default rule */* cannot be deleted"},
		{"list bad route", []string{"rules", "list", "--route", "a/b"}, exitUsage, `invalid route id "a/b"`},
	} {
		t.Run(tc.name, func(t *testing.T) { checkError(t, c.run(tc.args...), tc.code, tc.contains, "") })
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM rate_limit_rule WHERE tenant_id = 't'`); n != 0 {
		t.Errorf("a refused rule was written")
	}
}

func TestShares(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("regions", "add", "us-east")
	c.ok("regions", "add", "eu-west")
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "create-order", "--capacity", "100", "--refill", "50")
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "*", "--capacity", "301", "--refill", "7")
	c.ok("rules", "set", "--apply", "--tenant", "*", "--route", "search", "--capacity", "10", "--refill", "5")

	goldenBoth(t, c, "shares_get_default", "shares", "get")
	goldenBoth(t, c, "shares_get_tenant_before", "shares", "get", "--tenant", "shop-a")

	count := func() (shares, history int) {
		return sqlInt(t, url, `SELECT count(*) FROM region_share`), sqlInt(t, url, `SELECT count(*) FROM region_share_history`)
	}

	// The plan writes nothing.
	r := c.ok("shares", "set", "--tenant", "shop-a", "us-east=0.8", "eu-west=0.2", "--reason", "eu-west incident", "--ttl", "2h")
	golden(t, "shares_set_plan.table", r.stdout)
	r = c.ok("shares", "set", "--tenant", "shop-a", "us-east=0.8,eu-west=0.2", "--reason", "eu-west incident", "--ttl", "2h", "-o", "json")
	golden(t, "shares_set_plan.json", r.stdout)
	if s, h := count(); s != 0 || h != 0 {
		t.Fatalf("the plan wrote: %d share rows, %d history rows", s, h)
	}

	// --apply writes the override, one history row per region, by the OS user with the reason.
	r = c.ok("shares", "set", "--tenant", "shop-a", "us-east=0.8", "eu-west=0.2", "--reason", "eu-west incident", "--ttl", "2h", "--apply")
	golden(t, "shares_set_apply.table", r.stdout)
	if s, h := count(); s != 2 || h != 2 {
		t.Fatalf("apply wrote %d share rows, %d history rows; want 2 and 2", s, h)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM region_share_history WHERE actor = 'alice' AND reason = 'eu-west incident' AND scope = 'shop-a' AND source = 'override'`); n != 2 {
		t.Errorf("history rows by alice: %d", n)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM region_share WHERE expires_at BETWEEN now() + interval '119 minutes' AND now() + interval '121 minutes'`); n != 2 {
		t.Errorf("override rows expiring in 2h: %d", n)
	}
	goldenBoth(t, c, "shares_get_tenant_after", "shares", "get", "--tenant", "shop-a")
	goldenBoth(t, c, "shares_get_route", "shares", "get", "--tenant", "shop-a", "--route", "create-order")

	// A rebalancer change with its inputs, as the job writes it.
	ctx := context.Background()
	st, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	inputs := map[string]any{"scope": "*", "reason": "interval", "kind": "run", "refill_per_second": 10, "capacity": 20,
		"regions": []map[string]any{
			{"region": "us-east", "status": "ok", "offered_long_rps": 600.5, "offered_short_rps": 610, "allowed_rps": 500, "throttled_rps": 100.5, "share": 0.75},
			{"region": "eu-west", "status": "ok", "offered_long_rps": 200, "offered_short_rps": 190, "allowed_rps": 200, "throttled_rps": 0, "share": 0.25},
		}}
	if err := st.WriteRebalancerShares(ctx, []store.ShareChange{
		{Scope: regions.GlobalScope, Region: "us-east", Old: 0.5, New: 0.75, Reason: "interval"},
		{Scope: regions.GlobalScope, Region: "eu-west", Old: 0.5, New: 0.25, Reason: "interval"},
	}, inputs, "rebalancer"); err != nil {
		t.Fatal(err)
	}
	goldenBoth(t, c, "shares_get_default_rebalanced", "shares", "get")

	c.ok("shares", "clear", "--tenant", "shop-a", "--reason", "incident over")
	if n := sqlInt(t, url, `SELECT count(*) FROM region_share WHERE source = 'override'`); n != 0 {
		t.Errorf("%d override rows left after clear", n)
	}
	goldenBoth(t, c, "shares_history", "shares", "history")
	goldenBoth(t, c, "shares_history_tenant", "shares", "history", "--tenant", "shop-a", "--limit", "2")

	before, hbefore := count()
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"sum above 1", []string{"shares", "set", "us-east=0.8", "eu-west=0.3", "--reason", "x"}, exitUsage, "they sum to 1.1, not 1"},
		{"sum below 1", []string{"shares", "set", "us-east=0.5", "eu-west=0.4999", "--reason", "x"}, exitUsage, "they sum to 0.9999, not 1"},
		{"unknown region", []string{"shares", "set", "us-east=0.5", "mars=0.5", "--reason", "x"}, exitUsage, `unknown region "mars"`},
		{"missing region", []string{"shares", "set", "us-east=1", "--reason", "x"}, exitUsage, "region eu-west has no share (name every region)"},
		{"zero", []string{"shares", "set", "us-east=1", "eu-west=0", "--reason", "x"}, exitUsage, "share 0 would reject all of the region's traffic"},
		{"negative", []string{"shares", "set", "us-east=1.5", "eu-west=-0.5", "--reason", "x"}, exitUsage, "share 1.5 is more than 1"},
		{"negative alone", []string{"shares", "set", "eu-west=-0.5", "--reason", "x"}, exitUsage, "share -0.5 is negative"},
		{"not a number", []string{"shares", "set", "us-east=lots", "--reason", "x"}, exitUsage, `"lots" is not a decimal number`},
		{"bad region id", []string{"shares", "set", "us_east!=1", "--reason", "x"}, exitUsage, `invalid region id "us_east!"`},
		{"bad tenant id", []string{"shares", "set", "--tenant", "shop a", "us-east=0.5", "eu-west=0.5", "--reason", "x"}, exitUsage, `invalid tenant id "shop a"`},
		{"route without tenant", []string{"shares", "get", "--route", "r"}, exitUsage, "--route needs --tenant"},
		{"no reason", []string{"shares", "set", "us-east=0.5", "eu-west=0.5", "--apply"}, exitUsage, "--reason is required"},
		{"negative ttl", []string{"shares", "set", "us-east=0.5", "eu-west=0.5", "--reason", "x", "--ttl", "-1h"}, exitUsage, `invalid argument "-1h" for "--ttl" flag: "-1h": must not be negative`},
		{"no shares", []string{"shares", "set", "--reason", "x"}, exitUsage, "needs REGION=SHARE for every region"},
		{"clear without override", []string{"shares", "clear", "--reason", "x"}, exitFailure, "scope * has no override: nothing to clear"},
		{"clear without reason", []string{"shares", "clear"}, exitUsage, "--reason is required"},
		{"history bad limit", []string{"shares", "history", "--limit", "0"}, exitUsage, "--limit 0: must be > 0"},
	} {
		args := tc.args
		if args[1] == "set" {
			args = append(args, "--apply")
		}
		t.Run(tc.name, func(t *testing.T) { checkError(t, c.run(args...), tc.code, tc.contains, "") })
	}
	if s, h := count(); s != before || h != hbefore {
		t.Errorf("refused commands wrote: shares %d -> %d, history %d -> %d", before, s, hbefore, h)
	}

	// A tenant nobody knows: the override is allowed, with a warning.
	r = c.ok("shares", "set", "--tenant", "ghost", "us-east=0.5", "eu-west=0.5", "--reason", "x")
	if !strings.Contains(r.stderr, "warning: tenant ghost has no rules and no keys") {
		t.Errorf("no warning: %q", r.stderr)
	}
}

func TestDatabaseErrors(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	const password = "Pa55-w0rd-hunter2"
	closed := "postgres://ops:" + password + "@127.0.0.1:" + port + "/quota?sslmode=disable"

	// An existing server, a database that does not exist.
	real := testenv.PostgresDB(t)
	noDB := strings.Replace(real, "postgres@", "postgres:"+password+"@", 1)
	noDB = noDB[:strings.LastIndex(noDB, "/")] + "/no_such_db?sslmode=disable"

	// The same with the default sslmode (prefer): the server refuses TLS, then answers the
	// plain attempt; that answer is the cause, not "server refused TLS connection".
	noDBPrefer := strings.TrimSuffix(noDB, "?sslmode=disable")
	noRole := strings.Replace(noDBPrefer, "postgres:"+password+"@", "no_such_role:"+password+"@", 1)
	noRole = noRole[:strings.LastIndex(noRole, "/")] + "/postgres"

	start := time.Now()
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		code     int
		contains string
	}{
		{"no url", nil, []string{"regions", "list"}, exitUsage, "no database: set --database-url or RATELIMIT_DATABASE_URL"},
		{"unreachable flag", nil, []string{"regions", "list", "--database-url", closed}, exitUnreachable, "database at 127.0.0.1:" + port + " unreachable: connection refused"},
		{"unreachable env", map[string]string{envDatabaseURL: closed}, []string{"shares", "get"}, exitUnreachable, "database at 127.0.0.1:" + port + " unreachable"},
		{"unreachable write", map[string]string{envDatabaseURL: closed}, []string{"shares", "set", "a=1", "--reason", "x", "--apply"}, exitUnreachable, "database at 127.0.0.1:" + port + " unreachable"},
		{"unreachable key dsn", nil, []string{"keys", "list", "--database-url", "host=127.0.0.1 port=" + port + " user=ops password=" + password}, exitUnreachable, "database at 127.0.0.1:" + port + " unreachable"},
		{"no such database", nil, []string{"regions", "list", "--database-url", noDB}, exitFailure, `refused the connection: database "no_such_db" does not exist`},
		{"no such database, sslmode prefer", nil, []string{"regions", "list", "--database-url", noDBPrefer}, exitFailure, `refused the connection: database "no_such_db" does not exist (SQLSTATE 3D000)`},
		{"no such role, sslmode prefer", nil, []string{"regions", "list", "--database-url", noRole}, exitFailure, `refused the connection: role "no_such_role" does not exist (SQLSTATE 28000)`},
		{"bad url", nil, []string{"regions", "list", "--database-url", "postgres://ops:" + password + "@127.0.0.1:notaport/x"}, exitUsage, "database url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkError(t, newCLI(t, tc.env).run(tc.args...), tc.code, tc.contains, password)
		})
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("database errors took %v", d)
	}
}

func pgxExec(url, q string, args ...any) (int64, error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

// TestDeleteRowsWithReservedIDs: rows the database holds but the gateways skip (written
// before migration 4, or with its CHECKs dropped) can be deleted with ratectl.
func TestDeleteRowsWithReservedIDs(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("regions", "add", "us-east")
	for _, q := range []string{
		`ALTER TABLE rate_limit_rule DROP CONSTRAINT rate_limit_rule_tenant_reserved, DROP CONSTRAINT rate_limit_rule_route_reserved`,
		`ALTER TABLE region_share DROP CONSTRAINT region_share_scope_reserved`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('_other', '*', 1, 1), ('t', '_other', 1, 1)`,
		`INSERT INTO region_share (scope, region, share, source) VALUES ('_other/x', 'us-east', 1, 'rebalancer'), ('_other/x', 'us-east', 1, 'override')`,
	} {
		if _, err := pgxExec(url, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	c.ok("rules", "delete", "--tenant", "_other", "--route", "*", "--apply")
	c.ok("rules", "delete", "--tenant", "t", "--route", "_other", "--apply")
	if r := c.ok("shares", "clear", "--raw-scope", "_other/x", "--reason", "bad row"); !strings.Contains(r.stdout, "deleted 2 share row(s)") {
		t.Errorf("shares clear --raw-scope: %+v", r)
	}
	if n := sqlInt(t, url, `SELECT (SELECT count(*) FROM rate_limit_rule WHERE tenant_id = '_other' OR route_id = '_other') + (SELECT count(*) FROM region_share)`); n != 0 {
		t.Errorf("%d bad rows left", n)
	}
	if r := c.run("shares", "clear", "--raw-scope", "_other/x", "--tenant", "a", "--reason", "x"); r.code != exitUsage {
		t.Errorf("--raw-scope with --tenant: %+v", r)
	}
}
