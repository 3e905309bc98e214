package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// readLimits reads and parses FILE ("-": stdin) strictly (store.ParseLimits).
func (a *app) readLimits(cmd *cobra.Command, path string) (cfg store.Config, err error) {
	ctx, cancel := context.WithTimeout(cmd.Context(), limitsDeadline)
	defer cancel()
	data, err := readLimitsBytes(ctx, cmd.InOrStdin(), path)
	if ctx.Err() != nil {
		return store.Config{}, fmt.Errorf("read %s: %w", path, err)
	}
	if err != nil {
		return store.Config{}, usagef("read %s: %v", path, errors.Unwrap(err))
	}
	cfg, err = store.ParseLimits(ctx, data)
	if ctx.Err() != nil {
		return store.Config{}, fmt.Errorf("read %s: %w", path, err)
	}
	if err != nil {
		return store.Config{}, usagef("%s: %v", path, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return cfg, nil
}

// parseSHA256 is store.ParseKeyHash, for keys import --sha256.
func parseSHA256(s string) (regions.KeyHash, error) { return store.ParseKeyHash(s) }

// truncate is s cut to n bytes, "..." marking a cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// changePlanJSON is the output of apply, diff and the rules commands with -o json.
type changePlanJSON struct {
	Changes  []store.Change `json:"changes"`
	Warnings []string       `json:"warnings"`
	Applied  bool           `json:"applied"`
	// State fingerprints the database sections the plan was made against (a plan of
	// apply or diff): apply --plan writes only while they are unchanged.
	State string `json:"state,omitempty"`
}

// savedPlan is what apply --plan reads of a plan saved with -o json.
type savedPlan struct {
	Changes []json.RawMessage `json:"changes"`
	Applied bool              `json:"applied"`
	State   string            `json:"state"`
}

// readSavedPlan reads a plan printed by diff -o json or apply -o json.
func readSavedPlan(path string) (savedPlan, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return savedPlan{}, usagef("--plan: read %s: %v", path, errors.Unwrap(err))
	}
	var p savedPlan
	if err := json.Unmarshal(b, &p); err != nil {
		return savedPlan{}, usagef("--plan %s: not a plan printed by ratectl diff -o json: %v", path, err)
	}
	if p.Applied || p.State == "" {
		return savedPlan{}, usagef("--plan %s: not a plan printed by ratectl diff -o json (applied, or no state)", path)
	}
	return p, nil
}

// samePlan is whether changes are the saved plan's, change for change.
func samePlan(saved []json.RawMessage, changes []store.Change) bool {
	if len(saved) != len(changes) {
		return false
	}
	for i, c := range changes {
		got, err := json.Marshal(c)
		var want bytes.Buffer
		if err != nil || json.Compact(&want, saved[i]) != nil || !bytes.Equal(got, want.Bytes()) {
			return false
		}
	}
	return true
}

// renderPlan prints the changes, the warnings and whether anything was written.
func (a *app) renderPlan(cmd *cobra.Command, p changePlanJSON) error {
	if p.Changes == nil {
		p.Changes = []store.Change{}
	}
	if p.Warnings == nil {
		p.Warnings = []string{}
	}
	for _, w := range p.Warnings {
		a.loudWarn(w)
	}
	return a.render(cmd, p, func(w io.Writer) {
		adds, changes, dels := 0, 0, 0
		for _, c := range p.Changes {
			switch c.Action {
			case store.ActionAdd:
				adds++
				fmt.Fprintf(w, "+ %s %s%s\n", c.Object, c.ID, colonDesc(c.New))
			case store.ActionChange:
				changes++
				fmt.Fprintf(w, "~ %s %s: %s -> %s\n", c.Object, c.ID, valueText(c.Old), valueText(c.New))
			case store.ActionDelete:
				dels++
				if c.New != nil {
					fmt.Fprintf(w, "- %s %s: %s -> %s\n", c.Object, c.ID, valueText(c.Old), valueText(c.New))
				} else {
					fmt.Fprintf(w, "- %s %s%s\n", c.Object, c.ID, colonDesc(c.Old))
				}
			}
		}
		switch {
		case len(p.Changes) == 0:
			fmt.Fprintln(w, "No changes: the database matches.")
		case p.Applied:
			fmt.Fprintf(w, "Applied %d change(s): %d added, %d changed, %d deleted.\n", len(p.Changes), adds, changes, dels)
		default:
			fmt.Fprintf(w, "Plan: %d to add, %d to change, %d to delete.\nNothing written: run again with --apply to write these changes.\n", adds, changes, dels)
		}
	})
}

// loudWarn prints a warning that must not be missed.
func (a *app) loudWarn(msg string) {
	fmt.Fprintf(a.stderr, "ratectl: WARNING: %s\n", msg)
}

// ruleWarnings are the warnings for rules the plan adds or changes: wildcard scopes, which
// reach every tenant or route at once, and route ids no given gateway config defines.
func ruleWarnings(changes []store.Change, routes map[string]bool) []string {
	var out []string
	for _, c := range changes {
		if c.Object != "rule" || c.Action == store.ActionDelete {
			continue
		}
		tenant, route, _ := strings.Cut(c.ID, "/")
		switch {
		case tenant == regions.Wildcard && route == regions.Wildcard:
			out = append(out, fmt.Sprintf("rule %s is the default of EVERY tenant and route without a rule of its own", c.ID))
		case tenant == regions.Wildcard:
			out = append(out, fmt.Sprintf("rule %s applies to EVERY tenant on route %s", c.ID, route))
		case route == regions.Wildcard:
			out = append(out, fmt.Sprintf("rule %s applies to EVERY route of tenant %s", c.ID, tenant))
		}
		if routes != nil && route != regions.Wildcard && !routes[route] {
			out = append(out, fmt.Sprintf("rule %s: no gateway config given defines route %q (a typo? known: %s)", c.ID, route, strings.Join(sortedKeys(routes), ", ")))
		}
	}
	return out
}

// planLossWarnings warn of a plan the file lists without some of its rules while tenants
// are on it: the rules are deleted, which reaches every tenant of the plan at once.
func planLossWarnings(ctx context.Context, st *store.Store, changes []store.Change) ([]string, error) {
	lost := map[string][]string{}
	var plans []string
	for _, c := range changes {
		if c.Object != "plan_rule" || c.Action != store.ActionDelete {
			continue
		}
		plan, route, _ := strings.Cut(c.ID, "/")
		if lost[plan] == nil {
			plans = append(plans, plan)
		}
		lost[plan] = append(lost[plan], route)
	}
	var out []string
	for _, plan := range plans {
		n, err := st.PlanTenants(ctx, plan)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			continue
		}
		noun := "route"
		if len(lost[plan]) > 1 {
			noun = "routes"
		}
		out = append(out, fmt.Sprintf("plan %s: the file does not list its rules for %s %s: they are deleted, which changes the limit of EVERY tenant of the plan without a rule of its own (%d tenants)",
			plan, noun, strings.Join(lost[plan], ", "), n))
	}
	return out, nil
}

