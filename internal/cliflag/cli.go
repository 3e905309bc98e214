package cliflag

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/quotaplane/quotaplane/internal/healthcheck"
	"github.com/quotaplane/quotaplane/internal/version"
)

// Exit codes of the gateway and the rebalancer (ratectl adds 3, "unreachable").
const (
	ExitOK      = 0
	ExitFailure = 1 // the program ran and failed
	ExitUsage   = 2 // a bad flag, argument or value: nothing was started
)

// UsageError is a bad flag, argument or value: exit code 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usagef builds a UsageError.
func Usagef(format string, args ...any) error {
	return UsageError{fmt.Errorf(format, args...)}
}

// Exit prints err as one line "program: err" on stderr and returns the exit code: 0 for
// nil, ExitUsage for a UsageError, else ExitFailure.
func Exit(stderr io.Writer, program string, err error) int {
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(stderr, program+":", err)
	if errors.As(err, new(UsageError)) {
		return ExitUsage
	}
	return ExitFailure
}

// FlagError says what a flag's value should have been, in words: pflag's own text names
// Go's parser ("strconv.ParseInt: parsing \"1.5\": invalid syntax"). A long flag written
// with one dash, as Go's flag package took it (-config), gets its two-dash spelling. Other
// errors (an unknown flag, a value whose Set said why) are returned as they are.
func FlagError(err error) error {
	var iv *pflag.InvalidValueError
	if !errors.As(err, &iv) {
		if arg, ok := strings.CutPrefix(err.Error(), "unknown shorthand flag: "); ok {
			if _, arg, ok = strings.Cut(arg, " in "); ok && len(arg) > 2 && !strings.HasPrefix(arg, "--") {
				return fmt.Errorf("unknown flag %s", arg) // a long flag's one-dash spelling is read by LongFlags
			}
		}
		return err
	}
	want := map[string]string{
		"int": "a whole number", "int64": "a whole number", "int32": "a whole number", "uint": "a whole number >= 0",
		"float64": "a number", "float32": "a number", "bool": "true or false",
	}[iv.GetFlag().Value.Type()]
	var num *strconv.NumError
	switch {
	case want == "":
		return err // its own Set said why (durations, shares)
	case errors.As(err, &num) && errors.Is(num.Err, strconv.ErrRange):
		return fmt.Errorf("--%s %q: out of range", iv.GetFlag().Name, iv.GetValue())
	default:
		return fmt.Errorf("--%s %q: want %s", iv.GetFlag().Name, iv.GetValue(), want)
	}
}

// Configure gives root the conventions of every binary: errors returned, not printed
// (Exit prints them), flag errors worded and made UsageErrors, `--version` printing
// "program VERSION (commit ...)" as one line, and no completion command.
func Configure(root *cobra.Command, program string, build version.Info) {
	root.SilenceErrors = true
	root.SilenceUsage = true
	root.CompletionOptions.DisableDefaultCmd = true
	root.Version = build.String()
	root.SetVersionTemplate(program + " {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{FlagError(err)} })
}

// NoArgs refuses positional arguments, naming the subcommands when there are some.
func NoArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.HasAvailableSubCommands() {
		var names []string
		for _, c := range cmd.Commands() {
			if c.IsAvailableCommand() {
				names = append(names, c.Name())
			}
		}
		return Usagef("unexpected arguments %q (commands: %v)", args, names)
	}
	return Usagef("unexpected arguments %q", args)
}

// Execute runs root on args (nil is none: cobra would read os.Args) with its output on
// stdout and stderr; one-dash long flags are read as Go's flag package reads them
// (LongFlags).
func Execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) error {
	root.SetArgs(LongFlags(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root.ExecuteContext(ctx)
}

// VersionCmd is `program version`: the build in detail, one item a line.
func VersionCmd(program string, build version.Info) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version in detail (also: " + program + " --version, on one line)",
		Args:  NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mod := ""
			if build.Modified {
				mod = " (modified)"
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %s\ncommit %s%s\nbuilt %s\n%s %s\n",
				program, build.Version, build.Commit, mod, build.Date, build.GoVersion, build.Platform)
			return err
		},
	}
}

// HealthcheckCmd is `program healthcheck [--timeout D] [URL]` (internal/healthcheck),
// for images without a shell: it parses its own flags, so its --help is its own.
func HealthcheckCmd(program, defaultURL string) *cobra.Command {
	return &cobra.Command{
		Use:                healthcheck.Name + " [--timeout D] [URL]",
		Short:              "Exit 0 when URL (default " + defaultURL + ") answers 2xx",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := healthcheck.Run(cmd.Context(), program, args, defaultURL, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if errors.Is(err, flag.ErrHelp) {
				return nil // the usage is printed; asking for it is no failure
			}
			return err
		},
	}
}

// LongFlags returns args (never nil) with every one-dash spelling of a long flag of the
// command they run, "-config x" or "-version", written with two dashes, as Go's flag
// package (which the gateway and the rebalancer used) reads them. pflag would read
// "-version" as -v plus "ersion". An argument that is a flag's value (after a flag that
// takes one, without "=") and everything after "--" stay as written, as does a
// one-dash word that names no long flag: pflag reads it as shorthands ("-ojson").
func LongFlags(root *cobra.Command, args []string) []string {
	out := append([]string{}, args...)
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil {
		cmd = root
	}
	lookup := func(name string) *pflag.Flag {
		if f := cmd.Flags().Lookup(name); f != nil {
			return f
		}
		if f := cmd.InheritedFlags().Lookup(name); f != nil {
			return f
		}
		if name == "help" || name == "version" && root.Version != "" {
			return &pflag.Flag{Name: name, NoOptDefVal: "true"} // added by cobra when it runs
		}
		return nil
	}
	for i := 0; i < len(out); i++ {
		a := out[i]
		if a == "--" {
			break
		}
		var f *pflag.Flag
		switch {
		case strings.HasPrefix(a, "--"):
			name, _, hasValue := strings.Cut(a[2:], "=")
			if f = lookup(name); f != nil && !hasValue && f.NoOptDefVal == "" {
				i++ // its value
			}
			continue
		case len(a) > 2 && a[0] == '-':
			name, _, hasValue := strings.Cut(a[1:], "=")
			if f = lookup(name); f == nil || len(name) < 2 {
				if len(name) == 1 && !hasValue {
					if sf := cmd.Flags().ShorthandLookup(name); sf != nil && sf.NoOptDefVal == "" {
						i++
					}
				}
				continue
			}
			out[i] = "-" + a
			if !hasValue && f.NoOptDefVal == "" {
				i++
			}
		case len(a) == 2 && a[0] == '-':
			if sf := cmd.Flags().ShorthandLookup(a[1:]); sf != nil && sf.NoOptDefVal == "" {
				i++
			} else if sf := cmd.InheritedFlags().ShorthandLookup(a[1:]); sf != nil && sf.NoOptDefVal == "" {
				i++
			}
		}
	}
	return out
}
