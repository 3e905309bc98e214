package store

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions"
)

func TestReportAndLoadUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	dec := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Unix()
	nov := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Unix()
	month := func(tenant string, start int64) regions.QuotaKey {
		return regions.QuotaKey{Tenant: tenant, Route: "r", Band: "month", Start: start}
	}
	rep := func(k regions.QuotaKey, used int64) regions.QuotaReport {
		return regions.QuotaReport{QuotaKey: k, Used: used}
	}
	// Two gateways of us-east report the same counter, out of order; a key twice in
	// one batch counts its larger value.
	for _, b := range []struct {
		region string
		rows   []regions.QuotaReport
	}{
		{"us-east", []regions.QuotaReport{rep(month("a", dec), 70), rep(month("a", nov), 900)}},
		{"us-east", []regions.QuotaReport{rep(month("a", dec), 50)}}, // a stale report: no lower
		{"eu-west", []regions.QuotaReport{rep(month("a", dec), 20), rep(month("b", dec), 5), rep(month("b", dec), 8)}},
		{"us-east", nil},
	} {
		if err := s.ReportUsage(ctx, b.region, b.rows); err != nil {
			t.Fatalf("report %s %v: %v", b.region, b.rows, err)
		}
	}
	if err := s.ReportUsage(ctx, "us-east", []regions.QuotaReport{rep(month("a", dec), 70)}); err != nil {
		t.Fatal(err) // the same report again
	}
	got, err := s.LoadUsage(ctx, "us-east", time.Unix(dec, 0))
	if err != nil {
		t.Fatal(err)
	}
	want := map[regions.QuotaKey]regions.QuotaUsage{
		month("a", dec): {Mine: 70, Total: 90},
		month("b", dec): {Mine: 0, Total: 8},
	}
	if !maps.Equal(got, want) {
		t.Fatalf("us-east's usage since December: %v, want %v", got, want)
	}
	if got, err := s.LoadUsage(ctx, "eu-west", time.Unix(nov, 0)); err != nil || len(got) != 3 ||
		got[month("a", nov)] != (regions.QuotaUsage{Mine: 0, Total: 900}) || got[month("b", dec)] != (regions.QuotaUsage{Mine: 8, Total: 8}) {
		t.Fatalf("eu-west's usage since November: %v, %v", got, err)
	}

	n, err := s.PruneUsage(ctx, time.Unix(dec, 0))
	if err != nil || n != 1 {
		t.Fatalf("prune before December: %d rows, %v; want November's 1", n, err)
	}
	if got, err := s.LoadUsage(ctx, "us-east", time.Unix(0, 0)); err != nil || len(got) != 2 {
		t.Fatalf("usage after pruning: %v, %v; want December's 2 periods", got, err)
	}
}

func TestReportUsageRefusesBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	good := regions.QuotaReport{QuotaKey: regions.QuotaKey{Tenant: "a", Route: "r", Band: "month", Start: 1795996800}, Used: 1}
	for _, tc := range []struct {
		region string
		row    func(r *regions.QuotaReport)
		want   string
	}{
		{"us east", func(*regions.QuotaReport) {}, "region id"},
		{"us-east", func(r *regions.QuotaReport) { r.Tenant = "*" }, "tenant id"},
		{"us-east", func(r *regions.QuotaReport) { r.Route = "" }, "route id"},
		{"us-east", func(r *regions.QuotaReport) { r.Band = "a#b" }, "band id"},
		{"us-east", func(r *regions.QuotaReport) { r.Used = -1 }, "negative"},
		{"us-east", func(r *regions.QuotaReport) { r.Start = 1 << 62 }, "period start"},
	} {
		r := good
		tc.row(&r)
		err := s.ReportUsage(ctx, tc.region, []regions.QuotaReport{good, r})
		if !errors.Is(err, regions.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("report %+v in %q: %v, want ErrInvalid naming %q", r, tc.region, err, tc.want)
		}
	}
	if n := count(t, s, `SELECT count(*) FROM quota_usage`); n != 0 {
		t.Fatalf("%d rows written by refused reports, want none", n)
	}
	if _, err := s.LoadUsage(ctx, "", time.Time{}); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("load usage of region \"\": %v, want ErrInvalid", err)
	}
}

