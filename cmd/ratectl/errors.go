package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/quotaplane/quotaplane/internal/cliflag"
	"github.com/quotaplane/quotaplane/internal/redact"
	"github.com/quotaplane/quotaplane/regions"
)

// Exit codes; see doc.go.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitUnreachable = 3
)

// usageError is a bad flag, argument or value: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// flagError says what a flag's value should have been, in words (cliflag.FlagError, the
// wording of every binary).
func flagError(err error) error { return cliflag.FlagError(err) }

// usagef builds a usageError.
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// unreachableError is a dependency that could not be reached: exit code 3. Its message
// names the dependency and its host:port, never the URL (which may hold a password).
type unreachableError struct {
	what string // "database", "prometheus", "redis"
	addr string // host:port
	err  error
}

func (e unreachableError) Error() string {
	return fmt.Sprintf("%s at %s unreachable: %v", e.what, e.addr, e.err)
}
func (e unreachableError) Unwrap() error { return e.err }

// errChangesPending is diff --exit-code's "the plan is not empty": exit 2, and nothing
// printed on stderr (the plan is on stdout).
var errChangesPending = errors.New("changes pending")

// exitChanges is the exit code of errChangesPending.
const exitChanges = 2

// runError marks an error returned by a command's RunE, so exitCode can tell it from an
// error cobra raised while parsing the command line (a usage error).
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// exitCode classifies an error returned by the root command.
func exitCode(err error) int {
	var u usageError
	var n unreachableError
	var r runError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &u), errors.Is(err, regions.ErrInvalid):
		return exitUsage
	case errors.As(err, &n):
		return exitUnreachable
	case errors.As(err, &r):
		return exitFailure
	default:
		// Not from a RunE: cobra rejected the command line (unknown command or flag).
		return exitUsage
	}
}

// isConnectError reports whether err means a server could not be reached (as opposed to
// a server that answered with an error).
func isConnectError(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	var oe *net.OpError
	var de *net.DNSError
	return errors.As(err, &ce) || errors.As(err, &oe) || errors.As(err, &de) ||
		(errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, context.DeadlineExceeded)
}

// urlHostPort is host:port of a URL or libpq connection string, for error messages. It
// never returns the user or password.
func urlHostPort(raw string, defaultPort string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = defaultPort
		}
		return net.JoinHostPort(host, port)
	}
	if cfg, err := pgconn.ParseConfig(raw); err == nil {
		return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	}
	return "(unparsable address)"
}

// secretsOf lists what must never be printed of a URL: the whole URL when it holds a
// secret (redact.URL sees one), then every password-like piece of it (redact.Secrets,
// the one redactor).
func secretsOf(raw string) []string {
	if raw == "" {
		return nil
	}
	secrets := redact.Secrets(raw)
	if len(secrets) > 0 || redact.URL(raw) != raw {
		secrets = append([]string{raw}, secrets...)
	}
	return secrets
}

// oneLine formats err as the single line ratectl prints: newlines folded, and every
// secret replaced by "xxxxx".
func oneLine(err error, secrets []string) string {
	msg := redact.String(err.Error(), secrets)
	msg = strings.Join(strings.Fields(strings.ReplaceAll(msg, "\n", " ")), " ")
	return msg
}
