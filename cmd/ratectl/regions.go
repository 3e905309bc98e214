package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// regionJSON is one region in `regions list -o json`.
type regionJSON struct {
	Region string `json:"region"`
	// Share is the region's effective share of the default scope "*".
	Share  float64 `json:"share"`
	Source string  `json:"source"`
	// ExpiresAt is when that share (an override) expires; null when it does not.
	ExpiresAt *time.Time `json:"expires_at"`
	// LiveGateways counts the region's gateways with a heartbeat in the last 30 s.
	LiveGateways int `json:"live_gateways"`
}

func newRegionsCmd(a *app) *cobra.Command {
	list := &cobra.Command{
		Use:   "list",
		Short: "List the regions, their default share and their live gateways",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				v, err := a.loadView(ctx, st, regions.Wildcard)
				if err != nil {
					return err
				}
				out := []regionJSON{}
				for _, r := range v.regions {
					e := v.effective(r, regions.Wildcard, regions.Wildcard)
					out = append(out, regionJSON{Region: r, Share: e.share, Source: string(e.source), ExpiresAt: jsonTime(e.expiresAt), LiveGateways: v.snap.LiveInstances(r)})
				}
				return a.render(cmd, out, func(w io.Writer) {
					row(w, "REGION", "SHARE", "SOURCE", "EXPIRES", "LIVE GATEWAYS")
					for _, r := range out {
						row(w, r.Region, shareCell(r.Share), r.Source, timeCell(deref(r.ExpiresAt)), strconv.Itoa(r.LiveGateways))
					}
				})
			})
		}),
	}

	var addReason string
	add := &cobra.Command{
		Use:   "add NAME",
		Short: "Add a region",
		Args:  exactArgs(1, "a region NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := checkID("region", name); err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				ctx, _, err := a.auditCtx(ctx, reasonOr(addReason, cmd))
				if err != nil {
					return err
				}
				if err := st.AddRegion(ctx, name); err != nil {
					if errors.Is(err, store.ErrExists) {
						return fmt.Errorf("region %s already exists", name)
					}
					return fmt.Errorf("add region %s: %w", name, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "added region %s\n", name)
				// Scopes with stored shares do not name the new region: it gets an equal split
				// there while the others keep theirs, so the scope's shares sum above 1.
				shares, err := st.Shares(ctx)
				if err != nil {
					return err
				}
				all, err := st.Regions(ctx)
				if err != nil {
					return err
				}
				if scopes := scopesWithShares(shares, a.now()); len(scopes) > 0 {
					a.warnf("scopes %s have shares that do not name %s: it gets an equal split (1/%d) of them on top of the other regions' shares until you run ratectl shares set (or the rebalancer runs)",
						strings.Join(scopes, ", "), name, len(all))
				}
				return nil
			})
		}),
	}
	add.Flags().StringVar(&addReason, "reason", "", "why, for the audit log (default: the command)")

	var force bool
	var removeReason string
	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a region (refused while it has shares, unless --force)",
		Args:  exactArgs(1, "a region NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := checkID("region", name); err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				ctx, _, err := a.auditCtx(ctx, reasonOr(removeReason, cmd))
				if err != nil {
					return err
				}
				err = st.RemoveRegion(ctx, name, force)
				switch {
				case errors.Is(err, store.ErrNotFound):
					return fmt.Errorf("region %s does not exist", name)
				case errors.Is(err, store.ErrRegionInUse):
					return fmt.Errorf("region %s still has shares: set shares without it first, or remove it with --force (which deletes its shares)", name)
				case err != nil:
					return fmt.Errorf("remove region %s: %w", name, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed region %s\n", name)
				return nil
			})
		}),
	}
	remove.Flags().BoolVar(&force, "force", false, "also delete the region's shares (each leaves a history row)")
	remove.Flags().StringVar(&removeReason, "reason", "", "why, for the audit log (default: the command)")

	return groupCmd("regions", "List, add and remove regions", list, add, remove)
}

// scopesWithShares lists the scopes that have active stored shares, sorted.
func scopesWithShares(shares []regions.Share, now time.Time) []string {
	set := map[string]bool{}
	for _, s := range shares {
		if s.Active(now) {
			set[s.Scope.String()] = true
		}
	}
	out := sortedKeys(set)
	sort.Strings(out)
	return out
}

// reasonOr is the --reason given, else the command line's name.
func reasonOr(reason string, cmd *cobra.Command) string {
	if reason != "" {
		return reason
	}
	return cmd.CommandPath()
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
