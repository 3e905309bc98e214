package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestApplyQuotaBands: a limits file with calendar quota bands applies; diff then finds
// nothing to change; plans get and export show the quotas, and the export applied is no
// change either.
func TestApplyQuotaBands(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	const file = "testdata/apply/quotas.yaml"
	r := c.ok("diff", "-f", file)
	if !strings.Contains(r.stdout, "+ plan_rule pro/*: capacity 200, refill 100/s, bands hour=10000/1h,month=1000000/month,day=50000/day@Europe/Berlin") {
		t.Errorf("diff of the quotas plan:\n%s", r.stdout)
	}
	c.ok("apply", "-f", file, "--apply")
	if r := c.run("diff", "-f", file, "--exit-code"); r.code != 0 || !strings.Contains(r.stdout, "No changes") {
		t.Errorf("diff --exit-code after apply: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM plan_rule WHERE jsonb_path_exists(bands, '$[*] ? (@.period == "month")')`); n != 1 {
		t.Errorf("%d plan rules with a monthly quota, want 1", n)
	}
	r = c.ok("plans", "get", "pro")
	if !strings.Contains(r.stdout, "BANDS") || !strings.Contains(r.stdout, "hour=10000/1h,month=1000000/month,day=50000/day@Europe/Berlin") {
		t.Errorf("plans get pro:\n%s", r.stdout)
	}
	exp := c.ok("export")
	for _, want := range []string{"period: month", "period: day", "zone: Europe/Berlin", "per: 1h"} {
		if !strings.Contains(exp.stdout, want) {
			t.Errorf("export does not hold %q:\n%s", want, exp.stdout)
		}
	}
	exported := t.TempDir() + "/export.yaml"
	if err := os.WriteFile(exported, []byte(exp.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := c.run("diff", "-f", exported, "--exit-code"); r.code != 0 || !strings.Contains(r.stdout, "No changes") {
		t.Errorf("diff of the export: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestRulesSetQuotaBands: rules set and plans set --band take a calendar quota
// (NAME=AMOUNT/PERIOD[@ZONE]) beside token buckets; list and get show it as written; a
// bad period or zone is a usage error naming it, and writes nothing.
func TestRulesSetQuotaBands(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("rules", "set", "--tenant", "acme", "--route", "search", "--capacity", "200", "--refill", "100",
		"--band", "hour=10000/1h", "--band", "month=1000000/month", "--band", "day=5000/day@Europe/Berlin", "--apply")
	r := c.ok("rules", "list", "--tenant", "acme")
	if !strings.Contains(r.stdout, "hour=10000/1h,month=1000000/month,day=5000/day@Europe/Berlin") {
		t.Errorf("rules list with quotas:\n%s", r.stdout)
	}
	r = c.ok("rules", "list", "--tenant", "acme", "-o", "json")
	var got []ruleJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 || len(got[0].Bands) != 3 ||
		got[0].Bands[2] != (regions.Band{Name: "day", Capacity: 5000, Period: regions.PeriodDay, Zone: "Europe/Berlin"}) {
		t.Errorf("rules list -o json: %+v, %v\n%s", got, err, r.stdout)
	}
	// A quota changed in place, then turned into a token bucket of the same name.
	c.ok("rules", "set", "--tenant", "acme", "--route", "search", "--band", "month=2000000/month", "--apply")
	c.ok("rules", "set", "--tenant", "acme", "--route", "search", "--band", "day=5000/1d", "--apply")
	if r := c.ok("rules", "list", "--tenant", "acme"); !strings.Contains(r.stdout, "hour=10000/1h,month=2000000/month,day=5000/1d") {
		t.Errorf("rules list after the edits:\n%s", r.stdout)
	}
	before := sqlInt(t, url, `SELECT count(*) FROM audit_log`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--band", "q=10/fortnight"}, `period "fortnight": want hour, day, week or month for a calendar quota (a duration like 1h or 30d makes a token bucket)`},
		{[]string{"--band", "q=10/day@Nowhere/Atlantis"}, `zone "Nowhere/Atlantis": want an IANA time zone`},
		{[]string{"--band", "q=10/day@"}, `zone after '@' is empty`},
		{[]string{"--band", "q=0/month"}, "band q: capacity 0 must be between 1"},
	} {
		args := append([]string{"rules", "set", "--tenant", "acme", "--route", "search", "--apply"}, tc.args...)
		checkError(t, c.run(args...), exitUsage, tc.want, "")
	}
	if n := sqlInt(t, url, `SELECT count(*) FROM audit_log`); n != before {
		t.Errorf("refused rules set wrote %d audit rows", n-before)
	}

	c.ok("plans", "set", "pro", "--route", "*", "--capacity", "200", "--refill", "100", "--band", "month=1000000/month@America/New_York", "--apply")
	if r := c.ok("plans", "get", "pro"); !strings.Contains(r.stdout, "BANDS") || !strings.Contains(r.stdout, "month=1000000/month@America/New_York") {
		t.Errorf("plans get pro:\n%s", r.stdout)
	}
}

// TestStatusTenantQuotas (#24): status --tenant with a database and no Prometheus shows the
// tenant's bands: plan pro's rate and hour buckets with their limits, its quotas for "*"
// (each route its own), and the route search, which used the monthly quota, with the
// fleet's usage of this period as reported (us-east 800, eu-west 434 of 1,000,000), what
// is left, when the period resets and each region's allowance (regions.Allowance at the
// equal split); -o json says the same.
func TestStatusTenantQuotas(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("regions", "add", "us-east")
	c.ok("regions", "add", "eu-west")
	c.ok("apply", "-f", "testdata/apply/quotas.yaml", "--apply")
	ctx := context.Background()
	st, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	month := regions.Band{Name: "month", Capacity: 1_000_000, Period: regions.PeriodMonth}
	start, end := month.Window(now)
	k := regions.QuotaKey{Tenant: "acme", Route: "search", Band: "month", Start: start.Unix()}
	for region, used := range map[string]int64{"us-east": 800, "eu-west": 434} {
		if err := st.ReportUsage(ctx, region, []regions.QuotaReport{{QuotaKey: k, Used: used}}); err != nil {
			t.Fatal(err)
		}
	}
	r := c.ok("status", "--tenant", "acme")
	rows := map[string]string{} // ROUTE BAND -> the row's other cells, single-spaced
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) > 2 && !strings.HasPrefix(line, "#") {
			rows[f[0]+" "+f[1]] = strings.Join(f[2:], " ")
		}
	}
	// Allowances at 0.5 each: 800 + 0.5 x 998,766 and 434 + 0.5 x 998,766.
	for key, want := range map[string]string{
		"search month": "quota month=1000000/month plan pro 1234 998766 " + end.UTC().Format(time.RFC3339) + " eu-west=434/499817 us-east=800/500183",
		"* month":      "quota month=1000000/month plan pro - - - each route its own (routes with usage: below)",
		"* rate":       "bucket 200@100/s plan pro - - - bucket inspect --region R",
		"search hour":  "bucket hour=10000/1h plan pro - - - bucket inspect --region R",
	} {
		if rows[key] != want {
			t.Errorf("status --tenant acme: %s is %q, want %q\n%s", key, rows[key], want, r.stdout)
		}
	}
	if !strings.HasPrefix(rows["search day"], "quota day=50000/day@Europe/Berlin plan pro 0 50000 ") {
		t.Errorf("status --tenant acme: search day is %q, want the Berlin day quota unused", rows["search day"])
	}
	var rep struct {
		Bands []bandStatus `json:"bands"`
	}
	if err := json.Unmarshal([]byte(c.ok("status", "--tenant", "acme", "-o", "json").stdout), &rep); err != nil {
		t.Fatal(err)
	}
	var q *bandStatus
	for i := range rep.Bands {
		if rep.Bands[i].Band == "month" {
			q = &rep.Bands[i]
		}
	}
	if q == nil || q.Used == nil || *q.Used != 1234 || *q.Left != 998766 || !q.PeriodEnd.Equal(end) || len(q.Regions) != 2 {
		t.Errorf("status -o json: month band %+v, want 1234 used, 998766 left, two regions", q)
	}
	checkError(t, c.run("status", "--tenant", "no/such"), exitUsage, "tenant", "")
}
