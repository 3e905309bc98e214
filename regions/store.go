package regions

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/quotaplane/quotaplane/migrations"
)

// Store is the PostgreSQL store of the control-plane data. Every write is one transaction,
// validated (errors wrapping ErrInvalid) before anything is written; the database's
// triggers announce it on NotifyChannel and record it in region_share_history (shares) or
// audit_log (rules, keys, regions) with the actor and reason of the write. It is safe for
// concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

// defaultConnectTimeout bounds each connection attempt when the URL sets none, so an
// unreachable host fails instead of hanging.
const defaultConnectTimeout = 5 * time.Second

// Open parses url (a postgres:// URL or key=value string), connects and pings. Errors name
// the server (RedactURL) and never contain the password; a malformed url wraps ErrInvalid.
func Open(ctx context.Context, url string) (*Store, error) {
	secrets := urlSecrets(url)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The parse error may quote the input: keep only a scrubbed message, no chain.
		return nil, fmt.Errorf("%w database url %s: %s", ErrInvalid, RedactURL(url), scrub(err.Error(), secrets))
	}
	if cfg.ConnConfig.Password != "" {
		secrets = append(secrets, cfg.ConnConfig.Password)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	where := serverName(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, redactErr(fmt.Errorf("open database %s: %w", where, err), secrets)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, redactErr(fmt.Errorf("connect to database %s: %w", where, err), secrets)
	}
	return &Store{pool: pool}, nil
}

// Close closes every connection; call it once when done.
func (s *Store) Close() { s.pool.Close() }

// Pool is the connection pool, for callers that need a connection of their own (advisory
// locks). Do not close it; Close the Store.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Migrate applies every pending migration (migrations.Up).
func (s *Store) Migrate(ctx context.Context) error {
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close() // does not close the pool
	return migrations.Up(ctx, db)
}

// RedactURL is url fit for messages: the password of a URL or key=value string replaced
// by "xxxxx". Host, port, user and database stay.
func RedactURL(url string) string {
	if u, err := parseURL(url); err == nil {
		if q := u.Query(); q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	if strings.Contains(url, "://") {
		// A URL we cannot parse: show nothing of it but the scheme.
		scheme, _, _ := strings.Cut(url, "://")
		return scheme + "://(unparsable)"
	}
	return kvPassword.ReplaceAllString(url, "${1}xxxxx")
}

// kvPassword matches password=VALUE in a key=value connection string (quoted or not).
var kvPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

func parseURL(s string) (*url.URL, error) {
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		return nil, errors.New("not a url")
	}
	return url.Parse(s)
}

// urlSecrets is every password-like value in url that we can find without a full parse.
func urlSecrets(s string) []string {
	var out []string
	if u, err := parseURL(s); err == nil {
		if p, ok := u.User.Password(); ok && p != "" {
			out = append(out, p, url.QueryEscape(p), url.PathEscape(p))
		}
		for _, p := range u.Query()["password"] {
			if p != "" {
				out = append(out, p, url.QueryEscape(p))
			}
		}
	} else if strings.Contains(s, "://") {
		// Unparsable URL: treat whatever sits between "user:" and "@" as the password.
		rest := s[strings.Index(s, "://")+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, p, ok := strings.Cut(rest[:at], ":"); ok && p != "" {
				out = append(out, p)
			}
		}
	}
	for _, m := range kvPassword.FindAllStringSubmatch(s, -1) {
		if v := strings.Trim(m[2], "'"); v != "" {
			out = append(out, v, m[2])
		}
	}
	return out
}

func scrub(msg string, secrets []string) string {
	for _, p := range secrets {
		if p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

// redactedError has the text of err with the secrets replaced; it still unwraps to err,
// so errors.Is works (network errors, context deadlines).
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

func redactErr(err error, secrets []string) error {
	return &redactedError{msg: scrub(err.Error(), secrets), err: err}
}

func serverName(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s:%d/%s (user %s)", c.Host, c.Port, c.Database, c.User)
}

// audit is who makes a write and why; the triggers record it.
type audit struct{ actor, reason string }

type auditKey struct{}

// WithAudit names the actor (an operator's OS user, "rebalancer", a gateway id) and the
// reason of the writes made with ctx, for the audit log and share history. Methods that
// take an actor and reason themselves ignore it. Without it the database role is recorded.
func WithAudit(ctx context.Context, actor, reason string) context.Context {
	return context.WithValue(ctx, auditKey{}, audit{actor: actor, reason: reason})
}

func auditOf(ctx context.Context) audit {
	a, _ := ctx.Value(auditKey{}).(audit)
	return a
}

// write runs fn in one transaction whose audit settings name a.
func (s *Store) write(ctx context.Context, a audit, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config($1, $2, true), set_config($3, $4, true)`,
			migrations.SettingActor, a.actor, migrations.SettingReason, a.reason); err != nil {
			return fmt.Errorf("set audit context: %w", err)
		}
		return fn(tx)
	})
}

// dbErr marks constraint violations (a row the schema refuses) as ErrInvalid.
func dbErr(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case "23514", "23503", "23505", "23502", "22P02", "22003": // check, fk, unique, not null, bad text, out of range
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return err
}
