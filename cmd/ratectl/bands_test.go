package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// TestApplyBandsPlan (#24): the plan (pro: 100/s burst 200, 10,000 per hour,
// 1,000,000 per 30 days) applies from a limits file with a tenant assigned; diff then
// finds nothing to change; plans get and export show the bands.
func TestApplyBandsPlan(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	const file = "testdata/apply/bands.yaml"
	r := c.ok("diff", "-f", file)
	if !strings.Contains(r.stdout, "+ plan_rule pro/*: capacity 200, refill 100/s, bands hour=10000/1h,day=1000000/30d") {
		t.Errorf("diff of the bands plan:\n%s", r.stdout)
	}
	c.ok("apply", "-f", file, "--apply")
	if r := c.run("diff", "-f", file, "--exit-code"); r.code != 0 || !strings.Contains(r.stdout, "No changes") {
		t.Errorf("diff --exit-code after apply: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM plan_rule WHERE jsonb_array_length(bands) = 2`); n != 1 {
		t.Errorf("%d plan rules with 2 bands, want 1", n)
	}
	goldenBoth(t, c, "plans_get_bands", "plans", "get", "pro")
	r = c.ok("export")
	for _, want := range []string{"name: hour", "capacity: 10000", "per: 1h", "name: day", "per: 30d"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("export does not hold %q:\n%s", want, r.stdout)
		}
	}
}

