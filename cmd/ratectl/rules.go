package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// ruleJSON is one rule in `rules list -o json`: its ids, its bucket as every plan prints
// it (store.RuleValue), and when it last changed. regions.Rule has no JSON of its own:
// store fingerprints its Go field names into a plan's "state".
type ruleJSON struct {
	Tenant string `json:"tenant"`
	Route  string `json:"route"`
	*store.RuleValue
	UpdatedAt time.Time `json:"updated_at"`
}

func toRuleJSON(r regions.Rule) ruleJSON {
	return ruleJSON{Tenant: r.Tenant, Route: r.Route, RuleValue: store.RuleValueOf(r), UpdatedAt: r.UpdatedAt.UTC()}
}

// rulesTable prints rs; a BANDS column only when a rule has bands (NAME=CAPACITY/PER).
func rulesTable(w io.Writer, rs []ruleJSON) {
	banded := false
	for _, r := range rs {
		banded = banded || len(r.Bands) > 0
	}
	if !banded {
		row(w, "TENANT", "ROUTE", "CAPACITY", "REFILL/S", "SHADOW", "SHARDS", "UPDATED")
		for _, r := range rs {
			row(w, r.Tenant, r.Route, strconv.FormatInt(r.Capacity, 10), rateCell(r.RefillPerSecond), boolCell(r.Shadow), strconv.Itoa(r.Shards), timeCell(r.UpdatedAt))
		}
		return
	}
	row(w, "TENANT", "ROUTE", "CAPACITY", "REFILL/S", "SHADOW", "SHARDS", "BANDS", "UPDATED")
	for _, r := range rs {
		row(w, r.Tenant, r.Route, strconv.FormatInt(r.Capacity, 10), rateCell(r.RefillPerSecond), boolCell(r.Shadow), strconv.Itoa(r.Shards),
			bandsCell(r.Bands), timeCell(r.UpdatedAt))
	}
}

