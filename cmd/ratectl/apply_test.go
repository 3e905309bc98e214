package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions/store"
)

// TestApplyPlanThenWrite: apply -f prints a plan and writes nothing; --apply writes exactly
// that plan, one audit row per change, naming the actor; a second apply has nothing to do.
func TestApplyPlanThenWrite(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	const file = "testdata/apply/limits.yaml"
	auditBefore := sqlInt(t, url, `SELECT count(*) FROM audit_log`)

	r := c.ok("apply", "-f", file)
	golden(t, "apply_plan.table", r.stdout)
	if !strings.Contains(r.stderr, "WARNING: rule */* is the default of EVERY tenant") ||
		!strings.Contains(r.stderr, "WARNING: rule shop-a/* applies to EVERY route of tenant shop-a") {
		t.Errorf("no loud warning for the wildcard rules: %q", r.stderr)
	}
	golden(t, "apply_plan.json", c.ok("apply", "-f", file, "-o", "json").stdout)
	if n := sqlInt(t, url, `SELECT count(*) FROM region`); n != 0 {
		t.Fatalf("a plan wrote %d regions", n)
	}
	diff := c.ok("diff", "-f", file)
	if diff.stdout != r.stdout {
		t.Errorf("diff differs from apply's plan:\n%s\n%s", diff.stdout, r.stdout)
	}

	r = c.ok("apply", "-f", file, "--apply", "--actor", "ci-pipeline", "--reason", "PR 42")
	golden(t, "apply_applied.table", r.stdout)
	// 2 regions, 3 rules (*/* changed, two added), 1 key: 6 audit rows, all by ci-pipeline.
	if got := sqlInt(t, url, `SELECT count(*) FROM audit_log WHERE actor = 'ci-pipeline' AND reason = 'PR 42'`); got != 6 {
		t.Errorf("%d audit rows by ci-pipeline, want 6", got)
	}
	if got := sqlInt(t, url, `SELECT count(*) FROM audit_log`) - auditBefore; got != 6 {
		t.Errorf("%d audit rows, want 6", got)
	}
	if got := sqlInt(t, url, `SELECT count(*) FROM region_share_history WHERE actor = 'ci-pipeline'`); got != 2 {
		t.Errorf("%d share history rows for the override, want 2", got)
	}
	if r := c.ok("apply", "-f", file); !strings.Contains(r.stdout, "No changes") {
		t.Errorf("second plan: %q, want no changes", r.stdout)
	}
	// The audit shows the writes, newest first, with the actor.
	r = c.ok("audit", "--since", "7d", "-o", "json")
	var entries []store.AuditEntry
	if err := json.Unmarshal([]byte(r.stdout), &entries); err != nil {
		t.Fatal(err)
	}
	// The 6 audit_log rows and the override's 2 share history rows: apply's override
	// writes are in the audit too.
	byCI, overrides := 0, map[string]float64{}
	for _, e := range entries {
		if e.Actor == "ci-pipeline" {
			byCI++
		}
		if e.Object == "override" && e.Action == "insert" && e.Reason == "PR 42" {
			var row overrideRow
			if err := json.Unmarshal(e.New, &row); err != nil {
				t.Fatalf("override entry new %s: %v", e.New, err)
			}
			if row.Tenant != "shop-a" || row.Route != "*" || row.ExpiresAt == nil || !row.ExpiresAt.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) {
				t.Errorf("override entry new = %s, want tenant shop-a, route *, expires 2030-01-02T03:04:05Z", e.New)
			}
			overrides[row.Region] = row.Share
		}
		// Every other command says tenant and route.
		for _, side := range []json.RawMessage{e.Old, e.New} {
			if strings.Contains(string(side), `"tenant_id"`) || strings.Contains(string(side), `"route_id"`) {
				t.Errorf("audit entry %d (%s) says tenant_id/route_id: %s", e.ID, e.Object, side)
			}
		}
		if e.Object == "rule" && !strings.Contains(string(e.New)+string(e.Old), `"tenant":`) {
			t.Errorf("rule entry %d has no tenant: old %s new %s", e.ID, e.Old, e.New)
		}
	}
	if byCI != 8 {
		t.Errorf("audit -o json lists %d entries by ci-pipeline, want 8 (6 rows, 2 override shares)", byCI)
	}
	if want := map[string]float64{"us-east": 0.75, "eu-west": 0.25}; !maps.Equal(overrides, want) {
		t.Errorf("override entries %v, want %v", overrides, want)
	}
	r = c.ok("audit", "--by", "ci-pipeline")
	for _, want := range []string{"shop-a/search", "PR 42", "override", "shop-a/* us-east", "share 0.7500"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("audit table lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestExportRoundTrip: what export prints, apply takes back with no change; and after a
// change made with the imperative commands, the export shows it.
func TestExportRoundTrip(t *testing.T) {
	t.Parallel()
	c, _ := newDB(t)
	c.clock = func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }
	c.ok("apply", "-f", "testdata/apply/limits.yaml", "--apply")
	c.ok("rules", "set", "--tenant", "shop-b", "--route", "create-order", "--capacity", "7", "--refill", "0.5", "--apply")
	out := c.ok("export").stdout
	golden(t, "export.yaml", out)
	path := filepath.Join(t.TempDir(), "exported.yaml")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := c.ok("apply", "-f", path); !strings.Contains(r.stdout, "No changes") {
		t.Errorf("apply of the export plans changes:\n%s", r.stdout)
	}
	// Removing the rule from the exported file deletes it with --prune rules, only.
	edited := strings.Replace(out, "  - tenant: shop-b\n    route: create-order\n    capacity: 7\n    refill_per_second: 0.5\n", "", 1)
	if edited == out {
		t.Fatalf("export does not list shop-b's rule as expected:\n%s", out)
	}
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := c.ok("apply", "-f", path); !strings.Contains(r.stdout, "No changes") {
		t.Errorf("plan of the edited export without --prune:\n%s", r.stdout)
	}
	if r := c.ok("apply", "-f", path, "--prune", "rules"); !strings.Contains(r.stdout, "- rule shop-b/create-order") || !strings.Contains(r.stdout, "1 to delete") {
		t.Errorf("plan of the edited export:\n%s", r.stdout)
	}
}

func TestApplyBadFiles(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	dir := t.TempDir()
	for _, tc := range []struct{ name, yaml, contains string }{
		// Parse errors as store.ParseLimits words them (its tests hold every case), one
		// line (the configuration's errors joined with "; "), nothing written.
		{"unknown key", "rulez: []\n", `unknown field "rulez"`},
		{"two invalid rules", "rules:\n  - {tenant: a, route: '*', capacity: 0, refill_per_second: 1}\n  - {tenant: a, route: '*', capacity: 1, refill_per_second: 1}\n", "; "},
		{"hostile id", "regions: [\"a'; DROP TABLE region; --\"]\n", "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			checkError(t, c.run("apply", "-f", path, "--apply"), exitUsage, tc.contains, "")
		})
	}
	checkError(t, c.run("apply"), exitUsage, "--file (-f) is required", "")
	if n := sqlInt(t, url, `SELECT count(*) FROM audit_log WHERE actor = 'alice'`); n != 0 {
		t.Errorf("refused files wrote %d audit rows", n)
	}
}

