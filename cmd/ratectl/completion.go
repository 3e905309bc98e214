package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// completionTimeout bounds a completion's database round trip whatever --timeout says: a
// shell waits on it at every Tab.
const completionTimeout = 2 * time.Second

// registerCompletions adds the dynamic completions read from the database: every
// --tenant and --region flag in the tree, and the arguments that name a region or a key.
func (a *app) registerCompletions(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.LocalNonPersistentFlags().Lookup("tenant") != nil {
			_ = c.RegisterFlagCompletionFunc("tenant", a.completeFrom(completeTenants))
		}
		if c.LocalNonPersistentFlags().Lookup("region") != nil {
			_ = c.RegisterFlagCompletionFunc("region", a.completeFrom(completeRegions))
		}
		switch c.CommandPath() {
		case "ratectl regions remove":
			c.ValidArgsFunction = a.completeOne(completeRegions)
		case "ratectl keys revoke":
			c.ValidArgsFunction = a.completeOne(completeKeyIDs)
		case "ratectl shares set":
			c.ValidArgsFunction = a.completeShareArgs
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// lister reads candidates from the store.
type lister func(ctx context.Context, st *store.Store) ([]string, error)

// completeFrom completes a flag with lister's candidates that start with what is typed.
func (a *app) completeFrom(l lister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return withPrefix(a.completionCandidates(cmd, l), toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeOne completes the single positional argument of a command.
func (a *app) completeOne(l lister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return a.completeFrom(l)(cmd, args, toComplete)
	}
}

// completeShareArgs completes shares set's REGION=SHARE arguments: "REGION=" for every
// region not given yet, with no space after it so the share can be typed.
func (a *app) completeShareArgs(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if strings.Contains(toComplete, "=") {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, r := range a.completionCandidates(cmd, completeRegions) {
		if !slices.ContainsFunc(args, func(arg string) bool { return strings.HasPrefix(arg, r+"=") }) {
			out = append(out, r+"=")
		}
	}
	return withPrefix(out, toComplete), cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
}

// completionCandidates runs l against the database the command would use (--database-url,
// else the environment), and fails quietly: no database, no connection or an error gives
// no candidates, and nothing is printed (the shell would show it as a completion).
func (a *app) completionCandidates(cmd *cobra.Command, l lister) []string {
	// Completion runs no PersistentPreRunE: resolve the URL as resolveGlobals does, silently.
	url := a.databaseURL
	if f := cmd.Flag("database-url"); f == nil || !f.Changed {
		url = a.getenv(envDatabaseURL)
		if url == "" {
			url = a.getenv(envDatabaseURLOld)
		}
	}
	if url == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), min(a.timeout, completionTimeout))
	defer cancel()
	st, err := store.Open(ctx, url)
	if err != nil {
		return nil
	}
	defer st.Close()
	out, err := l(ctx, st)
	if err != nil {
		return nil
	}
	return out
}

// withPrefix keeps the candidates starting with prefix (the part before a tab, for one
// with a description).
func withPrefix(cands []string, prefix string) []string {
	out := []string{}
	for _, c := range cands {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func completeRegions(ctx context.Context, st *store.Store) ([]string, error) {
	return st.Regions(ctx)
}

// completeTenants lists the tenants the database knows: those with a rule or a key.
func completeTenants(ctx context.Context, st *store.Store) ([]string, error) {
	seen := map[string]bool{}
	rules, err := st.Rules(ctx, "", "")
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		if r.Tenant != regions.Wildcard {
			seen[r.Tenant] = true
		}
	}
	keys, err := st.Keys(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		seen[k.Tenant] = true
	}
	return sortedKeys(seen), nil
}

// completeKeyIDs lists the ids of the keys not revoked, described by tenant and label.
func completeKeyIDs(ctx context.Context, st *store.Store) ([]string, error) {
	keys, err := st.Keys(ctx, "")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range keys {
		if !k.RevokedAt.IsZero() {
			continue
		}
		desc := k.Tenant
		if k.Label != "" {
			desc += " " + k.Label
		}
		out = append(out, strconv.FormatInt(k.ID, 10)+"\t"+desc)
	}
	return out, nil
}
