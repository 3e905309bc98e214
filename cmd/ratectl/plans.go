package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// usagePlanJSON is one usage plan in `plans list|get -o json`: its name, how many tenants it has,
// and its rules (a route and its bucket, as every plan of changes prints it).
type usagePlanJSON struct {
	Name    string              `json:"name"`
	Tenants int64               `json:"tenants"`
	Rules   []usagePlanRuleJSON `json:"rules"`
}

type usagePlanRuleJSON struct {
	Route string `json:"route"`
	*store.RuleValue
	UpdatedAt time.Time `json:"updated_at"`
}

func toUsagePlanJSON(p regions.Plan, tenants int64) usagePlanJSON {
	out := usagePlanJSON{Name: p.Name, Tenants: tenants, Rules: []usagePlanRuleJSON{}}
	for _, r := range p.Rules {
		out.Rules = append(out.Rules, usagePlanRuleJSON{Route: r.Route, RuleValue: store.RuleValueOf(r), UpdatedAt: r.UpdatedAt.UTC()})
	}
	return out
}

// plansTable prints ps; a BANDS column only when a rule has bands (NAME=CAPACITY/PER).
func plansTable(w io.Writer, ps []usagePlanJSON) {
	banded := false
	for _, p := range ps {
		for _, r := range p.Rules {
			banded = banded || len(r.Bands) > 0
		}
	}
	if !banded {
		row(w, "PLAN", "TENANTS", "ROUTE", "CAPACITY", "REFILL/S", "SHADOW", "SHARDS", "UPDATED")
	} else {
		row(w, "PLAN", "TENANTS", "ROUTE", "CAPACITY", "REFILL/S", "SHADOW", "SHARDS", "BANDS", "UPDATED")
	}
	for _, p := range ps {
		if len(p.Rules) == 0 {
			cells := []string{p.Name, strconv.FormatInt(p.Tenants, 10), "-", "-", "-", "-", "-", "-"}
			if banded {
				cells = append(cells, "-")
			}
			row(w, cells...)
		}
		for _, r := range p.Rules {
			cells := []string{p.Name, strconv.FormatInt(p.Tenants, 10), r.Route, strconv.FormatInt(r.Capacity, 10), rateCell(r.RefillPerSecond),
				boolCell(r.Shadow), strconv.Itoa(r.Shards)}
			if banded {
				cells = append(cells, bandsCell(r.Bands))
			}
			row(w, append(cells, timeCell(r.UpdatedAt))...)
		}
	}
}

// readPlanViews is the plans named name ("" = all) with their tenant counts; a plan named
// that does not exist is an error.
func readPlanViews(ctx context.Context, st *store.Store, name string) ([]usagePlanJSON, error) {
	ps, err := st.Plans(ctx, name)
	if err != nil {
		return nil, err
	}
	if name != "" && len(ps) == 0 {
		return nil, fmt.Errorf("plan %s does not exist (ratectl plans list shows them)", name)
	}
	out := []usagePlanJSON{}
	for _, p := range ps {
		n, err := st.PlanTenants(ctx, p.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, toUsagePlanJSON(p, n))
	}
	return out, nil
}

// planWarnings warn that a change of plan reaches all its tenants at once.
func planWarnings(ctx context.Context, st *store.Store, plan string) ([]string, error) {
	n, err := st.PlanTenants(ctx, plan)
	if err != nil || n == 0 {
		return nil, err
	}
	return []string{fmt.Sprintf("plan %s: this changes the limit of EVERY tenant of the plan without a rule of its own (%d tenants)", plan, n)}, nil
}

func newPlansCmd(a *app) *cobra.Command {
	list := &cobra.Command{
		Use:   "list",
		Short: "List plans, their tenant counts and rules",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				out, err := readPlanViews(ctx, st, "")
				if err != nil {
					return err
				}
				return a.render(cmd, out, func(w io.Writer) { plansTable(w, out) })
			})
		}),
	}
	get := &cobra.Command{
		Use:   "get PLAN",
		Short: "Show one plan: its tenant count and rules",
		Args:  exactArgs(1, "a plan name"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := checkID("plan", args[0]); err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				out, err := readPlanViews(ctx, st, args[0])
				if err != nil {
					return err
				}
				return a.render(cmd, out[0], func(w io.Writer) { plansTable(w, out) })
			})
		}),
	}
	return groupCmd("plans", "List, set and delete plans (rules many tenants share), assign tenants",
		list, get, newPlansSetCmd(a), newPlansDeleteCmd(a), newPlansAssignCmd(a), newPlansUnassignCmd(a))
}

