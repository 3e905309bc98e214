package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"syscall"
	"time"

	"github.com/quotaplane/quotaplane/internal/cliflag"
	"github.com/quotaplane/quotaplane/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one ratectl command line and returns the exit code. Errors are printed as
// one line "ratectl: ..." on stderr, with every secret of the URLs in use blanked.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	a := &app{
		getenv: getenv,
		now:    time.Now,
		actor:  osActor(getenv),
		stdin:  os.Stdin,
		stderr: stderr,
		build:  version.Get,
	}
	return a.execute(ctx, args, stdout, stderr)
}

// execute runs args on a new root command; tests call it with an app of their own.
func (a *app) execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a.stderr = stderr
	root := newRootCmd(a)
	args = cliflag.LongFlags(root, args) // never nil: cobra would read os.Args
	root.SetArgs(args)
	if a.stdin != nil {
		root.SetIn(a.stdin)
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	detailed := a.detailedExit || wantsDetailedExit(args)
	switch {
	case err == nil:
		return exitOK
	case detailed && errors.Is(err, errChangesPending):
		return exitChanges
	}
	fmt.Fprintln(stderr, "ratectl:", oneLine(err, a.secrets()))
	if detailed {
		return exitFailure // 2 and 3 would read as "changes"
	}
	return exitCode(err)
}

// wantsDetailedExit is whether args hold diff's --exit-code, for a command line cobra
// refused before it set the flag (an unknown flag after it, say).
func wantsDetailedExit(args []string) bool {
	diff := false
	for _, s := range args {
		switch s {
		case "--":
			return false
		case "diff":
			diff = true
		case "--exit-code", "--exit-code=true", "--exit-code=1":
			return diff
		}
	}
	return false
}

// osActor names the operator in the audit trail: the OS user, else $USER.
func osActor(getenv func(string) string) func() (string, error) {
	return func() (string, error) {
		if u, err := user.Current(); err == nil && u.Username != "" {
			return u.Username, nil
		}
		if u := getenv("USER"); u != "" {
			return u, nil
		}
		return "", fmt.Errorf("cannot tell who you are for the audit trail: no OS user and $USER is empty")
	}
}
