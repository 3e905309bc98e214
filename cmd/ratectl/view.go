package main

import (
	"context"
	"fmt"
	"time"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// view is what the share commands read for one tenant (or "*"): the regions, the rules
// that can apply to it, every share row and the instances, as a Snapshot built with the
// model's own resolution code.
type view struct {
	tenant  string
	regions []string
	rules   []regions.Rule // the tenant's and the wildcard tenant's
	// planRules are the rules of the tenant's plan, tenantPlans its assignment (none
	// without a plan).
	planRules   []regions.Rule
	tenantPlans []regions.TenantPlan
	shares      []regions.Share
	insts       []regions.Instance
	raises      []regions.Raise // only where asked for (bucket inspect: the holds)
	now         time.Time
	snap        *regions.Snapshot
	byKey       map[shareKey]regions.Share
}

type shareKey struct {
	scope  regions.Scope
	region string
	source regions.Source
}

// loadView reads what the share commands need; it does not read API keys.
func (a *app) loadView(ctx context.Context, st *store.Store, tenant string) (*view, error) {
	rs, err := st.Regions(ctx)
	if err != nil {
		return nil, fmt.Errorf("list regions: %w", err)
	}
	rules, err := st.Rules(ctx, regions.Wildcard, "")
	if err != nil {
		return nil, fmt.Errorf("list default rules: %w", err)
	}
	if tenant != regions.Wildcard {
		own, err := st.Rules(ctx, tenant, "")
		if err != nil {
			return nil, fmt.Errorf("list rules of %s: %w", tenant, err)
		}
		rules = append(own, rules...)
	}
	var (
		planRules   []regions.Rule
		tenantPlans []regions.TenantPlan
	)
	if tenant != regions.Wildcard {
		plan, err := st.TenantPlan(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if plan != "" {
			ps, err := st.Plans(ctx, plan)
			if err != nil {
				return nil, fmt.Errorf("list the rules of plan %s: %w", plan, err)
			}
			for _, p := range ps {
				planRules = append(planRules, p.Rules...)
			}
			tenantPlans = []regions.TenantPlan{{Tenant: tenant, Plan: plan}}
		}
	}
	shares, err := st.Shares(ctx)
	if err != nil {
		return nil, fmt.Errorf("list shares: %w", err)
	}
	insts, err := st.Instances(ctx)
	if err != nil {
		return nil, fmt.Errorf("list gateway instances: %w", err)
	}
	// Expiry is judged by the database's clock, as the gateways' snapshots are.
	now, err := st.Now(ctx)
	if err != nil {
		return nil, err
	}
	v := &view{tenant: tenant, regions: rs, rules: rules, planRules: planRules, tenantPlans: tenantPlans, shares: shares, insts: insts, now: now}
	if err := v.build(); err != nil {
		return nil, err
	}
	return v, nil
}

// build (re)builds the snapshot from the view's rows.
func (v *view) build() error {
	snap, err := regions.NewSnapshot(regions.SnapshotData{
		Regions: v.regions, Rules: v.rules, PlanRules: v.planRules, TenantPlans: v.tenantPlans, Shares: v.shares, Instances: v.insts, Raises: v.raises,
		InstanceTTL: liveInstanceTTL, LoadedAt: v.now,
	})
	if err != nil {
		return fmt.Errorf("the stored data is inconsistent: %w", err)
	}
	v.snap = snap
	v.byKey = make(map[shareKey]regions.Share, len(v.shares))
	for _, s := range v.shares {
		v.byKey[shareKey{s.Scope, s.Region, s.Source}] = s
	}
	return nil
}

// withOverride is a copy of the view in which scope's override is replaced by shares,
// expiring at expires (zero: never); nil shares removes it.
func (v *view) withOverride(scope regions.Scope, shares map[string]float64, expires time.Time) (*view, error) {
	n := *v
	n.shares = nil
	for _, s := range v.shares {
		if !(s.Scope == scope && s.Source == regions.SourceOverride) {
			n.shares = append(n.shares, s)
		}
	}
	for r, sh := range shares {
		n.shares = append(n.shares, regions.Share{Scope: scope, Region: r, Share: sh, Source: regions.SourceOverride, ExpiresAt: expires})
	}
	if err := n.build(); err != nil {
		return nil, err
	}
	return &n, nil
}

// effectiveShare is a region's share of a tenant's rule for a route, and where it comes
// from.
type effectiveShare struct {
	share     float64
	source    regions.Source
	scope     string // the scope whose row applies; "" for the equal split
	expiresAt time.Time
}

// effective resolves region's share for tenant and route as the gateways do
// (Snapshot.EffectiveShare), and names the scope that supplied it.
func (v *view) effective(region, tenant, route string) effectiveShare {
	share, src := v.snap.Share(region, tenant, route)
	e := effectiveShare{share: share, source: src}
	if src == regions.SourceDefault {
		return e
	}
	for _, sc := range [...]regions.Scope{{Tenant: tenant, Route: route}, {Tenant: tenant, Route: regions.Wildcard}, regions.GlobalScope} {
		if s, ok := v.byKey[shareKey{sc, region, src}]; ok && s.Active(v.now) {
			e.scope, e.expiresAt = s.Scope.String(), s.ExpiresAt
			return e
		}
	}
	return e
}

// routes lists the routes whose rule can differ for the view's tenant: every route named
// by its rules or by the wildcard tenant's, and "*" (every other route), sorted with "*"
// first.
func (v *view) routes() []string {
	set := map[string]bool{regions.Wildcard: true}
	for _, r := range v.rules {
		set[r.Route] = true
	}
	for _, r := range v.planRules {
		set[r.Route] = true
	}
	return sortedKeys(set) // "*" sorts before letters and digits
}

// limitRow is one rule of the tenant scaled for one region.
type limitRow struct {
	Tenant string `json:"tenant"`
	Route  string `json:"route"`
	// RuleTenant and RuleRoute name the rule that applies (it may be a default).
	RuleTenant string `json:"rule_tenant"`
	RuleRoute  string `json:"rule_route"`
	// RulePlan is the plan whose rule it is (RuleTenant is then "*"); absent otherwise.
	RulePlan string `json:"rule_plan,omitempty"`
	// Limit is that rule's bucket, before the region's share scales it.
	regions.Limit
	Region               string  `json:"region"`
	Share                float64 `json:"share"`
	Source               string  `json:"source"`
	Scope                string  `json:"scope"`
	RegionalCapacity     int64   `json:"regional_capacity"`
	RegionalRefillPerSec float64 `json:"regional_refill_per_second"`
}

// limits is every route of the view's tenant scaled for every region.
func (v *view) limits() []limitRow {
	var out []limitRow
	for _, route := range v.routes() {
		for _, region := range v.regions {
			rule, lim, _ := v.snap.RegionalRule(region, v.tenant, route)
			e := v.effective(region, v.tenant, route)
			out = append(out, limitRow{
				Tenant: v.tenant, Route: route, RuleTenant: rule.Tenant, RuleRoute: rule.Route, RulePlan: rule.Plan,
				Limit:  regions.Limit{Capacity: rule.Capacity, RefillPerSecond: rule.RefillPerSecond},
				Region: region, Share: e.share, Source: string(e.source), Scope: e.scope,
				RegionalCapacity: lim.Capacity, RegionalRefillPerSec: sig(lim.RefillPerSecond),
			})
		}
	}
	if out == nil {
		out = []limitRow{}
	}
	return out
}