func newPlansSetCmd(a *app) *cobra.Command {
	var (
		r        regions.Rule
		reason   string
		write    bool
		bandArgs []string
		noBands  bool
	)
	set := &cobra.Command{
		Use:   "set PLAN --route R --capacity N --refill X [--shadow] [--shards K] [--band NAME=CAPACITY/PER]... [--no-bands] [--apply]",
		Short: "Create or change a plan's rule for a route (creating the plan)",
		Long: `Create or change the token bucket of a plan for a route (route * for every route), and
the plan itself if it is new. Every tenant assigned to the plan gets it, in buckets of its
own, unless the tenant has a rule of its own for the route (tenant+route or tenant+*);
the order is tenant+route, tenant+*, plan+route, plan+*, *+route, *+*. It is one row:
all the plan's tenants change in one transaction, with one audit row.

Flags not given keep the existing rule's values; a new rule needs --capacity and --refill.
--band NAME=CAPACITY/PER (hour=10000/1h), --band NAME=AMOUNT/PERIOD[@ZONE] (a calendar
quota: month=1000000/month), --band NAME= and --no-bands set and remove the rule's
further limits as with ratectl rules set: each tenant of the plan gets every band in
buckets (and quotas) of its own.
Without --apply it prints the change and writes nothing; a plan with tenants gets a
WARNING line on stderr.`,
		Args: exactArgs(1, "a plan name"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			r.Plan, r.Tenant = args[0], regions.Wildcard
			if err := checkID("plan", r.Plan); err != nil {
				return err
			}
			if err := checkRuleFlags(f, &r); err != nil {
				return err
			}
			edit, err := parseBandFlags(bandArgs, noBands)
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				all, err := st.Plans(ctx, "")
				if err != nil {
					return err
				}
				nr, i, err := mergePlanRule(all, r, f.Changed)
				if err != nil {
					return err
				}
				if nr.Bands, err = editBands(f, edit, nr.Bands, nr); err != nil {
					return err
				}
				warnings, err := planWarnings(ctx, st, r.Plan)
				if err != nil {
					return err
				}
				if !write {
					if i < 0 {
						all = append(all, regions.Plan{Name: r.Plan})
						i = len(all) - 1
					}
					all[i].Rules = replaceRoute(all[i].Rules, nr)
					changes, err := st.Plan(ctx, store.Config{Plans: &[]regions.Plan{all[i]}})
					if err != nil {
						return err
					}
					return a.renderPlan(cmd, changePlanJSON{Changes: changes, Warnings: warnings})
				}
				for _, w := range warnings {
					a.loudWarn(w)
				}
				ctx, _, err = a.auditCtx(ctx, reasonOr(reason, cmd))
				if err != nil {
					return err
				}
				if err := st.SetPlanRule(ctx, nr); err != nil {
					return err
				}
				out, err := readPlanViews(ctx, st, r.Plan)
				if err != nil {
					return err
				}
				return a.render(cmd, out[0], func(w io.Writer) { plansTable(w, out) })
			})
		}),
	}
	sf := set.Flags()
	sf.StringVar(&r.Route, "route", "", "route id, or * for every route (required)")
	sf.Int64Var(&r.Capacity, "capacity", 0, "burst: the most tokens each tenant's bucket holds (> 0)")
	sf.Float64Var(&r.RefillPerSecond, "refill", 0, "sustained rate in requests per second (> 0)")
	sf.BoolVar(&r.Shadow, "shadow", false, "never reject; only count what would be rejected")
	sf.IntVar(&r.Shards, "shards", 1, "split each bucket over this many Redis keys (hot keys), 1..1024")
	sf.StringVar(&reason, "reason", "", "why, for the audit log (default: the command)")
	sf.BoolVar(&write, "apply", false, "write the rule (without it: print the change only)")
	addBandFlags(sf, &bandArgs, &noBands)
	_ = set.MarkFlagRequired("route")
	return set
}

