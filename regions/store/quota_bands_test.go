package store

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/regions"
)

var (
	monthQuota = regions.Band{Name: "month", Capacity: 1_000_000, Period: regions.PeriodMonth}
	dayQuota   = regions.Band{Name: "day", Capacity: 5000, Period: regions.PeriodDay, Zone: "Europe/Berlin"}
)

// TestParseQuotaBand: NAME=AMOUNT/PERIOD[@ZONE] is a calendar quota and FormatBand writes
// it back so; a duration after the '/' stays a token bucket; a period word that is none
// of hour, day, week, month is refused naming the valid words.
func TestParseQuotaBand(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]regions.Band{
		"month=1000000/month":        monthQuota,
		"day=5000/day@Europe/Berlin": dayQuota,
		"h=10/hour":                  {Name: "h", Capacity: 10, Period: regions.PeriodHour},
		"w=7/week@America/New_York":  {Name: "w", Capacity: 7, Period: regions.PeriodWeek, Zone: "America/New_York"},
		"w=7/week@UTC":               {Name: "w", Capacity: 7, Period: regions.PeriodWeek, Zone: "UTC"},
		"hour=10000/1h":              hourBand, // a duration: a token bucket
		"day=1000000/30d":            dayBand,
	} {
		got, err := ParseBand(in)
		if err != nil || got != want {
			t.Errorf("ParseBand(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if f := FormatBand(got); f != in {
			t.Errorf("FormatBand(%+v) = %q, want %q", got, f, in)
		}
		r := regions.Rule{Tenant: "a", Route: "r", Capacity: 1, RefillPerSecond: 1, Shards: 1, Bands: []regions.Band{got}}
		if err := r.Validate(); err != nil {
			t.Errorf("ParseBand(%q): %v", in, err)
		}
	}
	for in, want := range map[string]string{
		"q=10/fortnight":         `period "fortnight": want hour, day, week or month for a calendar quota (a duration like 1h or 30d makes a token bucket)`,
		"q=10/fortnight@UTC":     `period "fortnight": want hour, day, week or month`,
		"q=10/Month":             `period "Month"`,
		"q=10/1h@Europe/Berlin":  `period "1h"`,
		"q=10/day@":              `zone after '@' is empty`,
		"q=ten/month":            `amount "ten": want a whole number per month`,
		"q=1.5/day@Europe/Paris": `amount "1.5"`,
	} {
		if _, err := ParseBand(in); !contains(err, want) {
			t.Errorf("ParseBand(%q): %v, want %q", in, err, want)
		}
	}
	// The syntax is ParseBand's, the zone Validate's.
	b, err := ParseBand("q=10/day@Nowhere/Atlantis")
	if err != nil {
		t.Fatal(err)
	}
	r := regions.Rule{Tenant: "a", Route: "r", Capacity: 1, RefillPerSecond: 1, Shards: 1, Bands: []regions.Band{b}}
	if err := r.Validate(); !contains(err, `zone "Nowhere/Atlantis"`) {
		t.Errorf("a band of zone Nowhere/Atlantis: %v", err)
	}
}

// TestParseLimitsQuotaBands: a band entry with period (and zone) is a quota; per and
// refill_per_second are refused beside a period, a zone without one too.
func TestParseLimitsQuotaBands(t *testing.T) {
	t.Parallel()
	const head = "rules:\n  - tenant: '*'\n    route: '*'\n    capacity: 10\n    refill_per_second: 1\n"
	c, err := ParseLimits(context.Background(), []byte(head+`    bands:
      - {name: hour, capacity: 10000, per: 1h}
      - {name: month, capacity: 1000000, period: month}
plans:
  - name: pro
    rules:
      - route: '*'
        capacity: 200
        refill_per_second: 100
        bands:
          - {name: day, capacity: 5000, period: day, zone: Europe/Berlin}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := (*c.Rules)[0].Bands, []regions.Band{hourBand, monthQuota}; !reflect.DeepEqual(got, want) {
		t.Errorf("rule bands %+v, want %+v", got, want)
	}
	if got := (*c.Plans)[0].Rules[0].Bands; !reflect.DeepEqual(got, []regions.Band{dayQuota}) {
		t.Errorf("plan rule bands %+v, want %+v", got, dayQuota)
	}
	for _, tt := range []struct{ bands, want string }{
		{"      - {name: q, capacity: 1, period: month, per: 30d}\n", "a calendar quota (period month) is an amount per period: give no per or refill_per_second"},
		{"      - {name: q, capacity: 1, period: month, refill_per_second: 0}\n", "give no per or refill_per_second"},
		{"      - {name: q, capacity: 1, period: fortnight}\n", `period "fortnight": want hour, day, week or month`},
		{"      - {name: q, capacity: 1, per: 1h, zone: UTC}\n", `zone "UTC" is for a calendar quota: give a period`},
		{"      - {name: q, capacity: 1, period: day, zone: Nowhere/Atlantis}\n", `zone "Nowhere/Atlantis"`},
		{"      - {name: q, capacity: 0, period: day}\n", "capacity 0 must be between 1"},
		{"      - {name: q, capacity: 1, period: day, zone: 1}\n", "bands[0].zone: 1 is read by YAML as a number"},
		{"      - {name: q, capacity: 1}\n", "or period (hour, day, week, month) for a calendar quota"},
	} {
		_, err := ParseLimits(context.Background(), []byte(head+"    bands:\n"+tt.bands))
		if !contains(err, tt.want) {
			t.Errorf("bands\n%s: %v, want an error naming %q", tt.bands, err, tt.want)
		}
	}
}

// TestQuotaBandsApplyExport: a limits file with quota bands applies, exports with period
// and zone, and the export planned again is no change.
func TestQuotaBandsApplyExport(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	pro := planRule("pro", "*", 200, 100)
	pro.Bands = []regions.Band{hourBand, dayQuota}
	want := Config{
		Rules: ptr([]regions.Rule{
			{Tenant: "*", Route: "*", Capacity: 20, RefillPerSecond: 10},
			{Tenant: "a", Route: "r", Capacity: 5, RefillPerSecond: 1, Bands: []regions.Band{monthQuota, hourBand}},
		}),
		Plans:       ptr([]regions.Plan{{Name: "pro", Rules: []regions.Rule{pro}}}),
		TenantPlans: ptr([]regions.TenantPlan{{Tenant: "acme", Plan: "pro"}}),
	}
	if _, err := s.Apply(ctx, want, "alice", "quotas"); err != nil {
		t.Fatal(err)
	}
	exp, err := s.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := MarshalLimits(exp)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"period: month\n", "period: day\n", "zone: Europe/Berlin\n", "per: 1h\n"} {
		if !strings.Contains(string(b), w) {
			t.Errorf("export does not hold %q:\n%s", w, b)
		}
	}
	if strings.Contains(string(b), "refill_per_second: 0\n") {
		t.Errorf("export writes a quota's refill:\n%s", b)
	}
	back, err := ParseLimits(ctx, b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if changes, err := s.Plan(ctx, back); err != nil || len(changes) != 0 {
		t.Fatalf("the export planned again: %+v, %v; want no change\n%s", changes, err, b)
	}
	j, err := MarshalLimitsJSON(exp)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := ParseLimits(ctx, j); err != nil || !reflect.DeepEqual(back, exp) {
		t.Fatalf("JSON read back %+v, %v; want %+v:\n%s", back, err, exp, j)
	}
}
