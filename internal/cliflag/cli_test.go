package cliflag

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/internal/version"
)

func TestVarGet(t *testing.T) {
	t.Parallel()
	v := Var{Name: EnvPrometheusURL, Old: "RATECTL_PROMETHEUS_URL"}
	for _, tc := range []struct {
		name      string
		env       map[string]string
		want      string
		wantWarns int
	}{
		{"new", map[string]string{v.Name: "http://new"}, "http://new", 0},
		{"old only", map[string]string{v.Old: "http://old"}, "http://old", 1},
		{"both: the new one wins, silently", map[string]string{v.Name: "http://new", v.Old: "http://old"}, "http://new", 0},
		{"neither", nil, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var warns []string
			got := v.Get(func(k string) string { return tc.env[k] }, func(m string) { warns = append(warns, m) })
			if got != tc.want || len(warns) != tc.wantWarns {
				t.Errorf("Get = %q, warnings %q; want %q, %d warnings", got, warns, tc.want, tc.wantWarns)
			}
			for _, w := range warns {
				if !strings.HasPrefix(w, "RATECTL_PROMETHEUS_URL is deprecated: set RATELIMIT_PROMETHEUS_URL") {
					t.Errorf("warning %q", w)
				}
			}
		})
	}
}

// newRoot is a root command with the shared conventions, one flag and both subcommands.
func newRoot() *cobra.Command {
	root := &cobra.Command{Use: "prog", Args: NoArgs, RunE: func(*cobra.Command, []string) error { return nil }}
	Configure(root, "prog", version.Info{Version: "v1.2.3", Commit: "0123456789abcdef", Date: "2026-11-30T21:00:00Z"})
	var n int
	root.Flags().IntVar(&n, "count", 1, "how many")
	root.AddCommand(VersionCmd("prog", version.Info{Version: "v1.2.3"}), HealthcheckCmd("prog", "http://127.0.0.1:1/readyz"))
	AddEnvHelp(root, "a flag wins over its variable", Var{Name: EnvDatabaseURL, Sets: "--database-url"}, Var{Name: EnvActor, Old: "RATECTL_ACTOR", Sets: "--actor"})
	return root
}

func TestConventions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		args       []string
		code       int
		out, noOut string // on stdout
		errOut     string // on stderr
	}{
		{name: "help lists the environment", args: []string{"--help"}, out: "Environment (a flag wins over its variable):\n  RATELIMIT_DATABASE_URL   --database-url\n  RATELIMIT_ACTOR          --actor (old name RATECTL_ACTOR, deprecated)\n"},
		{name: "subcommand help has no environment", args: []string{"version", "--help"}, noOut: "Environment"},
		{name: "version flag", args: []string{"--version"}, out: "prog v1.2.3 (commit 0123456789ab"},
		{name: "version command", args: []string{"version"}, out: "prog v1.2.3\ncommit"},
		{name: "healthcheck help", args: []string{"healthcheck", "--help"}, errOut: "usage: prog healthcheck"},
		{name: "healthcheck fails", args: []string{"healthcheck"}, code: ExitFailure, errOut: "prog: healthcheck: http://127.0.0.1:1/readyz"},
		{name: "bad int", args: []string{"--count", "x"}, code: ExitUsage, errOut: `prog: --count "x": want a whole number`},
		{name: "unknown flag", args: []string{"--nope"}, code: ExitUsage, errOut: "prog: unknown flag: --nope"},
		{name: "one dash reads as two", args: []string{"-count=2"}},
		{name: "one-dash version", args: []string{"-version"}, out: "prog v1.2.3 (commit"},
		{name: "one dash, no such flag", args: []string{"-nope"}, code: ExitUsage, errOut: "prog: unknown flag -nope\n"},
		{name: "stray argument", args: []string{"serve"}, code: ExitUsage, errOut: `prog: unexpected arguments ["serve"] (commands: [healthcheck version])`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := Exit(&errb, "prog", Execute(context.Background(), newRoot(), tc.args, &out, &errb))
			if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.errOut) ||
				(tc.noOut != "" && strings.Contains(out.String(), tc.noOut)) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q", code, out.String(), errb.String(), tc.code, tc.out, tc.errOut)
			}
		})
	}
}

func TestExit(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if got := Exit(&b, "p", fmt.Errorf("run: %w", Usagef("--x: bad"))); got != ExitUsage || b.String() != "p: run: --x: bad\n" {
		t.Errorf("wrapped usage error: exit %d, %q", got, b.String())
	}
	if got := Exit(&b, "p", errors.New("boom")); got != ExitFailure {
		t.Errorf("runtime error: exit %d", got)
	}
}

// TestLongFlags: one-dash long flags get two dashes; values, "--" and shorthands do not.
func TestLongFlags(t *testing.T) {
	t.Parallel()
	root := newRoot()
	var s string
	var b bool
	root.Flags().StringVarP(&s, "reason", "r", "", "why")
	root.Flags().BoolVar(&b, "check", false, "check only")
	sub := &cobra.Command{Use: "set", RunE: func(*cobra.Command, []string) error { return nil }}
	sub.Flags().String("route", "", "route")
	root.PersistentFlags().StringP("output", "o", "table", "format")
	root.AddCommand(sub)
	for _, tc := range []struct{ in, want string }{
		{"-count 2 -check -version", "--count 2 --check --version"},
		{"-count=2", "--count=2"},
		{"--reason -count -count 3", "--reason -count --count 3"},    // a value stays
		{"-r -check -check", "-r -check --check"},                    // a shorthand's value too
		{"-check -- -count", "--check -- -count"},                    // nothing after --
		{"-ojson -nope -c", "-ojson -nope -c"},                       // no such long flag
		{"set -route x -output json", "set --route x --output json"}, // the subcommand's and inherited
		{"-help", "--help"},
	} {
		if got := strings.Join(LongFlags(root, strings.Fields(tc.in)), " "); got != tc.want {
			t.Errorf("LongFlags(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := LongFlags(root, nil); got == nil || len(got) != 0 {
		t.Errorf("LongFlags(nil) = %#v, want an empty slice", got)
	}
}
