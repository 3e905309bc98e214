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
				// AddRegion gave the new region a row in every scope with rows (see
				// store.AddRegion): say which, and what it got.
				shares, err := st.Shares(ctx)
				if err != nil {
					return err
				}
				all, err := st.Regions(ctx)
				if err != nil {
					return err
				}
				reb, over := newRegionScopes(shares, name)
				p := changePlanJSON{Changes: []store.Change{{Action: store.ActionAdd, Object: "region", ID: name}}, Warnings: []string{}, Applied: true}
				if len(over) > 0 {
					w := fmt.Sprintf("scopes %s are under an operator override: %s gets 0 of them until you change the override (ratectl shares set) or it expires",
						strings.Join(over, ", "), name)
					a.warnf("%s", w)
					p.Warnings = append(p.Warnings, w)
				}
				return a.render(cmd, p, func(w io.Writer) {
					fmt.Fprintf(w, "added region %s\n", name)
					if len(reb) > 0 {
						fmt.Fprintf(w, "%s starts at the floor (%.3g) of the rebalancer's shares of %s; the other regions keep their proportions of the rest until the rebalancer moves them by demand once its gateways report\n",
							name, store.NewRegionShare(len(all)), strings.Join(reb, ", "))
					}
				})
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
				how := store.RefuseInUse
				if force {
					how = store.DropShares
				}
				err = st.RemoveRegion(ctx, name, how)
				switch {
				case errors.Is(err, store.ErrNotFound):
					return fmt.Errorf("region %s does not exist", name)
				case errors.Is(err, store.ErrRegionInUse):
					return fmt.Errorf("region %s still has shares: set shares without it first, or remove it with --force (which deletes its shares)", name)
				case err != nil:
					return fmt.Errorf("remove region %s: %w", name, err)
				}
				p := changePlanJSON{Changes: []store.Change{{Action: store.ActionDelete, Object: "region", ID: name}}, Warnings: []string{}, Applied: true}
				return a.render(cmd, p, func(w io.Writer) { fmt.Fprintf(w, "removed region %s\n", name) })
			})
		}),
	}
	remove.Flags().BoolVar(&force, "force", false, "also delete the region's shares (each leaves a history row)")
	remove.Flags().StringVar(&removeReason, "reason", "", "why, for the audit log (default: the command)")

	return groupCmd("regions", "List, add and remove regions", list, add, remove)
}

// newRegionScopes lists, sorted, the scopes in which region has a rebalancer row and
// those in which it has an override row.
func newRegionScopes(shares []regions.Share, region string) (rebalanced, overridden []string) {
	for _, s := range shares {
		if s.Region != region {
			continue
		}
		if s.Source == regions.SourceOverride {
			overridden = append(overridden, s.Scope.String())
		} else {
			rebalanced = append(rebalanced, s.Scope.String())
		}
	}
	sort.Strings(rebalanced)
	sort.Strings(overridden)
	return rebalanced, overridden
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
