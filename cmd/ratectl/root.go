package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/internal/cliflag"
	"github.com/quotaplane/quotaplane/internal/version"
)

// Environment variables read when the matching flag is not given: the RATELIMIT_* names
// every binary reads (internal/cliflag), and ratectl's former RATECTL_* names, still read
// (with a deprecation line on stderr) when the new one is unset.
const (
	envDatabaseURL      = cliflag.EnvDatabaseURL
	envDatabaseURLOld   = "RATECTL_DATABASE_URL"
	envRedisURL         = cliflag.EnvRedisURL // bucket inspect's --redis-url
	envRedisURLOld      = "RATECTL_REDIS_URL"
	envPrometheusURL    = cliflag.EnvPrometheusURL
	envPrometheusURLOld = "RATECTL_PROMETHEUS_URL"
	// envActor names the operator in the audit log when --actor is not given (CI jobs set
	// it to the pipeline and the person who triggered it).
	envActor    = cliflag.EnvActor
	envActorOld = "RATECTL_ACTOR"
)

// The variables ratectl reads, for --help and resolveGlobals.
var (
	envDatabase   = cliflag.Var{Name: envDatabaseURL, Old: envDatabaseURLOld, Sets: "--database-url"}
	envRedis      = cliflag.Var{Name: envRedisURL, Old: envRedisURLOld, Sets: "bucket inspect --redis-url"}
	envPrometheus = cliflag.Var{Name: envPrometheusURL, Old: envPrometheusURLOld, Sets: "--prometheus-url for status, comma-separated REGION=URL for several"}
	envActorVar   = cliflag.Var{Name: envActor, Old: envActorOld, Sets: "--actor"}
)

// app is what every command shares: injected dependencies and the global flags.
type app struct {
	getenv func(string) string
	now    func() time.Time
	actor  func() (string, error)
	stdin  io.Reader // nil: none
	stderr io.Writer
	build  func() version.Info

	// global flags
	databaseURL string
	// prometheusURLs are the --prometheus-url values: one URL, or REGION=URL per region.
	prometheusURLs []string
	actorName      string
	output         string
	timeout        time.Duration

	// detailedExit is diff --exit-code: exit 2 means "changes", so every error exits 1.
	detailedExit bool

	// redisURL is set by bucket inspect; kept here so its password is blanked in errors.
	redisURL string
}

// Output formats.
const (
	outputTable = "table"
	outputJSON  = "json"
)

// newRootCmd builds the whole command tree for one execution.
func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "ratectl",
		Short: "Operate the multi-region rate limiter: regions, shares, rules, keys, status",
		Long: `ratectl operates the multi-region rate limiter.

It reads and writes the control-plane database (regions, shares, rules, API keys),
reads live figures from Prometheus, inspects a tenant's bucket in a region's Redis,
and replays traffic traces through the rebalancer's allocation code.

Exit codes: 0 success, 1 operation failed, 2 usage or invalid input,
3 a dependency (PostgreSQL, Prometheus, Redis) is unreachable; diff --exit-code:
0 no change, 2 changes, 1 any error.`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		Args:              noArgs,
		RunE:              func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: a.resolveGlobals,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	// --version prints the one line every binary prints; `ratectl version` the details.
	root.Version = a.build().String()
	root.SetVersionTemplate("ratectl {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{flagError(err)} })
	cliflag.AddEnvHelp(root, "a flag wins over its variable; the gateway and the rebalancer read the same names",
		envDatabase, envRedis, envPrometheus, envActorVar)
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "PostgreSQL URL of the control plane (env "+envDatabaseURL+")")
	pf.StringArrayVar(&a.prometheusURLs, "prometheus-url", nil, "Prometheus base URL for status; or repeat as REGION=URL for one Prometheus per region, as the rebalancer takes it (env "+envPrometheusURL+", comma-separated for several)")
	pf.StringVar(&a.actorName, "actor", "", "who the change is made for: the audit log records it as on_behalf_of, its actor being the database role connected (docs/SECURITY.md; env "+envActor+"; default the OS user)")
	pf.StringVarP(&a.output, "output", "o", outputTable, "output format: table or json")
	a.timeout = 15 * time.Second
	pf.Var((*durationValue)(&a.timeout), "timeout", "give up on the database, Prometheus or Redis after this long")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{outputTable, outputJSON}, cobra.ShellCompDirectiveNoFileComp))

	root.AddCommand(
		newMigrateCmd(a),
		newRegionsCmd(a),
		newKeysCmd(a),
		newRulesCmd(a),
		newPlansCmd(a),
		newSharesCmd(a),
		newStatusCmd(a),
		newBucketCmd(a),
		newSimCmd(a),
		newApplyCmd(a),
		newDiffCmd(a),
		newExportCmd(a),
		newAuditCmd(a),
		newVersionCmd(a),
		newCompletionCmd(a, root),
	)
	a.registerCompletions(root)
	return root
}

