package regions

import (
	"errors"
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		period     Period
		zone       string
		t          string
		start, end string
	}{
		{PeriodHour, "", "2026-12-01T22:59:59.999Z", "2026-12-01T22:00:00Z", "2026-12-01T23:00:00Z"},
		{PeriodHour, "Asia/Kolkata", "2026-12-01T22:10:00Z", "2026-12-01T21:30:00Z", "2026-12-01T22:30:00Z"},
		{PeriodDay, "", "2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"},
		{PeriodDay, "Europe/Berlin", "2026-12-01T23:30:00Z", "2026-12-01T23:00:00Z", "2026-12-02T23:00:00Z"},
		// 29 March 2026: Berlin moves to summer time, a day of 23 hours.
		{PeriodDay, "Europe/Berlin", "2026-03-29T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		// 1 December 2026 is a Tuesday: the ISO week started Monday 30 November.
		{PeriodWeek, "", "2026-12-01T10:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"},
		{PeriodWeek, "", "2026-12-06T23:59:59Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"},
		{PeriodMonth, "", "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{PeriodMonth, "", "2026-02-15T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"},
		{PeriodMonth, "America/New_York", "2026-12-01T03:00:00Z", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"},
	} {
		b := Band{Name: "q", Capacity: 10, Period: c.period, Zone: c.zone}
		start, end := b.Window(at(c.t))
		if !start.Equal(at(c.start)) || !end.Equal(at(c.end)) {
			t.Errorf("%s in %q at %s: window [%s, %s), want [%s, %s)", c.period, c.zone, c.t, start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), c.start, c.end)
		}
	}
}

func TestAllowance(t *testing.T) {
	for _, c := range []struct {
		budget      int64
		share       float64
		mine, total int64
		want        int64
	}{
		{1000, 0.7, 0, 0, 700},
		{1000, 0.3, 0, 0, 300},
		// Region a has used 600, region b 100: 300 left, a gets 0.7 of it on top of 600.
		{1000, 0.7, 600, 700, 810},
		{1000, 0.3, 100, 700, 190},
		{1000, 0.5, 400, 1000, 400}, // nothing left: what it has used, no more
		{1000, 0.5, 400, 1200, 400}, // over (slack): never below its own usage
		{1000, 0, 10, 10, 10},
		{1000, 1.5, 0, 0, 1000},
		{MaxCapacity, 1, MaxCapacity - 5, MaxCapacity - 10, MaxCapacity},
	} {
		if got := Allowance(c.budget, c.share, c.mine, c.total); got != c.want {
			t.Errorf("Allowance(%d, %v, %d, %d) = %d, want %d", c.budget, c.share, c.mine, c.total, got, c.want)
		}
	}
	// The regions' allowances from one count add up to the budget, give or take the
	// rounding down of each.
	a := Allowance(1000, 0.7, 600, 700)
	b := Allowance(1000, 0.3, 100, 700)
	if a+b > 1000 || a+b < 999 {
		t.Errorf("allowances %d + %d = %d, want 999..1000", a, b, a+b)
	}
}

func TestQuotaBandValidate(t *testing.T) {
	rule := func(b Band) Rule {
		return Rule{Tenant: "t", Route: "r", Capacity: 10, RefillPerSecond: 1, Shards: 1, Bands: []Band{b}}
	}
	for _, b := range []Band{
		{Name: "month", Capacity: 1000, Period: PeriodMonth},
		{Name: "day", Capacity: 1, Period: PeriodDay, Zone: "Europe/Berlin"},
		{Name: "hour", Capacity: 5, Period: PeriodHour, Zone: "UTC"},
	} {
		if err := rule(b).Validate(); err != nil {
			t.Errorf("%+v: %v", b, err)
		}
	}
	for _, b := range []Band{
		{Name: "month", Capacity: 1000, Period: "fortnight"},
		{Name: "month", Capacity: 1000, Period: PeriodMonth, RefillPerSecond: 1},
		{Name: "month", Capacity: 0, Period: PeriodMonth},
		{Name: "month", Capacity: 10, Period: PeriodMonth, Zone: "Mars/Olympus"},
		{Name: "month", Capacity: 10, Period: PeriodMonth, Zone: "Local"},
		{Name: "month", Capacity: 10, Period: PeriodMonth, Zone: "localtime"},
		{Name: "month", Capacity: 10, Period: PeriodMonth, Zone: "posixrules"},
		{Name: "month", Capacity: 10, Period: PeriodMonth, Zone: "Factory"},
		{Name: "month", Capacity: 10, Period: PeriodMonth, Zone: "posix/Europe/Berlin"},
		{Name: "month", Capacity: 10, Period: PeriodMonth, Zone: "/etc/localtime"},
		{Name: "hour", Capacity: 10, RefillPerSecond: 1, Zone: "Europe/Berlin"},
	} {
		if err := rule(b).Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: got %v, want ErrInvalid", b, err)
		}
	}
}

func TestScaledQuotaBand(t *testing.T) {
	now := time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)
	r := Rule{Tenant: "t", Route: "r", Capacity: 10, RefillPerSecond: 1, Shards: 1, Bands: []Band{
		{Name: "hour", Capacity: 3600, RefillPerSecond: 1},
		{Name: "month", Capacity: 1000, Period: PeriodMonth},
	}}
	var asked time.Time
	bands := r.ScaledBands(0.7, now, func(band string, start time.Time) QuotaUsage {
		if band != "month" {
			t.Errorf("usage asked for band %q", band)
		}
		asked = start
		return QuotaUsage{Mine: 600, Total: 700}
	})
	if bands[0].Quota != nil || bands[0].Limit.Capacity != 2520 {
		t.Errorf("token band %+v, want 2520 tokens and no quota", bands[0])
	}
	q := bands[1]
	if q.Quota == nil || q.Limit.Capacity != 810 || q.Quota.Floor != 600 || q.Quota.Policy != 700 || q.Quota.Grow != 210 {
		t.Fatalf("quota band %+v %+v, want allowance 810, floor 600, policy 700", q, q.Quota)
	}
	if want := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC); !asked.Equal(want) || !q.Quota.Start.Equal(want) || !q.Quota.End.Equal(want.AddDate(0, 1, 0)) {
		t.Errorf("asked for %v, window [%v, %v)", asked, q.Quota.Start, q.Quota.End)
	}
}
