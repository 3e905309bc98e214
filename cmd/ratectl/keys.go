package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// newKeyJSON is the output of `keys create -o json`: the key as every keys command prints
// it (regions.APIKey's JSON) and its secret, the one time it is shown.
type newKeyJSON struct {
	regions.APIKey
	Key string
}

// MarshalJSON is the key's JSON with "key" added last. It is needed: the embedded
// APIKey's MarshalJSON would otherwise be promoted and drop the secret.
func (k newKeyJSON) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(k.APIKey)
	if err != nil {
		return nil, err
	}
	secret, err := json.Marshal(k.Key)
	if err != nil {
		return nil, err
	}
	b = append(b[:len(b)-1], `,"key":`...) // b is an object: drop its closing brace
	return append(append(b, secret...), '}'), nil
}

func newKeysCmd(a *app) *cobra.Command {
	var tenant, label, reason string
	create := &cobra.Command{
		Use:   "create --tenant T [--label L]",
		Short: "Create an API key for a tenant and print it once (only its hash is stored)",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := checkID("tenant", tenant); err != nil {
				return err
			}
			if len(label) > 200 {
				return usagef("--label: at most 200 characters")
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				ctx, _, err := a.auditCtx(ctx, reasonOr(reason, cmd))
				if err != nil {
					return err
				}
				exists, err := st.TenantExists(ctx, tenant)
				if err != nil {
					return err
				}
				if !exists {
					a.warnf("tenant %s has no rules and no keys yet: creating the key anyway; it gets the default rules until you set its own", tenant)
				}
				secret, k, err := st.CreateKey(ctx, tenant, label)
				if err != nil {
					return fmt.Errorf("create key for tenant %s: %w", tenant, err)
				}
				out := newKeyJSON{APIKey: k, Key: secret}
				return a.render(cmd, out, func(w io.Writer) {
					row(w, "ID", strconv.FormatInt(k.ID, 10))
					row(w, "TENANT", k.Tenant)
					row(w, "LABEL", orDash(k.Label))
					row(w, "CREATED", timeCell(k.CreatedAt))
					row(w, "KEY", secret)
					fmt.Fprintln(w, "\nThe key is shown only now: only its hash is stored.")
				})
			})
		}),
	}
	create.Flags().StringVar(&tenant, "tenant", "", "the tenant the key authenticates (required)")
	create.Flags().StringVar(&label, "label", "", "a note to recognise the key by (at most 200 characters)")
	create.Flags().StringVar(&reason, "reason", "", "why, for the audit log (default: the command)")
	_ = create.MarkFlagRequired("tenant")

	var listTenant string
	list := &cobra.Command{
		Use:   "list [--tenant T]",
		Short: "List API keys (never their secrets), revoked ones included",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if listTenant != "" {
				if err := checkID("tenant", listTenant); err != nil {
					return err
				}
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				ks, err := st.Keys(ctx, listTenant)
				if err != nil {
					return err
				}
				if ks == nil {
					ks = []regions.APIKey{}
				}
				return a.render(cmd, ks, func(w io.Writer) {
					row(w, "ID", "TENANT", "LABEL", "CREATED", "REVOKED")
					for _, k := range ks {
						row(w, strconv.FormatInt(k.ID, 10), k.Tenant, orDash(k.Label), timeCell(k.CreatedAt), timeCell(k.RevokedAt))
					}
				})
			})
		}),
	}
	list.Flags().StringVar(&listTenant, "tenant", "", "only this tenant's keys")

	var revokeReason string
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key; gateways refuse it within a second",
		Args:  exactArgs(1, "a key ID (see ratectl keys list)"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return usagef("key id %q: must be a whole number > 0 (see ratectl keys list)", args[0])
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				ctx, _, err := a.auditCtx(ctx, reasonOr(revokeReason, cmd))
				if err != nil {
					return err
				}
				if err := st.RevokeKey(ctx, id); err != nil {
					if errors.Is(err, store.ErrNotFound) {
						return fmt.Errorf("key %d does not exist", id)
					}
					return fmt.Errorf("revoke key %d: %w", id, err)
				}
				ks, err := st.Keys(ctx, "")
				if err != nil {
					return err
				}
				for _, k := range ks {
					if k.ID == id {
						return a.render(cmd, k, func(w io.Writer) { fmt.Fprintf(w, "revoked key %d\n", id) })
					}
				}
				return fmt.Errorf("revoke key %d: revoked, but not found afterwards", id)
			})
		}),
	}
	revoke.Flags().StringVar(&revokeReason, "reason", "", "why, for the audit log (default: the command)")

	return groupCmd("keys", "Create, import, list and revoke API keys", create, newKeysImportCmd(a), list, revoke)
}
