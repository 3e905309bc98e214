package figures_test

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/status/figures"
)

func TestChartQueries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ got, want string }{
		{figures.ThrottledQuery(time.Minute, ""), `sum by (region) (rate(ratelimit_requests_total{decision="throttled"}[1m]))`},
		{figures.ThrottledQuery(4*time.Second, "us-east"), `sum by (region) (rate(ratelimit_requests_total{decision="throttled",region="us-east"}[4s]))`},
		{figures.ShareQuery("", ""), `avg by (region) (ratelimit_region_share_ratio{scope="*"})`},
	} {
		if tc.got != tc.want {
			t.Errorf("got  %s\nwant %s", tc.got, tc.want)
		}
	}
}

// TestShareQueryEscapesTenant: "." in a tenant id is a literal in the scope regexp.
func TestShareQueryEscapesTenant(t *testing.T) {
	t.Parallel()
	if q, want := figures.ShareQuery("", "shop.a"), `scope=~"shop\\.a|shop\\.a/.*"`; !strings.Contains(q, want) {
		t.Errorf("share query %s lacks %s", q, want)
	}
}

func TestOwns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		source, region string
		want           bool
	}{
		{"", "us-east", true},
		{"", "", false},
		{"us-east", "us-east", true},
		{"us-east", "eu-west", false},
		{"us-east", "", false},
	} {
		if got := (figures.Source{Region: tc.source}).Owns(tc.region); got != tc.want {
			t.Errorf("source %q owns %q = %v, want %v", tc.source, tc.region, got, tc.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestState(t *testing.T) {
	t.Parallel()
	const staleAfter = 2 * time.Minute
	for _, tc := range []struct {
		name string
		r    figures.Region
		want string
	}{
		{"healthy", figures.Region{Rates: &demand.Rates{Allowed: 10}, Fallback: ptr(false), Gateways: ptr(2), ReloadAge: ptr(5.0)}, figures.StateOK},
		{"nothing at all", figures.Region{}, figures.StateNoData},
		{"a share alone is no data", figures.Region{Share: ptr(0.5)}, figures.StateNoData},
		{"gateways without traffic", figures.Region{Gateways: ptr(1)}, figures.StateOK},
		{"requests alone", figures.Region{Rates: &demand.Rates{}}, figures.StateOK},
		{"reload alone", figures.Region{ReloadAge: ptr(1.0)}, figures.StateOK},
		{"fallback", figures.Region{Rates: &demand.Rates{Allowed: 1}, Fallback: ptr(true)}, figures.StateFallback},
		{"fallback without other series", figures.Region{Fallback: ptr(true)}, figures.StateNoData + "," + figures.StateFallback},
		{"reload at the limit", figures.Region{ReloadAge: ptr(120.0)}, figures.StateOK},
		{"reload past the limit", figures.Region{ReloadAge: ptr(120.5)}, figures.StateStaleRules},
		{"both", figures.Region{Fallback: ptr(true), ReloadAge: ptr(300.0)}, figures.StateFallback + "," + figures.StateStaleRules},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := figures.State(tc.r, staleAfter); got != tc.want {
				t.Errorf("State = %q, want %q", got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		states []string
		want   string
	}{
		{nil, figures.StateOK},
		{[]string{figures.StateOK, figures.StateOK}, figures.StateOK},
		{[]string{figures.StateOK, figures.StateNoData}, figures.StateDegraded},
		{[]string{figures.StateFallback + "," + figures.StateStaleRules}, figures.StateDegraded},
	} {
		if got := figures.TotalState(tc.states); got != tc.want {
			t.Errorf("TotalState(%v) = %q, want %q", tc.states, got, tc.want)
		}
	}
}

// TestThrottleRatio: shadow_throttled is offered traffic, so it is in the denominator.
func TestThrottleRatio(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r    demand.Rates
		want float64
		ok   bool
	}{
		{demand.Rates{Allowed: 6, Throttled: 2, ShadowThrottled: 8}, 0.125, true},
		{demand.Rates{Allowed: 30}, 0, true},
		{demand.Rates{Throttled: 4}, 1, true},
		{demand.Rates{}, 0, false},
	} {
		if got, ok := figures.ThrottleRatio(tc.r); got != tc.want || ok != tc.ok {
			t.Errorf("ThrottleRatio(%+v) = %v, %v; want %v, %v", tc.r, got, ok, tc.want, tc.ok)
		}
	}
}

func TestTotal(t *testing.T) {
	t.Parallel()
	t.Run("adds up what is known", func(t *testing.T) {
		got := figures.Total("total", []figures.Region{
			{Name: "eu-west", Rates: &demand.Rates{Allowed: 30, Throttled: 12}, Fallback: ptr(true), Gateways: ptr(2), ReloadAge: ptr(200.0), Share: ptr(0.3)},
			{Name: "us-east", Rates: &demand.Rates{Allowed: 70, Throttled: 7, ShadowThrottled: 1}, Fallback: ptr(false), Gateways: ptr(3), ReloadAge: ptr(5.0), Share: ptr(0.7)},
			{Name: "ap-south"},
		})
		if got.Name != "total" || got.Rates == nil || *got.Rates != (demand.Rates{Allowed: 100, Throttled: 19, ShadowThrottled: 1}) ||
			got.Fallback == nil || !*got.Fallback || got.Gateways == nil || *got.Gateways != 5 || got.ReloadAge != nil || got.Share != nil {
			t.Errorf("Total = %s", show(got))
		}
	})
	t.Run("no fallback anywhere", func(t *testing.T) {
		got := figures.Total("total", []figures.Region{{Fallback: ptr(false)}, {}, {Fallback: ptr(false)}})
		if got.Fallback == nil || *got.Fallback {
			t.Errorf("Total = %s, want fallback false", show(got))
		}
	})
	t.Run("nothing known", func(t *testing.T) {
		if got := figures.Total("total", []figures.Region{{Name: "a"}, {Name: "b"}}); got != (figures.Region{Name: "total"}) {
			t.Errorf("Total = %s, want no figures", show(got))
		}
	})
	t.Run("does not alias its input", func(t *testing.T) {
		in := []figures.Region{{Rates: &demand.Rates{Allowed: 1}, Gateways: ptr(1), Fallback: ptr(true)}}
		got := figures.Total("total", in)
		got.Rates.Allowed, *got.Gateways, *got.Fallback = 9, 9, false
		if in[0].Rates.Allowed != 1 || *in[0].Gateways != 1 || !*in[0].Fallback {
			t.Errorf("Total changed its input: %s", show(in[0]))
		}
	})
}
