package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions/store"
)

// migrateDownJSON is `migrate down -o json`: the plan, whether it was applied, and what
// still blocks it.
type migrateDownJSON struct {
	migrations.DownPlan
	Applied  bool                 `json:"applied"`
	Blocking []migrations.Refusal `json:"blocking"`
	// Status is every migration after an applied roll back.
	Status []migrations.MigrationStatus `json:"status,omitempty"`
}

// The flags that override a refusal, by kind; their help states the consequence.
var downForceFlags = map[migrations.RefusalKind]string{
	migrations.RefusalLiveGateways: "--allow-live-gateways",
	migrations.RefusalDataLoss:     "--drop-data",
	migrations.RefusalProtection:   "--remove-protection",
}

// newMigrateDownCmd rolls back the newest applied migration: what an operator needs after
// deploying a release whose migration must be undone before the previous release runs.
// It names the migration and what it would lose, and writes nothing without --apply. It
// refuses while gateways are live, when the step would drop data, or when it would
// remove the default rule or the audit protections, unless the matching flag says so.
func newMigrateDownCmd(a *app) *cobra.Command {
	var (
		write bool
		opts  = migrations.DownOptions{InstanceTTL: store.DefaultInstanceTTL}
	)
	cmd := &cobra.Command{
		Use:   "down [--apply]",
		Short: "Roll back the newest applied migration (prints the plan without --apply; refuses to lose data)",
		Long: `Roll back the newest applied migration, one step.

Without --apply it prints which migration would be rolled back and every reason it is
refused. With --apply it rolls back only when nothing is refused, or each refusal is
overridden by its flag:

  live gateways     a gateway heartbeat within the instance TTL (15 s), not stopped
                    (--allow-live-gateways)
  data loss         the step drops tables or columns that hold rows (--drop-data)
  protection        the step removes the default rule, the audit and history triggers, or
                    the append-only and role protections (--remove-protection)

A refused roll back writes nothing and exits 1.`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				db := stdlib.OpenDBFromPool(st.Pool())
				defer db.Close() // does not close the pool
				plan, err := migrations.PlanDown(ctx, db, opts)
				if errors.Is(err, migrations.ErrNothingApplied) {
					return fmt.Errorf("migrate down: %w", err)
				}
				if err != nil {
					return err
				}
				blocking := plan.Blocking(opts)
				if !write {
					return a.renderDown(cmd, plan, blocking, false, nil)
				}
				if len(blocking) > 0 {
					return downRefused(plan, blocking)
				}
				if _, err := migrations.DownChecked(ctx, db, opts); err != nil {
					if errors.Is(err, migrations.ErrDownRefused) {
						// Something changed since the plan (a gateway started).
						return fmt.Errorf("%w (run without --apply to see the plan)", err)
					}
					return err
				}
				after, err := migrationStatus(ctx, st)
				if err != nil {
					return err
				}
				return a.renderDown(cmd, plan, nil, true, after)
			})
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&write, "apply", false, "roll back (without it: print the plan only)")
	f.BoolVar(&opts.AllowLiveGateways, "allow-live-gateways", false,
		"roll back while gateways run on the schema: a gateway whose next reload needs what the step removes fails it and keeps its old snapshot until migrate up")
	f.BoolVar(&opts.AllowDataLoss, "drop-data", false,
		"roll back a step that drops tables or columns holding rows: those rows are deleted for good, migrate up does not bring them back")
	f.BoolVar(&opts.AllowUnprotected, "remove-protection", false,
		"roll back a step that removes the default rule, the audit triggers or the append-only protections: gateways may fail to reload, and writes go unrecorded or the audit trail can be erased")
	return cmd
}

// downRefused is the error of a refused --apply: every reason with its flag.
func downRefused(plan migrations.DownPlan, blocking []migrations.Refusal) error {
	msg := fmt.Sprintf("migrate down refused: rolling back migration %d (%s)", plan.Version, plan.Name)
	for _, r := range blocking {
		msg += fmt.Sprintf("; %s (override with %s)", r.Detail, downForceFlags[r.Kind])
	}
	return errors.New(msg + "; nothing written")
}

func (a *app) renderDown(cmd *cobra.Command, plan migrations.DownPlan, blocking []migrations.Refusal, applied bool, after []migrations.MigrationStatus) error {
	v := migrateDownJSON{DownPlan: plan, Applied: applied, Blocking: blocking, Status: after}
	if v.Refusals == nil {
		v.Refusals = []migrations.Refusal{}
	}
	if v.Blocking == nil {
		v.Blocking = []migrations.Refusal{}
	}
	return a.render(cmd, v, func(w io.Writer) {
		if applied {
			fmt.Fprintf(w, "rolled back migration %d (%s)\n", plan.Version, plan.Name)
			for _, r := range plan.Refusals {
				fmt.Fprintf(w, "  overridden (%s): %s\n", downForceFlags[r.Kind], r.Detail)
			}
			return
		}
		fmt.Fprintf(w, "would roll back migration %d (%s)\n", plan.Version, plan.Name)
		if len(plan.Refusals) == 0 {
			fmt.Fprintln(w, "nothing is lost: it drops no rows and removes no protection.")
		}
		for _, r := range plan.Refusals {
			state := "refused"
			if !slices.Contains(blocking, r) {
				state = "overridden"
			}
			fmt.Fprintf(w, "  %s (%s): %s\n", state, downForceFlags[r.Kind], r.Detail)
		}
		fmt.Fprintln(w, "Nothing written: run again with --apply.")
	})
}
