package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

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
		detail := scrub(err.Error(), secrets)
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
// by "xxxxx". Host, port, user and database stay where they can be told apart from the
// password; of a string that does not parse, or parses in more than one way, it hides more
// than the password, never less (see secretSpans).
func RedactURL(url string) string {
	var b strings.Builder
	last := 0
	for _, sp := range secretSpans(url) {
		b.WriteString(url[last:sp.from])
		b.WriteString("xxxxx")
		last = sp.to
	}
	b.WriteString(url[last:])
	return b.String()
}

// span is the byte range [from, to) of a connection string.
type span struct{ from, to int }

// secretSpans is every stretch of s that may hold a password, sorted and merged. It reads s
// both as a URL and as a key=value string and, where a malformed string can be read in more
// than one way, takes the widest reading, so a password stays hidden however pgx, net/url
// or the person who wrote it split the string:
//
//   - URL userinfo: a password may hold an unencoded '/', '?', '#', '@' or ':', and each
//     parser then ends the userinfo elsewhere (pgx at the first '@' before a '/', net/url at
//     the last '@' before the first '/', '?' or '#'; postgres://u:s3cr/et@host has no
//     userinfo at all for either). So everything from the first ':' after "://" to the last
//     '@' counts, whenever there is such a ':'.
//   - URL query: the value of a password or sslpassword parameter (percent-encoded names
//     too) runs to the end of s, since an unencoded '&' or '#' may sit inside it.
//   - key=value: the value of every key ending in "password" (to the end of s if its quote
//     is unterminated), and the words after it that no '=' follows, which an unquoted
//     password with a space leaves behind (password=abc def host=h).
//   - neither: a string with no "://" and no '=' is no connection string at all, most
//     likely a password pasted in the wrong place (--database-url s3cretPW), so all of it.
func secretSpans(s string) []span {
	if t := strings.TrimSpace(s); t != "" && !strings.Contains(t, "://") && !strings.Contains(t, "=") {
		return []span{{0, len(s)}}
	}
	spans := append(urlSpans(s), kvSpans(s)...)
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	var out []span
	for _, sp := range spans {
		if n := len(out); n > 0 && sp.from <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, sp.to)
			continue
		}
		out = append(out, sp)
	}
	return out
}

func urlSpans(s string) []span {
	i := strings.Index(s, "://")
	if i < 0 {
		return nil
	}
	base := i + len("://")
	rest := s[base:]
	var out []span
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 {
			out = append(out, span{base + colon + 1, base + at})
		}
	}
	for j := 0; j < len(rest); j++ {
		if rest[j] != '?' && rest[j] != '&' {
			continue
		}
		name, _, ok := strings.Cut(rest[j+1:], "=")
		if !ok {
			break
		}
		if strings.ContainsAny(name, "?&") {
			continue // not a parameter name; the next '?' or '&' starts one
		}
		decoded, err := url.PathUnescape(name)
		if err != nil {
			decoded = name
		}
		if isPasswordKey(decoded) {
			out = append(out, span{base + j + 1 + len(name) + 1, len(s)})
			break
		}
	}
	return out
}

// kvSpans follows pgx's key=value grammar (values quoted with ' or bare, backslash escapes)
// but reads on past the errors that make pgx reject a string.
func kvSpans(s string) []span {
	var out []span
	afterPassword := false
	i := 0
	for {
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			if end := len(strings.TrimRight(s, kvSpace)); afterPassword && end > i {
				out = append(out, span{i, end})
			}
			return out
		}
		name := strings.TrimRight(s[i:i+eq], kvSpace)
		k := strings.LastIndexAny(name, kvSpace)
		if afterPassword && k >= 0 {
			out = append(out, span{i, i + k}) // words between the password and the next key
		}
		name = name[k+1:]
		v := i + eq + 1
		for v < len(s) && strings.IndexByte(kvSpace, s[v]) >= 0 {
			v++
		}
		end := kvValueEnd(s, v)
		afterPassword = isPasswordKey(name)
		if afterPassword {
			out = append(out, span{v, end})
		}
		i = end
	}
}

const kvSpace = " \t\n\r\v\f"

// kvValueEnd is where the key=value value starting at s[v] ends: after its closing quote,
// at the next unescaped space, or at the end of s.
func kvValueEnd(s string, v int) int {
	if v < len(s) && s[v] == '\'' {
		for j := v + 1; j < len(s); j++ {
			switch s[j] {
			case '\\':
				j++
			case '\'':
				return j + 1
			}
		}
		return len(s) // unterminated: the rest may all be password
	}
	j := v
	for ; j < len(s) && strings.IndexByte(kvSpace, s[j]) < 0; j++ {
		if s[j] == '\\' {
			j++
		}
	}
	return min(j, len(s))
}

// isPasswordKey is whether a parameter of this name holds a secret (password, sslpassword).
func isPasswordKey(name string) bool {
	return strings.HasSuffix(strings.ToLower(strings.TrimSpace(name)), "password")
}

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

// URLSecrets is every password-like value in url that we can find without a full parse:
// the text of each secretSpans stretch, raw and decoded.
func URLSecrets(s string) []string {
	var out []string
	add := func(v string) {
		if v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	for _, sp := range secretSpans(s) {
		raw := s[sp.from:sp.to]
		add(raw)
		if p, err := url.PathUnescape(raw); err == nil {
			add(p)
		}
		if p, err := url.QueryUnescape(raw); err == nil {
			add(p)
		}
		q := strings.Trim(raw, "'")
		add(q)
		add(kvUnescape(q))
	}
	if u, err := url.Parse(s); err == nil && strings.Contains(s, "://") {
		if p, ok := u.User.Password(); ok {
			add(p)
			add(url.QueryEscape(p))
			add(url.PathEscape(p))
		}
		for _, p := range u.Query()["password"] {
			add(p)
			add(url.QueryEscape(p))
		}
	}
	return out
}

// kvUnescape undoes the backslash escapes of a key=value value, as pgx does.
func kvUnescape(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' {
			if i++; i == len(v) {
				break
			}
		}
		b.WriteByte(v[i])
	}
	return b.String()
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
