package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// bandStatus is one band of a tenant's rule for a route in `ratectl status --tenant`: a
// token bucket's limit, or a calendar quota's period, usage and what is left.
type bandStatus struct {
	Route string `json:"route"`
	Band  string `json:"band"`
	// Kind is "bucket" (the rule's own band and token-bucket bands) or "quota".
	Kind string `json:"kind"`
	// Limit is the band as ratectl writes it (FormatBand; the rule's own as CAP@REFILL).
	Limit string `json:"limit"`
	// Source says where the rule comes from: "tenant", "plan NAME" or "default".
	Source string `json:"source"`
	// For a quota: the period holding now, the fleet's usage of it as the store counted
	// it, what is left of the budget, and each region's usage and allowance.
	PeriodStart *time.Time          `json:"period_start,omitempty"`
	PeriodEnd   *time.Time          `json:"period_end,omitempty"`
	Used        *int64              `json:"used,omitempty"`
	Left        *int64              `json:"left,omitempty"`
	Regions     []regionQuotaStatus `json:"regions,omitempty"`
}

// regionQuotaStatus is one region's part of a quota's period: its share (as enforced
// now), its usage and its allowance (regions.Allowance).
type regionQuotaStatus struct {
	Region    string  `json:"region"`
	Share     float64 `json:"share"`
	Used      int64   `json:"used"`
	Allowance int64   `json:"allowance"`
}

// tenantBands is every band of every rule that applies to tenant (its own, its plan's,
// the defaults it has no rule of its own for), with the quotas' usage from the store,
// at the database's clock.
func (a *app) tenantBands(ctx context.Context, st *store.Store, tenant string) ([]bandStatus, time.Time, error) {
	v, err := a.loadView(ctx, st, tenant)
	if err != nil {
		return nil, time.Time{}, err
	}
	used := map[string]map[regions.QuotaKey]regions.QuotaUsage{}
	for _, region := range v.regions {
		if used[region], err = st.LoadUsage(ctx, region, v.now.Add(-regions.QuotaLookback)); err != nil {
			return nil, time.Time{}, fmt.Errorf("read the quotas' usage: %w", err)
		}
	}
	// The routes of the tenant's rules, and the routes its quotas have usage on: a rule
	// for "*" gives every route of the gateways a quota of its own, and the store knows
	// the routes that used one.
	var routes, ruled []string
	for _, r := range append(slices.Clone(v.rules), v.planRules...) {
		if !slices.Contains(ruled, r.Route) {
			ruled = append(ruled, r.Route)
		}
	}
	routes = slices.Clone(ruled)
	for _, m := range used {
		for k := range m {
			if k.Tenant == tenant && !slices.Contains(routes, k.Route) {
				routes = append(routes, k.Route)
			}
		}
	}
	slices.Sort(routes)
	var out []bandStatus
	for _, route := range routes {
		rule := v.snap.Rule(tenant, route)
		if rule.Route != route && slices.Contains(ruled, route) {
			continue // this route's rule is a default another one of the tenant's overrides
		}
		src := "default"
		switch {
		case rule.Plan != "":
			src = "plan " + rule.Plan
		case rule.Tenant == tenant:
			src = "tenant"
		}
		out = append(out, bandStatus{Route: route, Band: regions.PrimaryBand, Kind: "bucket", Source: src,
			Limit: strconv.FormatInt(rule.Capacity, 10) + "@" + strconv.FormatFloat(rule.RefillPerSecond, 'g', -1, 64) + "/s"})
		for _, b := range rule.Bands {
			bs := bandStatus{Route: route, Band: b.Name, Kind: "bucket", Limit: store.FormatBand(b), Source: src}
			if b.Quota() && route == regions.Wildcard {
				bs.Kind = "quota" // one per route: the routes that used it are listed on their own
			} else if b.Quota() {
				bs.Kind = "quota"
				start, end := b.Window(v.now)
				k := regions.QuotaKey{Tenant: tenant, Route: route, Band: b.Name, Start: start.Unix()}
				var total int64
				for _, region := range v.regions {
					total = max(total, used[region][k].Total)
				}
				for _, region := range v.regions {
					mine := used[region][k].Mine
					_, _, share := v.snap.RegionalRule(region, tenant, route)
					if pending, held := v.snap.Pending(region, tenant, route); held {
						share *= pending
					}
					bs.Regions = append(bs.Regions, regionQuotaStatus{Region: region, Share: roundTo(share, 4), Used: mine,
						Allowance: regions.Allowance(b.Capacity, share, mine, total)})
				}
				left := max(b.Capacity-total, 0)
				bs.PeriodStart, bs.PeriodEnd, bs.Used, bs.Left = &start, &end, &total, &left
			}
			out = append(out, bs)
		}
	}
	return out, v.now, nil
}

// bandsTable writes the bands of a tenant: each quota's usage, what is left and when its
// period ends; a token bucket's limit (its tokens now are per region, in its Redis:
// `ratectl bucket inspect --region R`).
func bandsTable(w io.Writer, tenant string, at time.Time, bs []bandStatus) {
	fmt.Fprintf(w, "# bands of tenant %s at %s (quota usage as the gateways last reported it)\n", tenant, timeCell(at))
	row(w, "ROUTE", "BAND", "KIND", "LIMIT", "SOURCE", "USED", "LEFT", "RESETS", "REGIONS (used/allowance)")
	for _, b := range bs {
		used, left, resets, per := "-", "-", "-", "bucket inspect --region R"
		if b.Kind == "quota" && b.Route == regions.Wildcard {
			per = "each route its own (routes with usage: below)"
		} else if b.Kind == "quota" {
			used, left, resets = strconv.FormatInt(*b.Used, 10), strconv.FormatInt(*b.Left, 10), timeCell(*b.PeriodEnd)
			parts := make([]string, len(b.Regions))
			for i, r := range b.Regions {
				parts[i] = r.Region + "=" + strconv.FormatInt(r.Used, 10) + "/" + strconv.FormatInt(r.Allowance, 10)
			}
			per = strings.Join(parts, " ")
		}
		row(w, b.Route, b.Band, b.Kind, b.Limit, b.Source, used, left, resets, per)
	}
}
