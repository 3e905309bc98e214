package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions/store"
)

// newKeysImportCmd stores a key made elsewhere, by the SHA-256 of its secret: the secret
// never reaches ratectl or the database, so keys can live in a secrets manager and their
// hashes in git (the keys: section of a limits file).
func newKeysImportCmd(a *app) *cobra.Command {
	var sum, tenant, label, reason string
	cmd := &cobra.Command{
		Use:   "import --sha256 HEX --tenant T [--label L]",
		Short: "Store an API key made elsewhere, by the SHA-256 of its secret (printf %s \"$KEY\" | sha256sum)",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := checkID("tenant", tenant); err != nil {
				return err
			}
			h, err := parseSHA256(sum)
			if err != nil {
				return usagef("--%v", err)
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				ctx, _, err := a.auditCtx(ctx, reasonOr(reason, cmd))
				if err != nil {
					return err
				}
				k, err := st.ImportKey(ctx, h, tenant, label)
				if errors.Is(err, store.ErrExists) {
					return fmt.Errorf("a key with sha256 %s is stored already (possibly revoked: a revoked key cannot come back)", truncate(sum, 16))
				}
				if err != nil {
					return err
				}
				return a.render(cmd, k, func(w io.Writer) {
					row(w, "ID", strconv.FormatInt(k.ID, 10))
					row(w, "TENANT", k.Tenant)
					row(w, "LABEL", orDash(k.Label))
					row(w, "CREATED", timeCell(k.CreatedAt))
				})
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&sum, "sha256", "", "hex SHA-256 of the key's secret (required)")
	f.StringVar(&tenant, "tenant", "", "the tenant the key belongs to (required)")
	f.StringVar(&label, "label", "", "a note for operators (at most 200 characters)")
	f.StringVar(&reason, "reason", "", "why, for the audit log (default: the command)")
	_ = cmd.MarkFlagRequired("sha256")
	_ = cmd.MarkFlagRequired("tenant")
	return cmd
}
