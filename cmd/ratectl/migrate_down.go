package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions/store"
)

// newMigrateDownCmd rolls back the newest applied migration: what an operator needs after
// deploying a release whose migration must be undone before the previous release runs.
// It names the migration and writes nothing without --apply: rolling back may drop data.
func newMigrateDownCmd(a *app) *cobra.Command {
	var write bool
	cmd := &cobra.Command{
		Use:   "down [--apply]",
		Short: "Roll back the newest applied migration (prints which without --apply; may drop data)",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				ms, err := migrationStatus(ctx, st)
				if err != nil {
					return err
				}
				var last *migrations.MigrationStatus
				for i := range ms {
					if ms[i].Applied {
						last = &ms[i]
					}
				}
				if last == nil {
					return fmt.Errorf("migrate down: no migration is applied")
				}
				if !write {
					fmt.Fprintf(cmd.OutOrStdout(), "would roll back migration %d (%s); it may drop tables and data.\nNothing written: run again with --apply.\n", last.Version, last.Name)
					return nil
				}
				db := stdlib.OpenDBFromPool(st.Pool())
				defer db.Close() // does not close the pool
				if err := migrations.Down(ctx, db); err != nil {
					return err
				}
				after, err := migrationStatus(ctx, st)
				if err != nil {
					return err
				}
				return a.renderMigrations(cmd, after, fmt.Sprintf("rolled back migration %d (%s)", last.Version, last.Name))
			})
		}),
	}
	cmd.Flags().BoolVar(&write, "apply", false, "roll back (without it: name the migration only)")
	return cmd
}