// applyWarnings are the warnings of a plan of apply or diff: ruleWarnings and
// planLossWarnings.
func applyWarnings(ctx context.Context, st *store.Store, changes []store.Change, routes map[string]bool) ([]string, error) {
	lost, err := planLossWarnings(ctx, st, changes)
	if err != nil {
		return nil, err
	}
	return append(ruleWarnings(changes, routes), lost...), nil
}

func newApplyCmd(a *app) *cobra.Command {
	var (
		file        string
		write       bool
		onlyMissing bool
		reason      string
		gwConfig    []string
		planFile    string
		prune       []string
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE [--prune KINDS] [--plan PLAN.json] [--apply]",
		Short: "Make the database match a limits file (regions, rules, overrides, key hashes): a plan by default",
		Long: `Make the database match a limits file, such as one kept in git. Without --apply it only
prints the plan; with --apply it writes every change in one transaction (the plan is
recomputed inside it), one audit entry per change, actor from --actor and reason from
--reason.

A section left out of the file (regions, rules, overrides, keys) is not touched; a section
present adds what it lists and changes what differs, and deletes nothing unless --prune
names it: --prune rules,keys deletes the rules the file does not list and revokes its
unlisted keys (--prune all: every section present). An empty section never prunes.
ratectl export prints a file this command takes back. See docs/ratectl.md.

With --plan PLAN.json (the output of diff -f FILE -o json, reviewed) it writes only that
plan: it refuses, writing nothing, when the file's plan is no longer the saved one or the
database sections the file manages changed since it was made (checked again under the
lock).

With --only-missing it only adds the file's regions and rules that the database lacks,
and changes and deletes nothing: a seed that may run again and again, as compose.yaml's
setup does on every start, without undoing what was changed with ratectl since.`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			cfg, routes, err := a.readLimitsFile(cmd, file, prune, gwConfig)
			if err != nil {
				return err
			}
			if onlyMissing && len(prune) > 0 {
				return usagef("--only-missing deletes nothing: drop --prune")
			}
			if onlyMissing && (cfg.Overrides != nil || cfg.Keys != nil) {
				return usagef("--only-missing adds regions and rules only: leave the overrides and keys sections out of %s", file)
			}
			var pinned savedPlan
			if planFile != "" {
				if onlyMissing {
					return usagef("--plan and --only-missing do not go together")
				}
				if pinned, err = readSavedPlan(planFile); err != nil {
					return err
				}
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				if onlyMissing {
					return a.applyOnlyMissing(ctx, cmd, st, cfg, routes, write, reasonOr(reason, cmd))
				}
				// A plan to print, or to hold against the saved one; a plain --apply
				// plans under the lock only (a 100k-rule file is read once).
				var state string
				if !write || planFile != "" {
					changes, now, err := st.PlanState(ctx, cfg)
					if err != nil {
						return err
					}
					if planFile != "" {
						switch {
						case !samePlan(pinned.Changes, changes):
							return fmt.Errorf("%s is not the plan of %s now (%d changes saved, %d now: the file or the database changed): review a new plan (ratectl diff -o json)",
								planFile, file, len(pinned.Changes), len(changes))
						case now != pinned.State:
							return fmt.Errorf("%s: %w: review a new plan (ratectl diff -o json)", planFile, store.ErrStateChanged)
						}
					}
					if !write {
						warnings, err := applyWarnings(ctx, st, changes, routes)
						if err != nil {
							return err
						}
						return a.renderPlan(cmd, changePlanJSON{Changes: changes, Warnings: warnings, State: now})
					}
					state = now
				}
				actor, err := a.actor()
				if err != nil {
					return err
				}
				changes, err := st.ApplyState(ctx, cfg, state, actor, reasonOr(reason, cmd))
				if errors.Is(err, store.ErrStateChanged) {
					return fmt.Errorf("%s: %w: nothing written; review a new plan (ratectl diff -o json)", planFile, err)
				}
				if err != nil {
					return err
				}
				warnings, err := applyWarnings(ctx, st, changes, routes)
				if err != nil {
					return err
				}
				return a.renderPlan(cmd, changePlanJSON{Changes: changes, Warnings: warnings, Applied: true})
			})
		}),
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the limits file (YAML; - for stdin)")
	f.BoolVar(&write, "apply", false, "write the changes (without it: print the plan only)")
	f.BoolVar(&onlyMissing, "only-missing", false, "only add the regions and rules the database lacks; change and delete nothing")
	f.StringSliceVar(&prune, "prune", nil, pruneUsage)
	f.StringVar(&planFile, "plan", "", "a plan saved with diff -f FILE -o json: write it only if it is still the plan, the database unchanged since")
	f.StringVar(&reason, "reason", "", "why, for the audit log (default: the command)")
	f.StringSliceVar(&gwConfig, "gateway-config", nil, "gateway config files whose route ids rules must use (warn otherwise); repeat or comma-separate")
	return cmd
}

