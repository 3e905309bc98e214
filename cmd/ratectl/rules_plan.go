package main

import (
	"context"

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
