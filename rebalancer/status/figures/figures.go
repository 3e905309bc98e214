package figures

import (
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
)

// Region is one region's live figures; a nil figure has no series in Prometheus.
type Region struct {
	Name string
	// Rates are the offered request rates over the window, split by decision as the
	// rebalancer counts them; a decision without a series of its own is 0. Nil when the
	// region (with a tenant: the tenant in the region) has no request series at all.
	Rates *demand.Rates
	// Fallback: at least one gateway of the region decides locally (Redis unreachable).
	Fallback *bool
	// Gateways is the region's live gateways as its gateways count them by heartbeat
	// (the largest count any of them exports; 0 when they do not know).
	Gateways *int
	// ReloadAge is the age in seconds of the oldest last successful rule reload among
	// the region's gateways.
	ReloadAge *float64
	// Share is the share the region's gateways enforce, averaged over them (see
	// Options.Tenant for which scope).
	Share *float64
}

// ThrottleRatio is throttled / offered, offered being allowed + throttled +
// shadow_throttled (demand.Rates.Offered); false without offered traffic.
func ThrottleRatio(r demand.Rates) (float64, bool) {
	offered := r.Offered()
	if offered <= 0 {
		return 0, false
	}
	return r.Throttled / offered, true
}

// Total adds regions up under name: the request rates of those that have any, whether
// any gateway is on its fallback, and the live gateways. A reload age and a share have
// no total (nil). A figure no region has stays nil.
func Total(name string, regions []Region) Region {
	t := Region{Name: name}
	for _, r := range regions {
		if r.Rates != nil {
			if t.Rates == nil {
				t.Rates = &demand.Rates{}
			}
			t.Rates.Allowed += r.Rates.Allowed
			t.Rates.Throttled += r.Rates.Throttled
			t.Rates.ShadowThrottled += r.Rates.ShadowThrottled
		}
		if r.Fallback != nil && (t.Fallback == nil || *r.Fallback) {
			b := *r.Fallback
			t.Fallback = &b
		}
		if r.Gateways != nil {
			if t.Gateways == nil {
				t.Gateways = new(int)
			}
			*t.Gateways += *r.Gateways
		}
	}
	return t
}

// The states of a region (State) and of a total (TotalState).
const (
	StateOK = "ok"
	// StateNoData: no request, gateway or reload series at all. It says what Prometheus
	// holds, not whether the region is dark (store.RegionDark decides that).
	StateNoData = "no-data"
	// StateFallback: a gateway decides on its local fallback.
	StateFallback = "fallback"
	// StateStaleRules: the oldest rule reload is older than the caller's limit.
	StateStaleRules = "stale-rules"
	// StateDegraded is a total's state when some region's is not StateOK.
	StateDegraded = "degraded"
)

// State is StateOK, or the comma-separated list of StateNoData, StateFallback and
// StateStaleRules (a reload older than staleAfter) that apply to r.
func State(r Region, staleAfter time.Duration) string {
	var s []string
	if r.Rates == nil && r.Gateways == nil && r.ReloadAge == nil {
		s = append(s, StateNoData)
	}
	if r.Fallback != nil && *r.Fallback {
		s = append(s, StateFallback)
	}
	if r.ReloadAge != nil && *r.ReloadAge > staleAfter.Seconds() {
		s = append(s, StateStaleRules)
	}
	if len(s) == 0 {
		return StateOK
	}
	return strings.Join(s, ",")
}

// TotalState is StateOK when every state in states is, else StateDegraded.
func TotalState(states []string) string {
	for _, s := range states {
		if s != StateOK {
			return StateDegraded
		}
	}
	return StateOK
}