// applyOnlyMissing is apply --only-missing: the plan of adding cfg's regions and rules that
// the database lacks (cfg's sections merged onto the database's, so the store plans adds
// only), printed, or with write made by AddRegion and SetRule one at a time. Nothing is
// ever changed or deleted: an object that appeared meanwhile is skipped, not overwritten.
func (a *app) applyOnlyMissing(ctx context.Context, cmd *cobra.Command, st *store.Store, cfg store.Config, routes map[string]bool, write bool, reason string) error {
	cur, err := st.Export(ctx)
	if err != nil {
		return err
	}
	var merged store.Config
	if cfg.Regions != nil {
		rs := slices.Clone(*cur.Regions)
		for _, r := range *cfg.Regions {
			if !slices.Contains(rs, r) {
				rs = append(rs, r)
			}
		}
		merged.Regions = &rs
	}
	rules := map[string]regions.Rule{}
	if cfg.Rules != nil {
		rs := slices.Clone(*cur.Rules)
		for _, r := range *cfg.Rules {
			rules[r.Tenant+"/"+r.Route] = r
			if !slices.ContainsFunc(rs, func(have regions.Rule) bool { return have.Tenant == r.Tenant && have.Route == r.Route }) {
				rs = append(rs, r)
			}
		}
		merged.Rules = &rs
	}
	changes, err := st.Plan(ctx, merged)
	if err != nil {
		return err
	}
	if !write {
		return a.renderPlan(cmd, changePlanJSON{Changes: changes, Warnings: ruleWarnings(changes, routes)})
	}
	actx, _, err := a.auditCtx(ctx, reason)
	if err != nil {
		return err
	}
	done := []store.Change{}
	for _, c := range changes {
		switch r, isRule := rules[c.ID]; {
		case c.Action != store.ActionAdd:
			return fmt.Errorf("--only-missing planned to %s %s %s", c.Action, c.Object, c.ID) // merged holds everything stored
		case c.Object == "region":
			if err := st.AddRegion(actx, c.ID); errors.Is(err, store.ErrExists) {
				continue
			} else if err != nil {
				return fmt.Errorf("add region %s: %w", c.ID, err)
			}
		case c.Object == "rule" && isRule:
			if have, err := st.Rules(ctx, r.Tenant, r.Route); err != nil {
				return err
			} else if len(have) > 0 {
				continue
			}
			if err := st.SetRule(actx, r); err != nil {
				return fmt.Errorf("set rule %s: %w", c.ID, err)
			}
		default:
			return fmt.Errorf("--only-missing planned to add %s %s, which the file does not hold", c.Object, c.ID)
		}
		done = append(done, c)
	}
	return a.renderPlan(cmd, changePlanJSON{Changes: done, Warnings: ruleWarnings(done, routes), Applied: true})
}