// TestRulesSetPlansByDefault: rules set without --apply writes nothing; a wildcard tenant
// and an unknown route id get a WARNING; --apply writes.
func TestRulesSetPlansByDefault(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	gw := "../../deploy/regions/us-east/gateway.yaml"
	r := c.ok("rules", "set", "--tenant", "*", "--route", "*", "--capacity", "1", "--refill", "0.001")
	if !strings.Contains(r.stdout, "~ rule */*: capacity 20, refill 10/s -> capacity 1, refill 0.001/s") || !strings.Contains(r.stdout, "Nothing written") {
		t.Errorf("plan:\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr, "WARNING: rule */* is the default of EVERY tenant") {
		t.Errorf("no loud warning: %q", r.stderr)
	}
	if got := sqlInt(t, url, `SELECT capacity FROM rate_limit_rule WHERE tenant_id = '*' AND route_id = '*'`); got != 20 {
		t.Fatalf("a plan wrote: capacity %d", got)
	}
	r = c.ok("rules", "set", "--tenant", "shop-a", "--route", "serach", "--capacity", "5", "--refill", "1", "--gateway-config", gw)
	if !strings.Contains(r.stderr, `WARNING: rule shop-a/serach: no gateway config given defines route "serach"`) {
		t.Errorf("no warning for a misspelt route: %q", r.stderr)
	}
	r = c.ok("rules", "set", "--tenant", "shop-a", "--route", "search", "--capacity", "5", "--refill", "1", "--gateway-config", gw)
	if strings.Contains(r.stderr, "WARNING") {
		t.Errorf("warning for a known route: %q", r.stderr)
	}
	c.ok("rules", "set", "--tenant", "shop-a", "--route", "search", "--capacity", "5", "--refill", "1", "--apply")
	if got := sqlInt(t, url, `SELECT count(*) FROM rate_limit_rule WHERE tenant_id = 'shop-a'`); got != 1 {
		t.Errorf("--apply wrote %d rules, want 1", got)
	}
	checkError(t, c.run("rules", "set", "--tenant", "a", "--route", "b", "--capacity", "1", "--refill", "1", "--gateway-config", "no/such.yaml"), exitUsage, "--gateway-config no/such.yaml", "")
}

func TestKeysImport(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	const sum = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" // sha256("hello")
	c.ok("keys", "import", "--sha256", sum, "--tenant", "shop-a", "--label", "vault")
	if got := sqlInt(t, url, `SELECT count(*) FROM api_key WHERE key_hash = sha256('hello') AND tenant_id = 'shop-a'`); got != 1 {
		t.Errorf("imported key not stored by its hash")
	}
	checkError(t, c.run("keys", "import", "--sha256", sum, "--tenant", "shop-a"), exitFailure, "stored already", "")
	checkError(t, c.run("keys", "import", "--sha256", "xyz", "--tenant", "shop-a"), exitUsage, "want 64 hex digits", "")
}

func TestActor(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.env[envActor] = "deploy-bot"
	c.ok("regions", "add", "r1")
	c.ok("regions", "add", "r2", "--actor", "bob")
	if got := sqlInt(t, url, `SELECT count(*) FROM audit_log WHERE actor = 'deploy-bot'`); got != 1 {
		t.Errorf("%s: %d rows by deploy-bot, want 1", envActor, got)
	}
	if got := sqlInt(t, url, `SELECT count(*) FROM audit_log WHERE actor = 'bob'`); got != 1 {
		t.Errorf("--actor: %d rows by bob, want 1", got)
	}
	checkError(t, c.run("regions", "add", "r3", "--actor", "a\u202eb"), exitUsage, "control or formatting character", "")
	checkError(t, c.run("regions", "add", "r3", "--actor", " "), exitUsage, "must not be blank", "")
}

// TestComposeLimitsFile: the limits compose.yaml's setup service seeds apply cleanly to a
// new database; seeding again changes nothing, and never undoes what ratectl did since: a
// region, another tenant's rule and a changed shop-a rule stay, a deleted one comes back.
func TestComposeLimitsFile(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	const file = "../../deploy/compose/limits.yaml"
	plan := []string{"apply", "-f", file, "--only-missing", "--gateway-config", "../../deploy/compose/gateway-us-east.yaml"}
	seed := append(slices.Clone(plan), "--apply", "--actor", "compose", "--reason", "compose setup")
	r := c.ok(seed...)
	for _, want := range []string{"+ region us-east", "+ region eu-west", "+ rule shop-a/*", "+ rule shop-a/search"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("first seed: no %q in\n%s", want, r.stdout)
		}
	}
	if r := c.ok(seed...); !strings.Contains(r.stdout, "No changes") {
		t.Errorf("second seed:\n%s", r.stdout)
	}
	c.ok("regions", "add", "ap-south")
	c.ok("rules", "set", "--tenant", "shop-b", "--route", "*", "--capacity", "7", "--refill", "1", "--apply")
	c.ok("rules", "set", "--tenant", "shop-a", "--route", "search", "--capacity", "9", "--apply")
	c.ok("rules", "delete", "--tenant", "shop-a", "--route", "*", "--apply")
	before := sqlInt(t, url, `SELECT count(*) FROM audit_log`)
	if r := c.ok(plan...); !strings.Contains(r.stdout, "+ rule shop-a/*") || strings.Count("\n"+r.stdout, "\n+ ") != 1 {
		t.Errorf("the plan of a seed after ratectl's changes, want only the deleted rule back:\n%s", r.stdout)
	}
	if got := sqlInt(t, url, `SELECT count(*) FROM audit_log`); got != before {
		t.Errorf("a plan wrote %d audit rows", got-before)
	}
	c.ok(seed...)
	for q, want := range map[string]int{
		`SELECT count(*) FROM region WHERE name = 'ap-south'`:                                     1,
		`SELECT count(*) FROM rate_limit_rule WHERE tenant_id = 'shop-b'`:                         1,
		`SELECT capacity FROM rate_limit_rule WHERE tenant_id = 'shop-a' AND route_id = 'search'`: 9,
		`SELECT capacity FROM rate_limit_rule WHERE tenant_id = 'shop-a' AND route_id = '*'`:      100,
		// Two regions and two rules first, nothing second, the deleted rule third.
		`SELECT count(*) FROM audit_log WHERE actor = 'compose' AND reason = 'compose setup'`: 5,
	} {
		if got := sqlInt(t, url, q); got != want {
			t.Errorf("%s = %d, want %d", q, got, want)
		}
	}
	checkError(t, c.run("apply", "-f", "testdata/apply/limits.yaml", "--only-missing"), exitUsage, "--only-missing adds regions and rules only", "")
}

// TestDiffExitCode: diff --exit-code exits 0 when the database matches, 2 when the plan
// has changes (the plan on stdout, nothing on stderr but warnings) and 1 on any error;
// its JSON plan holds old and new values as numbers, not prose.
func TestDiffExitCode(t *testing.T) {
	t.Parallel()
	c, _ := newDB(t)
	const file = "testdata/apply/limits.yaml"
	r := c.run("diff", "-f", file, "--exit-code")
	if r.code != exitChanges || !strings.Contains(r.stdout, "Plan: 6 to add, 1 to change") || strings.Contains(r.stderr, "ratectl: changes") {
		t.Errorf("diff --exit-code with changes: exit %d, stdout %q, stderr %q; want exit 2 and the plan", r.code, r.stdout, r.stderr)
	}
	if r := c.ok("diff", "-f", file); r.code != 0 {
		t.Errorf("diff without --exit-code: exit %d, want 0", r.code)
	}
	r = c.run("diff", "-f", file, "--exit-code", "-o", "json")
	if r.code != exitChanges {
		t.Fatalf("diff --exit-code -o json: exit %d, want 2: %s", r.code, r.stderr)
	}
	var plan struct {
		Changes []struct {
			Action, Object, ID string
			Old, New           map[string]any
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &plan); err != nil {
		t.Fatalf("diff -o json: %v\n%s", err, r.stdout)
	}
	found := 0
	for _, ch := range plan.Changes {
		switch ch.Object + " " + ch.ID {
		case "rule */*":
			found++
			if ch.Old["capacity"] != 20.0 || ch.Old["refill_per_second"] != 10.0 || ch.New["capacity"] != 50.0 || ch.New["shards"] != 1.0 {
				t.Errorf("rule */*: old %v, new %v; want capacity 20 -> 50 as numbers", ch.Old, ch.New)
			}
		case "override shop-a":
			found++
			shares, _ := ch.New["shares"].(map[string]any)
			if ch.Old != nil || shares["us-east"] != 0.75 || ch.New["expires_at"] != "2030-01-02T03:04:05Z" {
				t.Errorf("override shop-a: old %v, new %v", ch.Old, ch.New)
			}
		case "key sha256:2cf24dba5fb0":
			found++
			if ch.New["tenant"] != "shop-a" || ch.New["label"] != "ci" {
				t.Errorf("key: new %v", ch.New)
			}
		}
	}
	if found != 3 {
		t.Errorf("found %d of the rule, override and key changes in %s", found, r.stdout)
	}

	c.ok("apply", "-f", file, "--apply")
	if r := c.run("diff", "-f", file, "--exit-code"); r.code != 0 || !strings.Contains(r.stdout, "No changes") {
		t.Errorf("diff --exit-code with no change: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// Every error exits 1, whatever its usual code (2 usage, 3 unreachable).
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("rulez: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"bad file":     {"diff", "-f", bad, "--exit-code"},
		"no file":      {"diff", "--exit-code"},
		"unknown flag": {"diff", "--exit-code", "--frob", "-f", file},
		"unreachable":  {"diff", "-f", file, "--exit-code", "--database-url", "postgres://x@127.0.0.1:1/db", "--timeout", "2s"},
	} {
		if r := c.run(args...); r.code != exitFailure || !strings.HasPrefix(r.stderr, "ratectl: ") {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 and the error", name, r.code, r.stderr)
		}
	}
	if r := c.run("diff", "--frob"); r.code != exitUsage {
		t.Errorf("diff --frob without --exit-code: exit %d, want 2", r.code)
	}
}

// TestExpiredOverrides: an override past its expiry is over for ratectl too: export does
// not write it, diff does not plan its deletion, it does not block regions remove; and
// a file with a past expires_at is refused, naming the override.
func TestExpiredOverrides(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	const file = "testdata/apply/limits.yaml"
	c.ok("apply", "-f", file, "--apply")
	if _, err := pgxExec(url, `UPDATE region_share SET expires_at = now() - interval '1 minute' WHERE scope = 'shop-a' AND source = 'override'`); err != nil {
		t.Fatal(err)
	}
	out := c.ok("export").stdout
	if !strings.Contains(out, "overrides: []") {
		t.Errorf("export writes the expired override:\n%s", out)
	}
	path := filepath.Join(t.TempDir(), "exported.yaml")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := c.run("diff", "-f", path, "--exit-code"); r.code != 0 {
		t.Errorf("diff of the export: exit %d, plans\n%s", r.code, r.stdout)
	}
	c.ok("regions", "add", "ap-south")
	if r := c.run("regions", "remove", "eu-west"); r.code != 0 {
		t.Errorf("regions remove eu-west, named by an expired override only: exit %d: %s", r.code, r.stderr)
	}
	past := filepath.Join(t.TempDir(), "past.yaml")
	if err := os.WriteFile(past, []byte("overrides:\n  - {scope: shop-b, shares: {us-east: 1, ap-south: 0}, reason: x, expires_at: \"2020-01-01T00:00:00Z\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	checkError(t, c.run("apply", "-f", past, "--apply"), exitUsage, "override shop-b: expires_at 2020-01-01T00:00:00Z is in the past", "")
}

// TestDurationsTakeDays: every duration flag reads days as --since does (--ttl 1d failed).
func TestDurationsTakeDays(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("regions", "add", "us-east")
	c.ok("shares", "set", "us-east=1", "--reason", "test", "--ttl", "1d", "--apply", "--timeout", "1d")
	if got := sqlInt(t, url, `SELECT count(*) FROM region_share WHERE source = 'override'
		AND expires_at BETWEEN now() + interval '23 hours' AND now() + interval '25 hours'`); got != 1 {
		t.Errorf("--ttl 1d: %d override rows expiring in a day, want 1", got)
	}
	for _, args := range [][]string{
		{"status", "--window", "soon"},
		{"status", "--window", "1x"},
		{"version", "--timeout", "soon"},
	} {
		checkError(t, c.run(args...), exitUsage, "want a duration like 7d, 2w, 36h or 90m", "")
	}
}

// TestApplyPinnedPlan: apply --plan writes the plan saved by diff -o json only while it is
// still the plan: a rule changed meanwhile, or an edited file, is refused with nothing
// written; a fresh plan is written.
func TestApplyPinnedPlan(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	const file = "testdata/apply/limits.yaml"
	dir := t.TempDir()
	save := func(name string) string {
		t.Helper()
		r := c.run("diff", "-f", file, "-o", "json")
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(r.stdout), 0o644); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.stdout, `"state": "sha256:`) {
			t.Fatalf("diff -o json has no state:\n%s", r.stdout)
		}
		return path
	}
	stale := save("stale.json")
	c.ok("rules", "set", "--tenant", "shop-b", "--route", "*", "--capacity", "3", "--refill", "1", "--apply") // after the review
	// The same changes (the file does not prune), but the rules changed since the review.
	checkError(t, c.run("apply", "-f", file, "--plan", stale, "--apply"), exitFailure, "the database changed since the plan was made", "")
	if n := sqlInt(t, url, `SELECT count(*) FROM region`); n != 0 {
		t.Fatalf("a refused pinned apply wrote %d regions", n)
	}
	// With --prune rules the plan deletes shop-b/*; changed since, it is no longer the plan.
	pruned := filepath.Join(dir, "pruned.json")
	if err := os.WriteFile(pruned, []byte(c.ok("diff", "-f", file, "--prune", "rules", "-o", "json").stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	c.ok("rules", "set", "--tenant", "shop-b", "--route", "*", "--capacity", "4", "--apply")
	checkError(t, c.run("apply", "-f", file, "--prune", "rules", "--plan", pruned, "--apply"), exitFailure, "is not the plan of", "")
	fresh := save("fresh.json")
	checkError(t, c.run("apply", "-f", "../../deploy/compose/limits.yaml", "--plan", fresh), exitFailure, "is not the plan of", "")
	checkError(t, c.run("apply", "-f", file, "--plan", file), exitUsage, "not a plan printed by ratectl diff -o json", "")
	r := c.ok("apply", "-f", file, "--plan", fresh, "--apply")
	if !strings.Contains(r.stdout, "Applied 7 change(s)") {
		t.Errorf("pinned apply of a fresh plan:\n%s", r.stdout)
	}
}

// TestApplyPrune: a section deletes nothing unless --prune names it: a key created and a
// rule set after the file was written survive a plain apply; --prune keys revokes the
// key; an empty section, an absent one or an unknown kind are refused.
func TestApplyPrune(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	const file = "testdata/apply/limits.yaml"
	c.ok("apply", "-f", file, "--apply")
	c.ok("keys", "create", "--tenant", "shop-b")
	c.ok("rules", "set", "--tenant", "shop-b", "--route", "*", "--capacity", "3", "--refill", "1", "--apply")
	if r := c.run("diff", "-f", file, "--exit-code"); r.code == exitChanges && strings.Contains(r.stdout, "- ") {
		t.Errorf("diff without --prune plans deletions:\n%s", r.stdout)
	}
	c.ok("apply", "-f", file, "--apply")
	if n := sqlInt(t, url, `SELECT count(*) FROM api_key WHERE tenant_id = 'shop-b' AND revoked_at IS NULL`); n != 1 {
		t.Errorf("a plain apply revoked the key created since: %d valid keys of shop-b", n)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM rate_limit_rule WHERE tenant_id = 'shop-b'`); n != 1 {
		t.Errorf("a plain apply deleted the rule set since")
	}
	r := c.ok("diff", "-f", file, "--prune", "keys,rules")
	for _, want := range []string{"- rule shop-b/*", "- key sha256:", "2 to delete"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("diff --prune keys,rules: no %q in\n%s", want, r.stdout)
		}
	}
	c.ok("apply", "-f", file, "--prune", "keys", "--apply")
	if n := sqlInt(t, url, `SELECT count(*) FROM api_key WHERE tenant_id = 'shop-b' AND revoked_at IS NULL`); n != 0 {
		t.Errorf("--prune keys left %d keys of shop-b valid", n)
	}
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, []byte("keys: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	checkError(t, c.run("apply", "-f", empty, "--prune", "keys", "--apply"), exitUsage, "the keys section is empty, and an empty section never deletes everything", "")
	checkError(t, c.run("apply", "-f", empty, "--prune", "all"), exitUsage, "the keys section of", "")
	checkError(t, c.run("apply", "-f", empty, "--prune", "rules"), exitUsage, "there is no rules section to prune by", "")
	checkError(t, c.run("diff", "-f", file, "--prune", "tenants"), exitUsage, `--prune "tenants": want regions, rules, overrides, keys, plans, tenant_plans or all`, "")
	if n := sqlInt(t, url, `SELECT count(*) FROM api_key WHERE revoked_at IS NULL`); n != 1 {
		t.Errorf("%d valid keys after the refusals, want the file's one", n)
	}
}
