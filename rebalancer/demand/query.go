package demand

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/common/model"
)

// offeredDecisions matches the decision label values that count as offered traffic.
const offeredDecisions = DecisionAllowed + "|" + DecisionThrottled + "|" + DecisionShadowThrottled

// RegionOfferedQuery is the PromQL of offered demand per region: the per-second rate over
// window of the requests whose decision counts as offered (allowed, throttled,
// shadow_throttled; never unauthenticated), from RequestsMetric, summed by (region,
// decision). Region "" reads every region, else only that region's series.
//
// It is the one query behind every reader of per-region traffic (this Reader, the
// status page, ratectl status, the demo), so that they agree. A caller keeps the
// decisions apart with Rates.Add and takes Rates.Offered: a region throttled at its
// share, or measured by a shadow rule, never shows its demand through allowed alone.
func RegionOfferedQuery(window time.Duration, region string) string {
	return fmt.Sprintf(`sum by (region, decision) (rate(%s{%s}[%s]))`,
		RequestsMetric, offeredSelector(region), model.Duration(window))
}

// TenantOfferedQuery is RegionOfferedQuery per capped tenant/route pair: from
// TenantRequestsMetric, summed by (region, tenant, route, decision). Tenant "" reads
// every capped tenant but never OtherTenant (the folded remainder has no scope); a
// tenant id reads only that tenant's pairs.
func TenantOfferedQuery(window time.Duration, region, tenant string) string {
	return fmt.Sprintf(`sum by (region, tenant, route, decision) (rate(%s{%s}[%s]))`,
		TenantRequestsMetric, tenantSelector(region, tenant), model.Duration(window))
}

// offeredSelector is the label matchers of RegionOfferedQuery.
func offeredSelector(region string) string {
	sel := `decision=~"` + offeredDecisions + `"`
	if region != "" {
		sel += `,region=` + strconv.Quote(region)
	}
	return sel
}

// tenantSelector is the label matchers of TenantOfferedQuery.
func tenantSelector(region, tenant string) string {
	if tenant == "" {
		return offeredSelector(region) + `,tenant!="` + OtherTenant + `"`
	}
	return offeredSelector(region) + `,tenant=` + strconv.Quote(tenant)
}

// Add adds v requests per second of decision to r; it reports false, leaving r as it
// is, for a decision that is not offered traffic (unauthenticated).
func (r *Rates) Add(decision string, v float64) bool {
	switch decision {
	case DecisionAllowed:
		r.Allowed += v
	case DecisionThrottled:
		r.Throttled += v
	case DecisionShadowThrottled:
		r.ShadowThrottled += v
	default:
		return false
	}
	return true
}
