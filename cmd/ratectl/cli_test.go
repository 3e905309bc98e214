package main

import (
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	c := newCLI(t, nil)
	golden(t, "version.table", c.ok("version").stdout)
	golden(t, "version.json", c.ok("version", "-o", "json").stdout)
	if got, want := c.ok("--version").stdout, "ratectl v0.0.0-test (commit 0123456789ab, built 2026-11-30T21:00:00Z, go1.26 linux/amd64)\n"; got != want {
		t.Errorf("ratectl --version = %q, want %q", got, want)
	}
}

func TestCompletion(t *testing.T) {
	c := newCLI(t, nil)
	for shell, marker := range map[string]string{
		"bash": "__start_ratectl",
		"zsh":  "#compdef ratectl",
		"fish": "complete -c ratectl",
	} {
		t.Run(shell, func(t *testing.T) {
			r := c.ok("completion", shell)
			if !strings.Contains(r.stdout, marker) {
				t.Errorf("completion %s lacks %q", shell, marker)
			}
		})
	}
	// The completion machinery proposes subcommands and flag values.
	r := c.ok("__complete", "sha")
	if !strings.Contains(r.stdout, "shares") {
		t.Errorf("__complete sha = %q, want shares", r.stdout)
	}
	r = c.ok("__complete", "status", "-o", "")
	if !strings.Contains(r.stdout, "json") || !strings.Contains(r.stdout, "table") {
		t.Errorf("__complete -o = %q, want table and json", r.stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		contains string
	}{
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate" for "ratectl"`},
		{"unknown subcommand", []string{"regions", "frobnicate"}, `unknown command "frobnicate" for "ratectl regions"`},
		{"group without subcommand", []string{"shares"}, "ratectl shares needs a subcommand"},
		{"unknown flag", []string{"version", "--frob"}, "unknown flag: --frob"},
		{"bad output", []string{"version", "-o", "yaml"}, `--output "yaml": must be table or json`},
		{"bad timeout", []string{"version", "--timeout", "0s"}, "--timeout 0s: must be > 0"},
		{"bad flag value", []string{"status", "--window", "soon"}, `invalid argument "soon" for "--window"`},
		{"extra argument", []string{"version", "now"}, `ratectl version takes no arguments, got "now"`},
		{"completion without shell", []string{"completion"}, "needs one shell: bash, zsh or fish"},
		{"completion bad shell", []string{"completion", "tcsh"}, `completion for "tcsh": supported shells are bash, zsh and fish`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkError(t, newCLI(t, nil).run(tc.args...), exitUsage, tc.contains, "")
		})
	}
}

func TestHelpExitsZero(t *testing.T) {
	c := newCLI(t, nil)
	for _, args := range [][]string{nil, {"--help"}, {"shares", "set", "--help"}} {
		r := c.ok(args...)
		if !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("ratectl %v: no usage on stdout: %q", args, r.stdout)
		}
	}
}
