package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// liveInstanceTTL is how recent a gateway's heartbeat must be for ratectl to count it as
// live: the gateways' default heartbeat TTL, as the rebalancer and its status page use
// (it was 30 s here against their 15 s).
const liveInstanceTTL = store.DefaultInstanceTTL

// withStore opens the control-plane store for one command, bounded by --timeout, and
// closes it afterwards. Every error is classified (dbError).
func (a *app) withStore(cmd *cobra.Command, f func(ctx context.Context, st *store.Store) error) error {
	url, err := a.requireDatabase()
	if err != nil {
		return err
	}
	ctx, cancel := a.withTimeout(cmd.Context())
	defer cancel()
	st, err := store.Open(ctx, url)
	if err != nil {
		return a.dbError(err)
	}
	defer st.Close()
	if err := st.Ping(ctx); err != nil {
		return a.dbError(err)
	}
	return a.dbError(f(ctx, st))
}

// dbError turns a failure to reach PostgreSQL into an unreachableError naming host and
// port (exit 3); a server that refused us (bad password, unknown database) stays an
// operation failure, named with the host and port too. Other errors pass unchanged.
func (a *app) dbError(err error) error {
	if err == nil {
		return nil
	}
	var u usageError
	if errors.As(err, &u) || errors.Is(err, regions.ErrInvalid) {
		return err
	}
	addr := urlHostPort(a.databaseURL, "5432")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && isSchemaMissing(pgErr) {
		return fmt.Errorf("the database at %s lacks the quotaplane schema (%s): run `ratectl migrate up`", addr, pgErr.Message)
	}
	// A failed connection holds one error per attempt: with sslmode=prefer (the default)
	// a TLS attempt the server refused, then the plain one, which tells why.
	if cause := connectCause(err); cause != nil {
		err = cause
	}
	if tlsErr := tlsFailure(err); tlsErr != nil {
		// Not "unreachable": the server answered, and retrying will not help (exit 1).
		return fmt.Errorf("database at %s: TLS failed: %v (check sslmode, sslrootcert and the server certificate)", addr, tlsErr)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && errors.As(err, &pgErr) {
		return fmt.Errorf("database at %s refused the connection: %s (SQLSTATE %s)", addr, pgErr.Message, pgErr.Code)
	}
	if isConnectError(err) && !errors.As(err, &pgErr) {
		return unreachableError{"database", addr, rootCause(err)}
	}
	return err
}

// rootCause is the innermost error of a wrap chain (following the first of several
// joined errors): "connection refused" rather than every layer's restatement of the
// address.
func rootCause(err error) error {
	for {
		var next error
		switch e := err.(type) {
		case interface{ Unwrap() error }:
			next = e.Unwrap()
		case interface{ Unwrap() []error }:
			if es := e.Unwrap(); len(es) > 0 {
				next = es[0]
			}
		}
		if next == nil {
			return err
		}
		err = next
	}
}

// auditCtx names the operator and the reason for the store's audit trail.
func (a *app) auditCtx(ctx context.Context, reason string) (context.Context, string, error) {
	actor, err := a.actor()
	if err != nil {
		return nil, "", err
	}
	return store.WithAudit(ctx, actor, reason), actor, nil
}
