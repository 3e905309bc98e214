package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// scopeFlags are --tenant and --route of the share commands.
type scopeFlags struct{ tenant, route string }

func (f *scopeFlags) add(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&f.tenant, "tenant", "", what+" of one tenant instead of the region-wide default \"*\"")
	cmd.Flags().StringVar(&f.route, "route", "", "with --tenant: of that tenant's rule for one route")
}

// scope is the share scope the flags name.
func (f *scopeFlags) scope() (regions.Scope, error) {
	switch {
	case f.tenant == "" && f.route != "":
		return regions.Scope{}, usagef("--route needs --tenant")
	case f.tenant == "" || f.tenant == regions.Wildcard:
		if f.route != "" {
			return regions.Scope{}, usagef("--route needs a tenant other than *")
		}
		return regions.GlobalScope, nil
	}
	if err := checkID("tenant", f.tenant); err != nil {
		return regions.Scope{}, err
	}
	if f.route == "" || f.route == regions.Wildcard {
		return regions.Scope{Tenant: f.tenant, Route: regions.Wildcard}, nil
	}
	if err := checkID("route", f.route); err != nil {
		return regions.Scope{}, err
	}
	return regions.Scope{Tenant: f.tenant, Route: f.route}, nil
}

func newSharesCmd(a *app) *cobra.Command {
	return groupCmd("shares", "Show, override and explain the regions' shares of every limit",
		newSharesGetCmd(a), newSharesSetCmd(a), newSharesClearCmd(a), newSharesHistoryCmd(a))
}

// sharesJSON is the JSON of `shares get`.
type sharesJSON struct {
	Scope  string           `json:"scope"`
	Shares []shareEntryJSON `json:"shares"`
	Limits []limitRow       `json:"limits"`
}

// shareEntryJSON is one region's effective share of the scope.
type shareEntryJSON struct {
	Region string  `json:"region"`
	Share  float64 `json:"share"`
	// Source is override, rebalancer or default (an equal split).
	Source string `json:"source"`
	// FromScope is the scope whose row supplies the share ("" for the default).
	FromScope string     `json:"from_scope"`
	ExpiresAt *time.Time `json:"expires_at"`
}

func newSharesGetCmd(a *app) *cobra.Command {
	var sf scopeFlags
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Effective share per region, its source and expiry, and the regional limits of the tenant's rules",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			scope, err := sf.scope()
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				v, err := a.loadView(ctx, st, scope.Tenant)
				if err != nil {
					return err
				}
				out := sharesJSON{Scope: scope.String(), Shares: scopeShares(v, scope), Limits: filterRoute(v.limits(), scope)}
				return a.render(cmd, out, func(w io.Writer) {
					fmt.Fprintf(w, "# shares of scope %s\n", scope)
					row(w, "REGION", "SHARE", "SOURCE", "FROM SCOPE", "EXPIRES")
					for _, s := range out.Shares {
						row(w, s.Region, shareCell(s.Share), s.Source, orDash(s.FromScope), timeCell(deref(s.ExpiresAt)))
					}
					fmt.Fprintf(w, "\n# regional limits of %s\n", rulesOf(scope))
					limitsTable(w, out.Limits)
				})
			})
		}),
	}
	sf.add(cmd, "shares")
	return cmd
}

func rulesOf(scope regions.Scope) string {
	switch {
	case scope.Tenant == regions.Wildcard:
		return "the default rules (tenant *)"
	case scope.Route == regions.Wildcard:
		return "tenant " + scope.Tenant + "'s rules"
	default:
		return "tenant " + scope.Tenant + "'s rule for route " + scope.Route
	}
}

// scopeShares is every region's effective share of scope.
func scopeShares(v *view, scope regions.Scope) []shareEntryJSON {
	out := []shareEntryJSON{}
	for _, r := range v.regions {
		e := v.effective(r, scope.Tenant, scope.Route)
		out = append(out, shareEntryJSON{Region: r, Share: e.share, Source: string(e.source), FromScope: e.scope, ExpiresAt: jsonTime(e.expiresAt)})
	}
	return out
}

// filterRoute keeps the limits of scope's route when the scope is one rule.
func filterRoute(ls []limitRow, scope regions.Scope) []limitRow {
	if scope.Route == regions.Wildcard {
		return ls
	}
	out := []limitRow{}
	for _, l := range ls {
		if l.Route == scope.Route {
			out = append(out, l)
		}
	}
	return out
}