// mergePlanRule is r with the values of the existing rule of its plan and route for the
// flags not changed, and the index of its plan in all (-1: a new plan). A new rule needs
// capacity and refill.
func mergePlanRule(all []regions.Plan, r regions.Rule, changed func(string) bool) (regions.Rule, int, error) {
	for i, p := range all {
		if p.Name != r.Plan {
			continue
		}
		for _, old := range p.Rules {
			if old.Route != r.Route {
				continue
			}
			if !changed("capacity") {
				r.Capacity = old.Capacity
			}
			if !changed("refill") {
				r.RefillPerSecond = old.RefillPerSecond
			}
			if !changed("shadow") {
				r.Shadow = old.Shadow
			}
			if !changed("shards") {
				r.Shards = old.Shards
			}
			r.Bands = old.Bands // the band flags edit them (editBands)
			return r, i, nil
		}
		return r, i, newPlanRuleNeeds(r, changed)
	}
	return r, -1, newPlanRuleNeeds(r, changed)
}

func newPlanRuleNeeds(r regions.Rule, changed func(string) bool) error {
	if !changed("capacity") || !changed("refill") {
		return usagef("plan %s has no rule for route %s yet: a new rule needs --capacity and --refill", r.Plan, r.Route)
	}
	return nil
}

// replaceRoute is rules with r in place of the rule of its route, or added.
func replaceRoute(rules []regions.Rule, r regions.Rule) []regions.Rule {
	out := make([]regions.Rule, 0, len(rules)+1)
	for _, o := range rules {
		if o.Route != r.Route {
			o.UpdatedAt = time.Time{}
			out = append(out, o)
		}
	}
	return append(out, r)
}

func newPlansDeleteCmd(a *app) *cobra.Command {
	var (
		route, reason string
		write         bool
	)
	del := &cobra.Command{
		Use:   "delete PLAN [--route R] [--apply]",
		Short: "Delete a plan's rule for a route, or (without --route) the plan",
		Long: `With --route, delete the plan's rule for that route: its tenants fall back to the plan's
rule for *, then the defaults. Without --route, delete the plan and its rules; a plan
with tenants cannot be deleted (unassign them first: ratectl plans unassign TENANT).
Without --apply it prints the change and writes nothing.`,
		Args: exactArgs(1, "a plan name"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			plan := args[0]
			if err := checkID("plan", plan); err != nil {
				return err
			}
			byRoute := cmd.Flags().Changed("route")
			if byRoute {
				if err := checkIDOrWildcard("route", route); err != nil {
					return err
				}
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				views, err := readPlanViews(ctx, st, plan)
				if err != nil {
					return err
				}
				p := views[0]
				c := store.Change{Action: store.ActionDelete, Object: "plan", ID: plan}
				var warnings []string
				if byRoute {
					c.Object, c.ID = "plan_rule", plan+"/"+route
					for _, r := range p.Rules {
						if r.Route == route {
							c.Old = r.RuleValue
						}
					}
					if c.Old == nil {
						return fmt.Errorf("plan %s has no rule for route %s", plan, route)
					}
					if warnings, err = planWarnings(ctx, st, plan); err != nil {
						return err
					}
				} else if p.Tenants > 0 {
					return fmt.Errorf("plan %s is in use by %d tenants: unassign them first (ratectl plans unassign TENANT), or assign them another plan", plan, p.Tenants)
				}
				if !write {
					return a.renderPlan(cmd, changePlanJSON{Changes: []store.Change{c}, Warnings: warnings})
				}
				// renderPlan below prints the warnings once the rule is deleted.
				ctx, _, err = a.auditCtx(ctx, reasonOr(reason, cmd))
				if err != nil {
					return err
				}
				if byRoute {
					err = st.DeletePlanRule(ctx, plan, route)
				} else {
					err = st.DeletePlan(ctx, plan)
				}
				switch {
				case errors.Is(err, store.ErrPlanInUse):
					return fmt.Errorf("plan %s is in use: unassign its tenants first (ratectl plans unassign TENANT): %w", plan, err)
				case errors.Is(err, store.ErrNotFound):
					return fmt.Errorf("%s %s does not exist", c.Object, c.ID)
				case err != nil:
					return err
				}
				return a.renderPlan(cmd, changePlanJSON{Changes: []store.Change{c}, Warnings: warnings, Applied: true})
			})
		}),
	}
	del.Flags().StringVar(&route, "route", "", "delete only the plan's rule for this route (or *)")
	del.Flags().StringVar(&reason, "reason", "", "why, for the audit log (default: the command)")
	del.Flags().BoolVar(&write, "apply", false, "delete (without it: print the change only)")
	return del
}