// resolveGlobals validates the global flags and fills the URLs from the environment.
func (a *app) resolveGlobals(cmd *cobra.Command, _ []string) error {
	warn := func(msg string) { a.warnf("%s", msg) }
	if !cmd.Flags().Changed("database-url") {
		a.databaseURL = envDatabase.Get(a.getenv, warn)
	}
	if !cmd.Flags().Changed("actor") {
		a.actorName = envActorVar.Get(a.getenv, warn)
	}
	if a.actorName != "" {
		if err := checkActor(a.actorName); err != nil {
			return err
		}
		name := a.actorName
		a.actor = func() (string, error) { return name, nil }
	}
	if !cmd.Flags().Changed("prometheus-url") {
		a.prometheusURLs = nil
		if v := envPrometheus.Get(a.getenv, warn); v != "" {
			a.prometheusURLs = strings.Split(v, ",")
		}
	}
	switch a.output {
	case outputTable, outputJSON:
	default:
		return usagef("--output %q: must be table or json", a.output)
	}
	if a.timeout <= 0 {
		return usagef("--timeout %v: must be > 0", a.timeout)
	}
	return nil
}

// secrets lists what must never be printed.
func (a *app) secrets() []string {
	var s []string
	for _, u := range append([]string{a.databaseURL, a.redisURL}, a.prometheusURLs...) {
		s = append(s, secretsOf(u)...)
		if _, after, ok := strings.Cut(u, "="); ok { // REGION=URL
			s = append(s, secretsOf(after)...)
		}
	}
	if a.getenv != nil {
		for _, e := range []string{envDatabaseURL, envDatabaseURLOld, envRedisURL, envRedisURLOld, envPrometheusURL, envPrometheusURLOld} {
			s = append(s, secretsOf(a.getenv(e))...)
		}
	}
	return s
}

// withTimeout bounds one command's I/O by --timeout.
func (a *app) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout)
}

// runE wraps a command body so its errors are told apart from cobra's usage errors.
func runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := f(cmd, args); err != nil {
			var u usageError
			if errors.As(err, &u) {
				return err
			}
			return runError{err}
		}
		return nil
	}
}

// Positional argument checks that return usage errors.

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
		}
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s needs %s (got %d arguments)", cmd.CommandPath(), names, len(args))
		}
		return nil
	}
}

// groupCmd is a command that only holds subcommands.
func groupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("%s needs a subcommand: %s", cmd.CommandPath(), subNames(cmd))
		},
	}
	c.AddCommand(subs...)
	return c
}

func subNames(cmd *cobra.Command) string {
	s := ""
	for i, c := range cmd.Commands() {
		if i > 0 {
			s += ", "
		}
		s += c.Name()
	}
	return s
}

// requireDatabase returns the database URL or a usage error naming the flag and variable.
func (a *app) requireDatabase() (string, error) {
	if a.databaseURL == "" {
		return "", usagef("no database: set --database-url or %s", envDatabaseURL)
	}
	return a.databaseURL, nil
}

// warnf prints a warning line on stderr.
func (a *app) warnf(format string, args ...any) {
	fmt.Fprintf(a.stderr, "ratectl: warning: "+format+"\n", args...)
}

// maxActor is the longest --actor accepted (the audit log's reason has the same bound).
const maxActor = 200

// checkActor refuses an actor the audit log could not show faithfully: empty after
// trimming, too long, or holding control or invisible formatting characters.
func checkActor(s string) error {
	if strings.TrimSpace(s) == "" {
		return usagef("--actor: must not be blank")
	}
	if utf8.RuneCountInString(s) > maxActor {
		return usagef("--actor: longer than %d characters", maxActor)
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError {
			return usagef("--actor %q: holds a control or formatting character", s)
		}
	}
	return nil
}
