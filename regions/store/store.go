package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/quotaplane/quotaplane/internal/redact"
	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions"
)

// RawID accepts any id a row may hold, valid or not: 1 to 64 bytes of printable UTF-8.
// Deletions take it, so an operator can remove any row the database holds; writes that
// create rows validate with regions.ValidateID.
func RawID(kind, id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("%w %s id %.20q: must be 1 to 64 bytes", regions.ErrInvalid, kind, id)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w %s id %q: not UTF-8", regions.ErrInvalid, kind, id)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w %s id %q: control characters", regions.ErrInvalid, kind, id)
		}
	}
	return nil
}

// Sentinels of the store, for callers that branch on them (errors.Is).
var (
	// ErrNotFound: the rule, key or region to change does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: the region to add exists already.
	ErrExists = errors.New("already exists")
	// ErrRegionInUse: the region to remove still has shares (remove them, or force).
	ErrRegionInUse = errors.New("region has shares")
)

// NotifyChannel is the PostgreSQL channel that is notified on every change of rules,
// keys, regions and shares (not on heartbeats). The payload is the changed table's name.
const NotifyChannel = migrations.NotifyChannel

// Store is the PostgreSQL store of the control-plane data. Every write is one transaction,
// validated (errors wrapping ErrInvalid) before anything is written; the database's
// triggers announce it on NotifyChannel and record it in region_share_history (shares) or
// audit_log (rules, keys, regions) with the actor and reason of the write. It is safe for
// concurrent use.
type Store struct {
	pool *pgxpool.Pool
	// fail wraps a connection error with the server's name and no secret of the URL.
	fail func(op string, err error) error
	// hook, in tests, is called at named points inside write transactions (hookOverrideRead),
	// so a test can interleave another writer there. nil in production.
	hook func(point string)
}

// Hook points.
const hookOverrideRead = "override: regions read"

func (s *Store) at(point string) {
	if s.hook != nil {
		s.hook(point)
	}
}

// defaultConnectTimeout bounds each connection attempt when the URL sets none, so an
// unreachable host fails instead of hanging.
const defaultConnectTimeout = 5 * time.Second

// Open parses url (a postgres:// URL or key=value string) and returns a store whose pool
// connects on first use: it does not dial, so a database that is down at start is an
// error of the first operation, not of Open (call Ping to know at once). Errors name the
// server (RedactURL) and never contain the password; a malformed url wraps ErrInvalid.
//
// Of a URL whose userinfo pgx may split elsewhere than the password ends (an unencoded '/',
// '?' or '@' in it), pgx may have taken part of the password for the host, port or database
// it names in its errors: the errors then show only RedactURL and hide pgx's text.
func Open(ctx context.Context, url string) (*Store, error) {
	secrets := URLSecrets(url)
	ambiguous := ambiguousUserinfo(url)
	const hidden = "details hidden: the url may hold an unencoded '/', '?' or '@' in its password; percent-encode them"
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The parse error may quote the input: keep only a scrubbed message, no chain.
		detail := redact.String(err.Error(), secrets)
		if ambiguous {
			detail = hidden
		}
		return nil, fmt.Errorf("%w database url %s: %s", regions.ErrInvalid, RedactURL(url), detail)
	}
	if cfg.ConnConfig.Password != "" {
		secrets = append(secrets, cfg.ConnConfig.Password)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	fail := func(op string, err error) error {
		if ambiguous {
			return &redactedError{msg: fmt.Sprintf("%s %s: %s", op, RedactURL(url), hidden), err: err}
		}
		return redactErr(fmt.Errorf("%s %s: %w", op, serverName(cfg.ConnConfig), err), secrets)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fail("open database", err)
	}
	return &Store{pool: pool, fail: fail}, nil
}

// Ping connects to the database (or checks a pooled connection) within ctx: for callers
// that must know the database is reachable before they go on (ratectl, a readiness
// probe). Its error names the server, never a secret of the URL.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return s.fail("connect to database", err)
	}
	return nil
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

// RedactURL is url fit for messages: every stretch of it that may hold a password replaced
// by "xxxxx" (redact.URL, the one scrubber).
func RedactURL(url string) string { return redact.URL(url) }

// URLSecrets is every password-like value in url that we can find without a full parse
// (redact.Secrets).
func URLSecrets(url string) []string { return redact.Secrets(url) }

// ambiguousUserinfo is whether pgx ends the userinfo of URL s elsewhere than the last '@'
// after a ':' (secretSpans): pgx may then take part of the password for the host, port or
// database, which its errors and serverName show.
func ambiguousUserinfo(s string) bool {
	rest, ok := strings.CutPrefix(s, "postgresql://")
	if !ok {
		if rest, ok = strings.CutPrefix(s, "postgres://"); !ok {
			return false
		}
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 || !strings.Contains(rest[:at], ":") {
		return false
	}
	return strings.IndexAny(rest, "@/") != at
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
	return &redactedError{msg: redact.String(err.Error(), secrets), err: err}
}

func serverName(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s:%d/%s (user %s)", c.Host, c.Port, c.Database, c.User)
}

// Now is the database's clock (now()): override expiry is judged by it everywhere, so
// ratectl and the rebalancer use it rather than their own.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read the database clock: %w", err)
	}
	return t, nil
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
			return fmt.Errorf("%w: %w", regions.ErrInvalid, err)
		}
	}
	return err
}
