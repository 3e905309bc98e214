package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// planRule prints what `rules set` would change, as apply does, and writes nothing.
func (a *app) planRule(ctx context.Context, cmd *cobra.Command, st *store.Store, nr regions.Rule, routes map[string]bool) error {
	all, err := st.Rules(ctx, "", "")
	if err != nil {
		return err
	}
	replaced := false
	for i := range all {
		if all[i].Tenant == nr.Tenant && all[i].Route == nr.Route {
			all[i], replaced = nr, true
		}
	}
	if !replaced {
		all = append(all, nr)
	}
	changes, err := st.Plan(ctx, store.Config{Rules: &all})
	if err != nil {
		return err
	}
	return a.renderPlan(cmd, changePlanJSON{Changes: changes, Warnings: ruleWarnings(changes, routes)})
}

// planRuleDelete prints what `rules delete` would change and writes nothing. A rule that
// does not exist is an error, as it is with --apply.
func (a *app) planRuleDelete(ctx context.Context, cmd *cobra.Command, st *store.Store, tenant, route string) error {
	c := store.Change{Action: store.ActionDelete, Object: "rule", ID: tenant + "/" + route}
	rules, err := st.Rules(ctx, tenant, route)
	switch {
	case err == nil && len(rules) == 0:
		return fmt.Errorf("rule %s/%s does not exist", tenant, route)
	case err == nil:
		c.Old = store.RuleValueOf(rules[0])
	case !errors.Is(err, regions.ErrInvalid):
		return err
	}
	// Else an id only the database accepts (a reserved name written with SQL): the plan
	// names the row without its values.
	return a.renderPlan(cmd, changePlanJSON{Changes: []store.Change{c}, Warnings: deleteWarnings(tenant, route)})
}

// deleteWarnings are the loud warnings of deleting the rule tenant/route.
func deleteWarnings(tenant, route string) []string {
	switch {
	case tenant == regions.Wildcard:
		return []string{fmt.Sprintf("deleting rule %s/%s changes the limit of EVERY tenant on route %s without a rule of its own", tenant, route, route)}
	case route == regions.Wildcard:
		return []string{fmt.Sprintf("deleting rule %s/%s changes the limit of EVERY route of tenant %s without a rule of its own", tenant, route, tenant)}
	}
	return nil
}
