package figures

import (
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
)

// TestQueries pins the PromQL of every figure: a regional source selects its region in
// every selector, a tenant reads its own series and scopes.
func TestQueries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		o      Options
		region string
		want   map[string]string
	}{
		{name: "every region", o: Options{Window: time.Minute}, want: map[string]string{
			"offered":  `sum by (region, decision) (rate(ratelimit_requests_total{decision=~"allowed|throttled|shadow_throttled"}[1m]))`,
			"fallback": `max by (region) (ratelimit_fallback_active)`,
			"gateways": `max by (region) (ratelimit_gateway_instances)`,
			"reload":   `time() - min by (region) (ratelimit_rules_last_reload_success_timestamp_seconds)`,
			"share":    `avg by (region) (ratelimit_region_share_ratio{scope="*"})`,
		}},
		{name: "one region", o: Options{Window: 30 * time.Second}, region: "eu-west", want: map[string]string{
			"offered":  `sum by (region, decision) (rate(ratelimit_requests_total{decision=~"allowed|throttled|shadow_throttled",region="eu-west"}[30s]))`,
			"fallback": `max by (region) (ratelimit_fallback_active{region="eu-west"})`,
			"gateways": `max by (region) (ratelimit_gateway_instances{region="eu-west"})`,
			"reload":   `time() - min by (region) (ratelimit_rules_last_reload_success_timestamp_seconds{region="eu-west"})`,
			"share":    `avg by (region) (ratelimit_region_share_ratio{scope="*",region="eu-west"})`,
		}},
		{name: "a tenant in one region", o: Options{Window: time.Minute, Tenant: "shop-a"}, region: "eu-west", want: map[string]string{
			"offered":  `sum by (region, tenant, route, decision) (rate(ratelimit_tenant_requests_total{decision=~"allowed|throttled|shadow_throttled",region="eu-west",tenant="shop-a"}[1m]))`,
			"fallback": `max by (region) (ratelimit_fallback_active{region="eu-west"})`,
			"gateways": `max by (region) (ratelimit_gateway_instances{region="eu-west"})`,
			"reload":   `time() - min by (region) (ratelimit_rules_last_reload_success_timestamp_seconds{region="eu-west"})`,
			"share": `avg by (region) (ratelimit_region_share_ratio{scope=~"shop-a|shop-a/.*",region="eu-west"}) or ` +
				`avg by (region) (ratelimit_region_share_ratio{scope="*",region="eu-west"})`,
		}},
		{name: "rates only (the status page)", o: Options{Window: time.Minute, RatesOnly: true}, want: map[string]string{
			"offered": `sum by (region, decision) (rate(ratelimit_requests_total{decision=~"allowed|throttled|shadow_throttled"}[1m]))`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]string{}
			for _, q := range queries(tc.o, tc.region) {
				got[q.name] = q.promql
			}
			if len(got) != len(tc.want) {
				t.Errorf("queries %v, want %d", got, len(tc.want))
			}
			for name, want := range tc.want {
				if got[name] != want {
					t.Errorf("%s:\n got %s\nwant %s", name, got[name], want)
				}
			}
		})
	}
	// The offered query is the rebalancer's own, so the readers agree on offered demand.
	if got, want := OfferedQuery(time.Minute, "us-east", ""), demand.RegionOfferedQuery(time.Minute, "us-east"); got != want {
		t.Errorf("OfferedQuery %s, want demand's %s", got, want)
	}
}

// TestQueriesIgnoreImpossibleSamples: a negative or huge gateway count, rate, share or
// age (a broken exporter) is no data, never -9223372036854775808 gateways or a share
// JSON cannot hold; a reload age a little below 0 (clock skew) reads 0.
func TestQueriesIgnoreImpossibleSamples(t *testing.T) {
	t.Parallel()
	for _, v := range []float64{-1e308, 1e308, -1} {
		var r Region
		for _, q := range queries(Options{Window: time.Minute}, "") {
			q.fill(&r, &model.Sample{Metric: model.Metric{"decision": "allowed"}, Value: model.SampleValue(v)})
		}
		if r.Rates != nil || r.Gateways != nil || r.Share != nil || (r.ReloadAge != nil && v != -1) {
			t.Errorf("sample %v: rates %v gateways %v share %v age %v", v, r.Rates, r.Gateways, r.Share, r.ReloadAge)
		}
		if v == -1 && (r.ReloadAge == nil || *r.ReloadAge != 0) {
			t.Errorf("reload age of -1 s: %v, want 0", r.ReloadAge)
		}
	}
}