// TestQuotaBandsStored: a rule's and a plan rule's quota bands (period, zone) are written
// and read back as they were, by SetRule, SetPlanRule, Rules, Plans and the snapshot,
// beside a token-bucket band; a quota band is never marked, however it grows.
func TestQuotaBandsStored(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "test", "quota bands")
	month := regions.Band{Name: "month", Capacity: 1_000_000, Period: regions.PeriodMonth}
	day := regions.Band{Name: "day", Capacity: 5000, Period: regions.PeriodDay, Zone: "Europe/Berlin"}
	r := regions.Rule{Tenant: "a", Route: "r", Capacity: 200, RefillPerSecond: 100, Shards: 1, Bands: []regions.Band{hourBand, month, day}}
	if err := s.SetRule(ctx, r); err != nil {
		t.Fatal(err)
	}
	pr := planRule("pro", "*", 200, 100)
	pr.Bands = []regions.Band{day, month}
	if err := s.SetPlanRule(ctx, pr); err != nil {
		t.Fatal(err)
	}
	rules, err := s.Rules(ctx, "a", "r")
	if err != nil || len(rules) != 1 || !reflect.DeepEqual(rules[0].Bands, r.Bands) {
		t.Fatalf("rules: %+v, %v; want a/r with %+v", rules, err, r.Bands)
	}
	plans, err := s.Plans(ctx, "pro")
	if err != nil || len(plans) != 1 || !reflect.DeepEqual(plans[0].Rules[0].Bands, pr.Bands) {
		t.Fatalf("plans: %+v, %v; want pro/* with %+v", plans, err, pr.Bands)
	}
	snap, err := s.LoadSnapshot(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Rule("a", "r"); !reflect.DeepEqual(got.Bands, r.Bands) {
		t.Errorf("snapshot rule a/r bands %+v, want %+v", got.Bands, r.Bands)
	}
	if len(snap.Skipped()) != 0 {
		t.Errorf("snapshot skipped %+v", snap.Skipped())
	}
	exec(t, s, `DELETE FROM limit_raise`)
	month.Capacity, day.Capacity = 10_000_000, 50_000
	r.Bands = []regions.Band{hourBand, month, day}
	if err := s.SetRule(ctx, r); err != nil {
		t.Fatal(err)
	}
	pr.Bands = []regions.Band{day, month}
	if err := s.SetPlanRule(ctx, pr); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s, `SELECT count(*) FROM limit_raise`); n != 0 {
		t.Errorf("%d raise markers after quotas grew tenfold, want none", n)
	}
}

// TestUsageAsComponentRoles: the gateway's role reports and loads usage, the
// rebalancer's prunes it (migrations/00013's grants), and the operator's reads it only.
func TestUsageAsComponentRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, url := newStore(t)
	open := func(group, suffix string) *Store {
		t.Helper()
		s, err := Open(ctx, testenv.LoginRole(t, url, group, suffix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	gw, rb, op := open(migrations.RoleGateway, "gw"), open(migrations.RoleRebalancer, "rb"), open(migrations.RoleOperator, "op")
	k := regions.QuotaKey{Tenant: "a", Route: "r", Band: "month", Start: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Unix()}
	for range 2 { // the second an update
		if err := gw.ReportUsage(ctx, "us-east", []regions.QuotaReport{{QuotaKey: k, Used: 3}}); err != nil {
			t.Fatalf("report as the gateway: %v", err)
		}
	}
	if got, err := gw.LoadUsage(ctx, "us-east", time.Unix(k.Start, 0)); err != nil || got[k] != (regions.QuotaUsage{Mine: 3, Total: 3}) {
		t.Fatalf("load as the gateway: %v, %v", got, err)
	}
	if _, err := op.LoadUsage(ctx, "us-east", time.Time{}); err != nil {
		t.Fatalf("load as the operator: %v", err)
	}
	if _, err := op.PruneUsage(ctx, time.Now()); err == nil {
		t.Fatal("the operator pruned usage")
	}
	if _, err := gw.PruneUsage(ctx, time.Now()); err == nil {
		t.Fatal("the gateway pruned usage")
	}
	if n, err := rb.PruneUsage(ctx, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)); err != nil || n != 1 {
		t.Fatalf("prune as the rebalancer: %d, %v", n, err)
	}
}