func newDiffCmd(a *app) *cobra.Command {
	var (
		file     string
		gwConfig []string
		prune    []string
	)
	cmd := &cobra.Command{
		Use:   "diff -f FILE [--prune KINDS] [--exit-code]",
		Short: "Show what apply -f FILE would change (writes nothing)",
		Long: `Show what apply -f FILE would change, and write nothing.

With --exit-code the exit status tells a CI job what it found, as terraform plan
-detailed-exitcode and kubectl diff do: 0 the database matches the file, 2 there are
changes (the plan is printed), 1 an error of any kind (bad file, unreachable database).`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			cfg, routes, err := a.readLimitsFile(cmd, file, prune, gwConfig)
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				changes, state, err := st.PlanState(ctx, cfg)
				if err != nil {
					return err
				}
				warnings, err := applyWarnings(ctx, st, changes, routes)
				if err != nil {
					return err
				}
				if err := a.renderPlan(cmd, changePlanJSON{Changes: changes, Warnings: warnings, State: state}); err != nil {
					return err
				}
				if a.detailedExit && len(changes) > 0 {
					return errChangesPending
				}
				return nil
			})
		}),
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the limits file (YAML; - for stdin)")
	cmd.Flags().StringSliceVar(&gwConfig, "gateway-config", nil, "gateway config files whose route ids rules must use (warn otherwise)")
	cmd.Flags().StringSliceVar(&prune, "prune", nil, pruneUsage)
	cmd.Flags().BoolVar(&a.detailedExit, "exit-code", false, "exit 0 when nothing would change, 2 when something would, 1 on any error")
	return cmd
}

func newExportCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "export",
		Short: "Print the regions, rules, overrides and key hashes as a limits file for apply -f",
		Long: `Print the regions, rules, overrides and key hashes as a limits file (YAML) that
apply -f takes back with no change; with -o json the same document as JSON, which apply -f
takes too.`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				cfg, err := st.Export(ctx)
				if err != nil {
					return err
				}
				if a.output == outputJSON {
					doc, err := store.MarshalLimitsJSON(cfg)
					if err != nil {
						return fmt.Errorf("export: %w", err)
					}
					return a.render(cmd, json.RawMessage(doc), nil)
				}
				out, err := store.MarshalLimits(cfg)
				if err != nil {
					return fmt.Errorf("export: %w", err)
				}
				w := cmd.OutOrStdout()
				fmt.Fprintf(w, "# quotaplane limits, exported %s; ratectl apply -f takes it back.\n", a.now().UTC().Format(time.RFC3339))
				_, err = w.Write(out)
				return err
			})
		}),
	}
}

// colonDesc is ": " and the value's text, or nothing for no value.
func colonDesc(v store.ChangeValue) string {
	if v == nil {
		return ""
	}
	return ": " + v.String()
}

// valueText is the value's text, "-" for no value.
func valueText(v store.ChangeValue) string {
	if v == nil {
		return "-"
	}
	return v.String()
}

// pruneUsage is the help of --prune.
const pruneUsage = "delete (keys: revoke) what these sections of the file do not list: regions, rules, overrides, keys, plans, tenant_plans, or all (the sections present); repeat or comma-separate"

// setPrune sets cfg.Prune from --prune's values: each section named must be in the file,
// and not empty.
func setPrune(cfg *store.Config, file string, kinds []string) error {
	for _, k := range kinds {
		switch k {
		case "all":
			cfg.Prune = store.Prune{Regions: cfg.Regions != nil, Rules: cfg.Rules != nil, Overrides: cfg.Overrides != nil, Keys: cfg.Keys != nil,
				Plans: cfg.Plans != nil, TenantPlans: cfg.TenantPlans != nil}
			for _, p := range []struct {
				on    bool
				name  string
				empty bool
			}{
				{cfg.Prune.Regions, "regions", cfg.Regions != nil && len(*cfg.Regions) == 0},
				{cfg.Prune.Overrides, "overrides", cfg.Overrides != nil && len(*cfg.Overrides) == 0},
				{cfg.Prune.Keys, "keys", cfg.Keys != nil && len(*cfg.Keys) == 0},
				{cfg.Prune.Plans, "plans", cfg.Plans != nil && len(*cfg.Plans) == 0},
				{cfg.Prune.TenantPlans, "tenant_plans", cfg.TenantPlans != nil && len(*cfg.TenantPlans) == 0},
			} {
				if p.on && p.empty {
					return usagef("--prune all: the %s section of %s is empty, and an empty section never deletes everything: drop it, or prune the others by name", p.name, file)
				}
			}
		case "regions":
			cfg.Prune.Regions = true
		case "rules":
			cfg.Prune.Rules = true
		case "overrides":
			cfg.Prune.Overrides = true
		case "keys":
			cfg.Prune.Keys = true
		case "plans":
			cfg.Prune.Plans = true
		case "tenant_plans":
			cfg.Prune.TenantPlans = true
		default:
			return usagef("--prune %q: want regions, rules, overrides, keys, plans, tenant_plans or all", k)
		}
	}
	if err := cfg.Normalize(); err != nil {
		return usagef("--prune: %s: %v", file, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return nil
}

// readLimitsFile reads the limits file of apply and diff (--file, required), with what
// --prune names to prune, and the route ids of the gateway configs their warnings check
// rules against.
func (a *app) readLimitsFile(cmd *cobra.Command, file string, prune, gwConfig []string) (store.Config, map[string]bool, error) {
	if file == "" {
		return store.Config{}, nil, usagef("--file (-f) is required (- for stdin)")
	}
	cfg, err := a.readLimits(cmd, file)
	if err != nil {
		return store.Config{}, nil, err
	}
	if err := setPrune(&cfg, file, prune); err != nil {
		return store.Config{}, nil, err
	}
	routes, err := gatewayRoutes(gwConfig)
	if err != nil {
		return store.Config{}, nil, err
	}
	return cfg, routes, nil
}