func newRulesCmd(a *app) *cobra.Command {
	var lt, lr string
	list := &cobra.Command{
		Use:   "list [--tenant T] [--route R]",
		Short: "List rules (tenant or route * are defaults)",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if lt != "" {
				if err := checkIDOrWildcard("tenant", lt); err != nil {
					return err
				}
			}
			if lr != "" {
				if err := checkIDOrWildcard("route", lr); err != nil {
					return err
				}
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				rs, err := st.Rules(ctx, lt, lr)
				if err != nil {
					return err
				}
				out := []ruleJSON{}
				for _, r := range rs {
					out = append(out, toRuleJSON(r))
				}
				return a.render(cmd, out, func(w io.Writer) { rulesTable(w, out) })
			})
		}),
	}
	list.Flags().StringVar(&lt, "tenant", "", "only this tenant's rules (* for the defaults)")
	list.Flags().StringVar(&lr, "route", "", "only rules of this route (* for tenant-wide rules)")

	var (
		r        regions.Rule
		reason   string
		write    bool
		gwConfig []string
		bandArgs []string
		noBands  bool
	)
	set := &cobra.Command{
		Use:   "set --tenant T --route R --capacity N --refill X [--shadow] [--shards K] [--band NAME=CAPACITY/PER]... [--no-bands]",
		Short: "Create or change a rule (flags not given keep the existing rule's values)",
		Long: `Create or change the token bucket of a tenant for a route. Tenant * or route * make a
default rule. --capacity is the burst (a whole number > 0), --refill the sustained rate in
requests per second (> 0, may be fractional). Changing an existing rule, the flags you do
not give keep their current values (so --shadow is never switched off by accident); a
new rule needs --capacity and --refill.

--band NAME=CAPACITY/PER adds a further token bucket (a band) to the rule, or changes
band NAME: hour=10000/1h holds 10000 tokens refilled over an hour; PER is a duration
(90m, 1h, 30d, 1w); NAME=CAPACITY@REFILL gives the refill per second instead. A request
is admitted only if the rule's own bucket (the band "rate") and every band admit it. At
most 8 bands; a rule with bands has one shard. --band NAME= removes band NAME,
--no-bands removes them all (then --band sets the new ones). Other bands are kept.

--band NAME=AMOUNT/PERIOD[@ZONE] makes band NAME a calendar quota: AMOUNT requests per
calendar hour, day, week (from Monday) or month, reset at each period's start in ZONE
(an IANA time zone; UTC without one): month=1000000/month, day=5000/day@Europe/Berlin.
A word is a quota, a duration a token bucket (day=5000/1d refills smoothly). A quota's
amount is for the whole fleet: each region may use its own usage plus its share of what
is left.

Without --apply it prints the change and writes nothing; a tenant or route * (which reach
every tenant or route at once) and, with --gateway-config, a route id no gateway config
defines get a WARNING line on stderr.`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			if err := checkIDOrWildcard("tenant", r.Tenant); err != nil {
				return err
			}
			if err := checkRuleFlags(f, &r); err != nil {
				return err
			}
			edit, err := parseBandFlags(bandArgs, noBands)
			if err != nil {
				return err
			}
			routes, err := gatewayRoutes(gwConfig)
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				existing, err := st.Rules(ctx, r.Tenant, r.Route)
				if err != nil {
					return err
				}
				nr := r
				var oldBands []regions.Band
				if len(existing) == 1 {
					old := existing[0]
					oldBands = old.Bands
					if !f.Changed("capacity") {
						nr.Capacity = old.Capacity
					}
					if !f.Changed("refill") {
						nr.RefillPerSecond = old.RefillPerSecond
					}
					if !f.Changed("shadow") {
						nr.Shadow = old.Shadow
					}
					if !f.Changed("shards") {
						nr.Shards = old.Shards
					}
				} else if !f.Changed("capacity") || !f.Changed("refill") {
					return usagef("rule %s/%s does not exist yet: a new rule needs --capacity and --refill", r.Tenant, r.Route)
				}
				if nr.Bands, err = editBands(f, edit, oldBands, nr); err != nil {
					return err
				}
				if !write {
					return a.planRule(ctx, cmd, st, nr, routes)
				}
				for _, w := range ruleWarnings([]store.Change{{Action: store.ActionChange, Object: "rule", ID: nr.Tenant + "/" + nr.Route}}, routes) {
					a.loudWarn(w)
				}
				ctx, _, err = a.auditCtx(ctx, reasonOr(reason, cmd))
				if err != nil {
					return err
				}
				if err := st.SetRule(ctx, nr); err != nil {
					return fmt.Errorf("set rule %s/%s: %w", r.Tenant, r.Route, err)
				}
				got, err := st.Rules(ctx, r.Tenant, r.Route)
				if err != nil {
					return err
				}
				out := []ruleJSON{}
				for _, g := range got {
					out = append(out, toRuleJSON(g))
				}
				return a.render(cmd, out, func(w io.Writer) { rulesTable(w, out) })
			})
		}),
	}
	sf := set.Flags()
	sf.StringVar(&r.Tenant, "tenant", "", "tenant id, or * for every tenant (required)")
	sf.StringVar(&r.Route, "route", "", "route id, or * for every route (required)")
	sf.Int64Var(&r.Capacity, "capacity", 0, "burst: the most tokens the bucket holds (> 0)")
	sf.Float64Var(&r.RefillPerSecond, "refill", 0, "sustained rate in requests per second (> 0)")
	sf.BoolVar(&r.Shadow, "shadow", false, "never reject; only count what would be rejected")
	sf.IntVar(&r.Shards, "shards", 1, "split the bucket over this many Redis keys (hot keys), 1..1024")
	sf.StringVar(&reason, "reason", "", "why, for the audit log (default: the command)")
	sf.BoolVar(&write, "apply", false, "write the rule (without it: print the change only)")
	sf.StringSliceVar(&gwConfig, "gateway-config", nil, "gateway config files whose route ids --route must be one of (warn otherwise)")
	addBandFlags(sf, &bandArgs, &noBands)
	_ = set.MarkFlagRequired("tenant")
	_ = set.MarkFlagRequired("route")

	var dt, dr, dreason string
	var dwrite bool
	del := &cobra.Command{
		Use:   "delete --tenant T --route R [--apply]",
		Short: "Delete a rule (the tenant falls back to the next matching rule)",
		Long: `Delete a rule: its tenant (or every tenant, for tenant *) falls back to the next
matching rule. Without --apply it prints the change and writes nothing; deleting a rule of
tenant or route * gets a WARNING line on stderr, since it reaches every tenant or route.`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			// Any id the database may hold: a row written with plain SQL that the
			// gateways skip (a reserved name) must be removable too.
			if err := store.RawID("tenant", dt); err != nil {
				return usageError{err}
			}
			if err := store.RawID("route", dr); err != nil {
				return usageError{err}
			}
			if dt == regions.Wildcard && dr == regions.Wildcard {
				return usagef("the default rule */* cannot be deleted: change it with ratectl rules set")
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				if !dwrite {
					return a.planRuleDelete(ctx, cmd, st, dt, dr)
				}
				for _, w := range deleteWarnings(dt, dr) {
					a.loudWarn(w)
				}
				ctx, _, err := a.auditCtx(ctx, reasonOr(dreason, cmd))
				if err != nil {
					return err
				}
				// The values deleted, for the JSON (none for an id only the database takes).
				before, err := st.Rules(ctx, dt, dr)
				if err != nil && !errors.Is(err, regions.ErrInvalid) {
					return err
				}
				if err := st.DeleteRule(ctx, dt, dr); err != nil {
					if errors.Is(err, store.ErrNotFound) {
						return fmt.Errorf("rule %s/%s does not exist", dt, dr)
					}
					return fmt.Errorf("delete rule %s/%s: %w", dt, dr, err)
				}
				c := store.Change{Action: store.ActionDelete, Object: "rule", ID: dt + "/" + dr}
				if len(before) == 1 {
					c.Old = store.RuleValueOf(before[0])
				}
				p := changePlanJSON{Changes: []store.Change{c}, Warnings: deleteWarnings(dt, dr), Applied: true}
				if p.Warnings == nil {
					p.Warnings = []string{}
				}
				return a.render(cmd, p, func(w io.Writer) { fmt.Fprintf(w, "deleted rule %s/%s\n", dt, dr) })
			})
		}),
	}
	del.Flags().StringVar(&dt, "tenant", "", "tenant id or * (required)")
	del.Flags().StringVar(&dr, "route", "", "route id or * (required)")
	del.Flags().StringVar(&dreason, "reason", "", "why, for the audit log (default: the command)")
	del.Flags().BoolVar(&dwrite, "apply", false, "delete the rule (without it: print the change only)")
	_ = del.MarkFlagRequired("tenant")
	_ = del.MarkFlagRequired("route")

	return groupCmd("rules", "List, set and delete rules", list, set, del)
}