func limitsTable(w io.Writer, ls []limitRow) {
	row(w, "ROUTE", "RULE", "CAPACITY", "REFILL/S", "REGION", "SHARE", "SOURCE", "REGIONAL CAPACITY", "REGIONAL REFILL/S")
	for _, l := range ls {
		rule := l.RuleTenant + "/" + l.RuleRoute
		if l.RulePlan != "" {
			rule = "plan " + l.RulePlan + "/" + l.RuleRoute
		}
		row(w, l.Route, rule, strconv.FormatInt(l.Capacity, 10), rateCell(l.RefillPerSecond),
			l.Region, shareCell(l.Share), l.Source, strconv.FormatInt(l.RegionalCapacity, 10), rateCell(l.RegionalRefillPerSec))
	}
}

// planJSON is the JSON of `shares set`: the plan, and whether it was applied.
type planJSON struct {
	Scope   string `json:"scope"`
	Applied bool   `json:"applied"`
	Actor   string `json:"actor"`
	Reason  string `json:"reason"`
	// TTLSeconds is how long the override lasts; 0 means it never expires.
	TTLSeconds float64         `json:"ttl_seconds"`
	Shares     []planShareJSON `json:"shares"`
	Limits     []planLimitJSON `json:"limits"`
}

// planShareJSON is one region's share of the scope before and after.
type planShareJSON struct {
	Region    string  `json:"region"`
	Old       float64 `json:"old"`
	OldSource string  `json:"old_source"`
	New       float64 `json:"new"`
}

// planLimitJSON is one rule's regional limit before and after.
type planLimitJSON struct {
	Route                 string  `json:"route"`
	Region                string  `json:"region"`
	CapacityBefore        int64   `json:"capacity_before"`
	CapacityAfter         int64   `json:"capacity_after"`
	RefillPerSecondBefore float64 `json:"refill_per_second_before"`
	RefillPerSecondAfter  float64 `json:"refill_per_second_after"`
}

func newSharesSetCmd(a *app) *cobra.Command {
	var (
		sf     scopeFlags
		reason string
		ttl    time.Duration
		apply  bool
	)
	cmd := &cobra.Command{
		Use:   "set REGION=SHARE... --reason TEXT [--ttl 2h] [--apply]",
		Short: "Override the shares of a scope (prints the plan; writes only with --apply)",
		Long: `Override the regions' shares of a scope: the region-wide default "*", one tenant
(--tenant), or one tenant's rule for one route (--tenant and --route). Name every region
once, as REGION=SHARE (separate arguments or comma-separated); shares are in (0, 1] and
sum to 1 within 1e-6. An override beats the rebalancer until it expires (--ttl; 0 never).

Without --apply it only prints the plan: the old and new shares and the regional limits
before and after, and writes nothing. With --apply it writes the override in one
transaction, recorded in the share history with your OS user and --reason.`,
		Example: `  ratectl shares set --tenant shop-a us-east=0.8 eu-west=0.2 --reason "eu-west incident" --ttl 2h
  ratectl shares set us-east=0.5,eu-west=0.5 --reason "reset after incident" --apply`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s needs REGION=SHARE for every region, for example us-east=0.7 eu-west=0.3", cmd.CommandPath())
			}
			return nil
		},
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			scope, err := sf.scope()
			if err != nil {
				return err
			}
			shares, err := parseShares(args)
			if err != nil {
				return err
			}
			if strings.TrimSpace(reason) == "" {
				return usagef("--reason is required: say why, for the share history")
			}
			if ttl < 0 {
				return usagef("--ttl %v: must be >= 0 (0 = never expires)", ttl)
			}
			actor, err := a.actor()
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				v, err := a.loadView(ctx, st, scope.Tenant)
				if err != nil {
					return err
				}
				if len(v.regions) == 0 {
					return usagef("there are no regions: add them first (ratectl regions add NAME)")
				}
				if err := regions.ValidateShares(shares, v.regions); err != nil {
					return usageError{err}
				}
				if scope.Tenant != regions.Wildcard {
					ok, err := st.TenantExists(ctx, scope.Tenant)
					if err != nil {
						return err
					}
					if !ok {
						a.warnf("tenant %s has no rules and no keys", scope.Tenant)
					}
				}
				var expires time.Time
				if ttl > 0 {
					expires = v.now.Add(ttl)
				}
				after, err := v.withOverride(scope, shares, expires)
				if err != nil {
					return err
				}
				plan := makePlan(v, after, scope, shares)
				plan.Actor, plan.Reason, plan.TTLSeconds = actor, reason, ttl.Seconds()
				if apply {
					if err := st.SetOverride(ctx, scope, shares, actor, reason, ttl); err != nil {
						return fmt.Errorf("write override of %s: %w", scope, err)
					}
					plan.Applied = true
				}
				return a.render(cmd, plan, func(w io.Writer) { planTable(w, plan, ttl) })
			})
		}),
	}
	sf.add(cmd, "override the shares")
	f := cmd.Flags()
	f.StringVar(&reason, "reason", "", "why (required; recorded in the share history)")
	f.Var((*durationValue)(&ttl), "ttl", "the override expires after this long: 2h, 90m, 1d, 1w (0: never)")
	f.BoolVar(&apply, "apply", false, "write the override (without it, only print the plan)")
	return cmd
}