// TestRulesSetBands (#24): rules set --band adds, changes (in place) and with NAME=
// removes a band; --no-bands clears them; list shows a BANDS column only when a rule
// has bands; bad bands are refused with a usage error and nothing is written.
func TestRulesSetBands(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	set := func(args ...string) result {
		t.Helper()
		return c.ok(append([]string{"rules", "set", "--tenant", "acme", "--route", "search", "--apply"}, args...)...)
	}
	bands := func() string {
		t.Helper()
		var s string
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, `SELECT bands::text FROM rate_limit_rule WHERE tenant_id = 'acme' AND route_id = 'search'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Dry run: the change, nothing written.
	r := c.ok("rules", "set", "--tenant", "acme", "--route", "search", "--capacity", "200", "--refill", "100", "--band", "hour=10000/1h")
	if !strings.Contains(r.stdout, "+ rule acme/search: capacity 200, refill 100/s, bands hour=10000/1h") {
		t.Errorf("rules set --band dry run:\n%s", r.stdout)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM rate_limit_rule WHERE tenant_id = 'acme'`); n != 0 {
		t.Fatalf("a dry run wrote %d rules", n)
	}
	set("--capacity", "200", "--refill", "100", "--band", "hour=10000/1h", "--band", "day=1000000/30d")
	set("--band", "hour=20000/1h", "--band", "minute=500@10")
	if got := bands(); got != `[{"name": "hour", "capacity": 20000, "refill_per_second": 5.555555555555555}, {"name": "day", "capacity": 1000000, "refill_per_second": 0.38580246913580246}, {"name": "minute", "capacity": 500, "refill_per_second": 10}]` {
		t.Errorf("bands after changing hour and adding minute: %s", got)
	}
	set("--capacity", "300") // flags not given keep the bands
	set("--band", "minute=")
	r = c.ok("rules", "list", "--tenant", "acme")
	if !strings.Contains(r.stdout, "BANDS") || !strings.Contains(r.stdout, "hour=20000/1h,day=1000000/30d") {
		t.Errorf("rules list with bands:\n%s", r.stdout)
	}
	r = c.ok("rules", "list", "--tenant", "acme", "-o", "json")
	var got []ruleJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 || got[0].Capacity != 300 ||
		len(got[0].Bands) != 2 || got[0].Bands[0] != (regions.Band{Name: "hour", Capacity: 20000, RefillPerSecond: 20000.0 / 3600}) {
		t.Errorf("rules list -o json: %+v, %v\n%s", got, err, r.stdout)
	}
	if !strings.Contains(r.stdout, `"bands": [`) {
		t.Errorf("rules list -o json has no bands array:\n%s", r.stdout)
	}
	r = c.ok("rules", "list", "--tenant", "*")
	if strings.Contains(r.stdout, "BANDS") {
		t.Errorf("rules list of rules without bands shows a BANDS column:\n%s", r.stdout)
	}

	before := bands()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--band", "hour"}, `--band "hour": invalid band "hour": want NAME=CAPACITY/PER`},
		{[]string{"--band", "hour=10/soon"}, `period "soon": want hour, day, week or month`},
		{[]string{"--band", "hour=ten/1h"}, `capacity "ten"`},
		{[]string{"--band", "hour=10/1h", "--band", "hour=20/1h"}, "band hour is given twice"},
		{[]string{"--band", "rate=10/1h"}, `band "rate" is the name of the rule's own capacity and refill`},
		{[]string{"--band", "RATE=10/1h"}, `band "RATE" is the name of the rule's own capacity and refill`},
		{[]string{"--band", "a b=10/1h"}, `invalid band id "a b"`},
		{[]string{"--band", "week=0/1w"}, "band week: capacity 0 must be between 1"},
		{[]string{"--band", "fast=10@0"}, "band fast: refill_per_second 0 must be > 0"},
		{[]string{"--band", "nope="}, "the rule has no band nope to remove"},
		{[]string{"--shards", "2"}, "a rule with bands cannot be sharded"},
	} {
		args := append([]string{"rules", "set", "--tenant", "acme", "--route", "search", "--apply"}, tc.args...)
		checkError(t, c.run(args...), exitUsage, tc.want, "")
	}
	if got := bands(); got != before {
		t.Errorf("a refused rules set changed the bands: %s, was %s", got, before)
	}
	checkError(t, c.run("plans", "set", "pro", "--route", "*", "--capacity", "10", "--refill", "1", "--shards", "4", "--band", "h=1/1h", "--apply"),
		exitUsage, "rule of plan pro/*: a rule with bands cannot be sharded", "")
	if n := sqlInt(t, url, `SELECT count(*) FROM plan`); n != 0 {
		t.Errorf("a refused plans set wrote %d plans", n)
	}

	// The audit names the bands of a rule that has them, and only then.
	r = c.ok("audit")
	if !strings.Contains(r.stdout, "capacity 200, refill 100/s, bands hour=20000/1h,day=1000000/30d,minute=500/50s -> capacity 300, refill 100/s, bands hour=20000/1h,day=1000000/30d,minute=500/50s") {
		t.Errorf("audit of band changes:\n%s", r.stdout)
	}
	c.ok("rules", "set", "--tenant", "plain", "--route", "x", "--capacity", "3", "--refill", "1", "--apply")
	r = c.ok("audit", "-o", "json")
	if strings.Count(r.stdout, `"bands": []`) != 0 || !strings.Contains(r.stdout, `"bands": [`) {
		t.Errorf("audit -o json: a rule without bands must show none, one with bands its array:\n%s", r.stdout)
	}
	set("--no-bands")
	if got := bands(); got != "[]" {
		t.Errorf("bands after --no-bands: %s", got)
	}
	r = c.ok("rules", "list", "--tenant", "acme")
	if strings.Contains(r.stdout, "BANDS") {
		t.Errorf("rules list after --no-bands:\n%s", r.stdout)
	}

	// plans set: the same flags.
	c.ok("plans", "set", "pro", "--route", "*", "--capacity", "200", "--refill", "100", "--band", "hour=10000/1h", "--apply")
	c.ok("plans", "set", "pro", "--route", "*", "--band", "day=1000000/30d", "--apply")
	r = c.ok("plans", "get", "pro")
	if !strings.Contains(r.stdout, "BANDS") || !strings.Contains(r.stdout, "hour=10000/1h,day=1000000/30d") {
		t.Errorf("plans get pro:\n%s", r.stdout)
	}
	c.ok("plans", "set", "pro", "--route", "*", "--no-bands", "--apply")
	if r := c.ok("plans", "get", "pro"); strings.Contains(r.stdout, "BANDS") {
		t.Errorf("plans get pro after --no-bands:\n%s", r.stdout)
	}
}
