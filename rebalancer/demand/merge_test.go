package demand

import (
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/regions"
)

// TestMergeKeepsOnlyFreshSeriesWithRates covers the rules that decide "unknown" from
// query results: stale newest sample, no long-window rate, bad ids, the _other tenant.
func TestMergeKeepsOnlyFreshSeriesWithRates(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	r := &Reader{cfg: Config{MaxAge: 10 * time.Second}}
	ts := func(region string, age time.Duration, extra ...string) *model.Sample {
		m := model.Metric{"region": model.LabelValue(region)}
		for i := 0; i+1 < len(extra); i += 2 {
			m[model.LabelName(extra[i])] = model.LabelValue(extra[i+1])
		}
		return &model.Sample{Metric: m, Value: model.SampleValue(float64(now.Add(-age).UnixMilli()) / 1000)}
	}
	rate := func(region, decision string, v float64, extra ...string) *model.Sample {
		s := ts(region, 0, extra...)
		s.Metric["decision"] = model.LabelValue(decision)
		s.Value = model.SampleValue(v)
		return s
	}
	long := model.Vector{
		rate("fresh", DecisionAllowed, 7), rate("fresh", DecisionThrottled, 3),
		rate("stale", DecisionAllowed, 5),
		rate("bad id!", DecisionAllowed, 5),
		rate("fresh", DecisionAllowed, 4, "tenant", "t1", "route", "r1"),
		rate("fresh", DecisionAllowed, 9, "tenant", OtherTenant, "route", OtherTenant),
	}
	short := model.Vector{rate("fresh", DecisionAllowed, 1)}
	newest := model.Vector{
		ts("fresh", time.Second), ts("stale", time.Minute), ts("norate", 0), ts("bad id!", 0),
		ts("fresh", 0, "tenant", "t1", "route", "r1"), ts("fresh", 0, "tenant", OtherTenant, "route", OtherTenant),
	}
	got := map[regions.Scope]map[string]Sample{}
	r.merge(got, [3]model.Vector{long, short, newest}, now)

	if len(got[regions.GlobalScope]) != 1 {
		t.Fatalf("global = %v, want only region fresh", got[regions.GlobalScope])
	}
	f := got[regions.GlobalScope]["fresh"]
	if f.Long.Offered() != 10 || f.Short.Allowed != 1 || !f.LastSeen.Equal(now.Add(-time.Second)) {
		t.Errorf("fresh = %+v", f)
	}
	pair := regions.Scope{Tenant: "t1", Route: "r1"}
	if p, ok := got[pair]["fresh"]; !ok || p.Long.Allowed != 4 || p.Short.Allowed != 4 {
		t.Errorf("pair t1/r1 = %+v, %v; want long 4 and short falling back to long", p, ok)
	}
	if len(got) != 2 {
		t.Errorf("scopes = %v, want * and t1/r1 only", got)
	}
}