func makePlan(before, after *view, scope regions.Scope, shares map[string]float64) planJSON {
	p := planJSON{Scope: scope.String(), Shares: []planShareJSON{}, Limits: []planLimitJSON{}}
	for _, r := range before.regions {
		e := before.effective(r, scope.Tenant, scope.Route)
		p.Shares = append(p.Shares, planShareJSON{Region: r, Old: e.share, OldSource: string(e.source), New: shares[r]})
	}
	lb, la := filterRoute(before.limits(), scope), filterRoute(after.limits(), scope)
	for i := range lb {
		p.Limits = append(p.Limits, planLimitJSON{
			Route: lb[i].Route, Region: lb[i].Region,
			CapacityBefore: lb[i].RegionalCapacity, CapacityAfter: la[i].RegionalCapacity,
			RefillPerSecondBefore: lb[i].RegionalRefillPerSec, RefillPerSecondAfter: la[i].RegionalRefillPerSec,
		})
	}
	return p
}

func planTable(w io.Writer, p planJSON, ttl time.Duration) {
	expiry := "never expires"
	if ttl > 0 {
		expiry = "expires after " + ttl.String()
	}
	fmt.Fprintf(w, "# override of scope %s by %s, %s, reason %q\n", p.Scope, p.Actor, expiry, p.Reason)
	row(w, "REGION", "OLD", "OLD SOURCE", "NEW")
	for _, s := range p.Shares {
		row(w, s.Region, shareCell(s.Old), s.OldSource, shareCell(s.New))
	}
	fmt.Fprintf(w, "\n# regional limits\n")
	row(w, "ROUTE", "REGION", "CAPACITY BEFORE", "CAPACITY AFTER", "REFILL/S BEFORE", "REFILL/S AFTER")
	for _, l := range p.Limits {
		row(w, l.Route, l.Region, strconv.FormatInt(l.CapacityBefore, 10), strconv.FormatInt(l.CapacityAfter, 10),
			rateCell(l.RefillPerSecondBefore), rateCell(l.RefillPerSecondAfter))
	}
	if p.Applied {
		fmt.Fprintf(w, "\napplied: gateways pick the override up within a second\n")
	} else {
		fmt.Fprintf(w, "\nplan only, nothing written: run again with --apply to write it\n")
	}
}

func newSharesClearCmd(a *app) *cobra.Command {
	var (
		sf       scopeFlags
		reason   string
		rawScope string
	)
	cmd := &cobra.Command{
		Use:   "clear --reason TEXT",
		Short: "Remove the operator override of a scope (the rebalancer's shares or the equal split apply again)",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if rawScope != "" {
				if sf.tenant != "" || sf.route != "" {
					return usagef("--raw-scope replaces --tenant and --route")
				}
				return clearRawScope(cmd, a, rawScope, reason)
			}
			scope, err := sf.scope()
			if err != nil {
				return err
			}
			if strings.TrimSpace(reason) == "" {
				return usagef("--reason is required: say why, for the share history")
			}
			actor, err := a.actor()
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				v, err := a.loadView(ctx, st, scope.Tenant)
				if err != nil {
					return err
				}
				had := false
				for _, s := range v.shares {
					had = had || (s.Scope == scope && s.Source == regions.SourceOverride)
				}
				if !had {
					return fmt.Errorf("scope %s has no override: nothing to clear", scope)
				}
				if err := st.ClearOverride(ctx, scope, actor, reason); err != nil {
					return fmt.Errorf("clear override of %s: %w", scope, err)
				}
				after, err := v.withOverride(scope, nil, time.Time{})
				if err != nil {
					return err
				}
				out := sharesJSON{Scope: scope.String(), Shares: scopeShares(after, scope), Limits: filterRoute(after.limits(), scope)}
				return a.render(cmd, out, func(w io.Writer) {
					fmt.Fprintf(w, "cleared the override of scope %s; its shares now:\n", scope)
					row(w, "REGION", "SHARE", "SOURCE", "FROM SCOPE", "EXPIRES")
					for _, s := range out.Shares {
						row(w, s.Region, shareCell(s.Share), s.Source, orDash(s.FromScope), timeCell(deref(s.ExpiresAt)))
					}
				})
			})
		}),
	}
	sf.add(cmd, "clear the override")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; recorded in the share history)")
	cmd.Flags().StringVar(&rawScope, "raw-scope", "", "delete every share row (override and rebalancer) of this exact scope as stored, valid or not (e.g. one gateways skip as invalid)")
	return cmd
}

