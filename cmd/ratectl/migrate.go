package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions/store"
)

func newMigrateCmd(a *app) *cobra.Command {
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration (safe to run from several places at once)",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				before, err := migrationStatus(ctx, st)
				if err != nil {
					return err
				}
				if err := st.Migrate(ctx); err != nil {
					return fmt.Errorf("migrate up: %w", err)
				}
				after, err := migrationStatus(ctx, st)
				if err != nil {
					return err
				}
				applied := 0
				for i := range after {
					if after[i].Applied && !before[i].Applied {
						applied++
					}
				}
				return a.renderMigrations(cmd, after, fmt.Sprintf("applied %d migration(s); the schema is at version %d", applied, migrations.Latest()))
			})
		}),
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "List the migrations and whether each is applied",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				ms, err := migrationStatus(ctx, st)
				if err != nil {
					return err
				}
				pending := 0
				for _, m := range ms {
					if !m.Applied {
						pending++
					}
				}
				note := "the schema is up to date"
				if pending > 0 {
					note = fmt.Sprintf("%d migration(s) pending: run ratectl migrate up", pending)
				}
				return a.renderMigrations(cmd, ms, note)
			})
		}),
	}
	return groupCmd("migrate", "Apply, roll back or show the database migrations", up, newMigrateDownCmd(a), status)
}

func migrationStatus(ctx context.Context, st *store.Store) ([]migrations.MigrationStatus, error) {
	db := stdlib.OpenDBFromPool(st.Pool())
	defer db.Close() // does not close the pool
	ms, err := migrations.Status(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	return ms, nil
}

func (a *app) renderMigrations(cmd *cobra.Command, ms []migrations.MigrationStatus, note string) error {
	if ms == nil {
		ms = []migrations.MigrationStatus{}
	}
	// The JSON is migrations.MigrationStatus's own.
	return a.render(cmd, ms, func(w io.Writer) {
		row(w, "VERSION", "NAME", "APPLIED", "APPLIED AT")
		for _, m := range ms {
			row(w, strconv.FormatInt(m.Version, 10), m.Name, boolCell(m.Applied), timeCell(m.AppliedAt))
		}
		fmt.Fprintf(w, "\n%s\n", note)
	})
}
