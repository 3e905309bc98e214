package cliflag

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// The environment variables of the binaries: one RATELIMIT_ name per setting, the same in
// every binary that reads it. A flag wins over its variable.
const (
	EnvDatabaseURL   = "RATELIMIT_DATABASE_URL"
	EnvRedisURL      = "RATELIMIT_REDIS_URL"
	EnvPrometheusURL = "RATELIMIT_PROMETHEUS_URL"
	EnvActor         = "RATELIMIT_ACTOR"
)

// Var is one environment variable a command reads.
type Var struct {
	Name string // the RATELIMIT_* name
	// Old is a deprecated name still read when Name is unset or empty ("" none): ratectl's
	// former RATECTL_* names.
	Old string
	// Sets says what the variable stands for, for --help: "--database-url".
	Sets string
}

// Get reads v with getenv: Name, else Old, in which case warn gets the one-line
// deprecation notice (Deprecation).
func (v Var) Get(getenv func(string) string, warn func(msg string)) string {
	s := getenv(v.Name)
	if s != "" || v.Old == "" {
		return s
	}
	if s = getenv(v.Old); s != "" {
		warn(v.Deprecation())
	}
	return s
}

// Deprecation is the warning printed when only v.Old is set.
func (v Var) Deprecation() string {
	return fmt.Sprintf("%s is deprecated: set %s (the name every binary reads)", v.Old, v.Name)
}

// EnvHelp is the "Environment:" section listing vars, one a line, with intro (if any)
// after the heading in parentheses.
func EnvHelp(intro string, vars ...Var) string {
	var b strings.Builder
	b.WriteString("\nEnvironment")
	if intro != "" {
		b.WriteString(" (" + intro + ")")
	}
	b.WriteString(":\n")
	width := 0
	for _, v := range vars {
		width = max(width, len(v.Name))
	}
	for _, v := range vars {
		line := v.Sets
		if v.Old != "" {
			line += " (old name " + v.Old + ", deprecated)"
		}
		fmt.Fprintf(&b, "  %-*s   %s\n", width, v.Name, line)
	}
	return b.String()
}

// AddEnvHelp makes cmd's --help end with EnvHelp(intro, vars...). Only cmd's own help
// gets the section, not its subcommands'.
func AddEnvHelp(cmd *cobra.Command, intro string, vars ...Var) {
	section := EnvHelp(intro, vars...)
	help := cmd.HelpFunc()
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		help(c, args)
		if c == cmd {
			fmt.Fprint(c.OutOrStdout(), section)
		}
	})
}