func newPlansAssignCmd(a *app) *cobra.Command {
	var (
		reason string
		write  bool
	)
	assign := &cobra.Command{
		Use:   "assign TENANT PLAN [--apply]",
		Short: "Assign a tenant to a plan (replacing its plan, if any)",
		Long: `Assign a tenant to a plan: the plan's rules apply to it where it has no rule of its own.
A tenant has at most one plan; assigning another replaces it. Without --apply it prints
the change and writes nothing.`,
		Args: exactArgs(2, "a tenant and a plan"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			tenant, plan := args[0], args[1]
			if err := checkID("tenant", tenant); err != nil {
				return err
			}
			if err := checkID("plan", plan); err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				if _, err := readPlanViews(ctx, st, plan); err != nil {
					return err
				}
				changes, err := st.Plan(ctx, store.Config{TenantPlans: &[]regions.TenantPlan{{Tenant: tenant, Plan: plan}}})
				if err != nil {
					return err
				}
				if !write || len(changes) == 0 {
					return a.renderPlan(cmd, changePlanJSON{Changes: changes})
				}
				ctx, _, err = a.auditCtx(ctx, reasonOr(reason, cmd))
				if err != nil {
					return err
				}
				if err := st.AssignPlan(ctx, tenant, plan); err != nil {
					if errors.Is(err, store.ErrNotFound) {
						return fmt.Errorf("plan %s does not exist (ratectl plans list shows them)", plan)
					}
					return err
				}
				return a.renderPlan(cmd, changePlanJSON{Changes: changes, Applied: true})
			})
		}),
	}
	assign.Flags().StringVar(&reason, "reason", "", "why, for the audit log (default: the command)")
	assign.Flags().BoolVar(&write, "apply", false, "assign (without it: print the change only)")
	return assign
}

func newPlansUnassignCmd(a *app) *cobra.Command {
	var (
		reason string
		write  bool
	)
	unassign := &cobra.Command{
		Use:   "unassign TENANT [--apply]",
		Short: "Remove a tenant's plan (it falls back to its own rules and the defaults)",
		Args:  exactArgs(1, "a tenant"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			tenant := args[0]
			if err := checkID("tenant", tenant); err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				plan, err := st.TenantPlan(ctx, tenant)
				if err != nil {
					return err
				}
				if plan == "" {
					return fmt.Errorf("tenant %s has no plan", tenant)
				}
				c := store.Change{Action: store.ActionDelete, Object: "tenant_plan", ID: tenant, Old: &store.TenantPlanValue{Plan: plan}}
				if !write {
					return a.renderPlan(cmd, changePlanJSON{Changes: []store.Change{c}})
				}
				ctx, _, err = a.auditCtx(ctx, reasonOr(reason, cmd))
				if err != nil {
					return err
				}
				if err := st.UnassignPlan(ctx, tenant); err != nil {
					if errors.Is(err, store.ErrNotFound) {
						return fmt.Errorf("tenant %s has no plan", tenant)
					}
					return err
				}
				return a.renderPlan(cmd, changePlanJSON{Changes: []store.Change{c}, Applied: true})
			})
		}),
	}
	unassign.Flags().StringVar(&reason, "reason", "", "why, for the audit log (default: the command)")
	unassign.Flags().BoolVar(&write, "apply", false, "unassign (without it: print the change only)")
	return unassign
}