// rawScopeClearJSON is the output of `shares clear --raw-scope S -o json`.
type rawScopeClearJSON struct {
	Scope       string `json:"scope"`
	DeletedRows int64  `json:"deleted_rows"`
}

// clearRawScope deletes every row of a scope written exactly as raw.
func clearRawScope(cmd *cobra.Command, a *app, raw, reason string) error {
	if strings.TrimSpace(reason) == "" {
		return usagef("--reason is required: say why, for the share history")
	}
	actor, err := a.actor()
	if err != nil {
		return err
	}
	return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
		n, err := st.DeleteScopeShares(ctx, raw, actor, reason)
		if err != nil {
			if errors.Is(err, regions.ErrInvalid) {
				return usageError{err}
			}
			return err
		}
		if n == 0 {
			return fmt.Errorf("scope %q has no share rows: nothing to delete", raw)
		}
		out := rawScopeClearJSON{Scope: raw, DeletedRows: n}
		return a.render(cmd, out, func(w io.Writer) {
			fmt.Fprintf(w, "deleted %d share row(s) of scope %q\n", n, raw)
		})
	})
}

func newSharesHistoryCmd(a *app) *cobra.Command {
	var (
		tenant string
		since  time.Duration
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "history",
		Short: "Every share change: when, by whom (rebalancer or an operator), why, and the demand behind it",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			f := store.HistoryFilter{Limit: limit}
			if tenant != "" && tenant != regions.Wildcard {
				if err := checkID("tenant", tenant); err != nil {
					return err
				}
				f.Tenant = tenant
			} else if tenant == regions.Wildcard {
				f.Scope = &regions.GlobalScope
			}
			if since < 0 {
				return usagef("--since %v: must be >= 0 (0: all)", since)
			}
			if limit <= 0 {
				return usagef("--limit %d: must be > 0", limit)
			}
			if since > 0 {
				f.Since = a.now().Add(-since)
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				es, err := st.History(ctx, f)
				if err != nil {
					return err
				}
				if es == nil {
					es = []store.HistoryEntry{}
				}
				// The JSON is store.HistoryEntry's own.
				return a.render(cmd, es, func(w io.Writer) {
					row(w, "AT", "SCOPE", "REGION", "SOURCE", "OLD", "NEW", "EXPIRES", "ACTOR", "REASON", "DEMAND")
					for _, e := range es {
						row(w, timeCell(e.At), e.Scope.String(), e.Region, string(e.Source), optShare(e.Old), optShare(e.New),
							timeCell(e.ExpiresAt), e.Actor, orDash(e.Reason), demandCell(e.Inputs, e.Region))
					}
				})
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "only the tenant's scopes (TENANT and TENANT/ROUTE); * for the default scope")
	since = 24 * time.Hour
	f.Var((*durationValue)(&since), "since", "only changes this recent: 7d, 2w, 36h (0: all)")
	f.IntVar(&limit, "limit", 100, "at most this many changes, newest first")
	return cmd
}

// demandCell summarises the rebalancer's inputs for one region of a change: its status,
// offered demand and throttled rate, and the scope's reason. It reads the JSON by field
// name, so it does not depend on the rebalancer's Go types.
func demandCell(raw json.RawMessage, region string) string {
	if len(raw) == 0 || string(raw) == "null" {
		return "-"
	}
	var in struct {
		Reason  string `json:"reason"`
		Regions []struct {
			Region    string  `json:"region"`
			Status    string  `json:"status"`
			Offered   float64 `json:"offered_long_rps"`
			Throttled float64 `json:"throttled_rps"`
		} `json:"regions"`
	}
	if err := json.Unmarshal(raw, &in); err != nil || len(in.Regions) == 0 {
		return compactJSON(raw)
	}
	for _, r := range in.Regions {
		if r.Region == region {
			return fmt.Sprintf("%s: offered %s/s, throttled %s/s (%s)", region, rateCell(r.Offered), rateCell(r.Throttled), orDash(r.Status))
		}
	}
	return compactJSON(raw)
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "(unreadable inputs)"
	}
	return b.String()
}
