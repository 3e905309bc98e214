package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// isSchemaMissing is whether PostgreSQL refused a query because a table, column or
// function of the schema is missing: the database was never migrated, or is behind.
func isSchemaMissing(e *pgconn.PgError) bool {
	switch e.Code {
	case "42P01", "42703", "42883": // undefined_table, undefined_column, undefined_function
		return true
	}
	return false
}

// connectCause is the attempt of a failed connection (a *pgconn.ConnectError in err's
// chain) that says why it failed, as a ConnectError of its own, or nil for another error.
// pgconn tries each address, and with sslmode=prefer or allow each of TLS and plain, and
// joins the attempts' errors: an answer from the server (a PgError: no such role or
// database, a bad password) tells most, then any attempt but a TLS one the server
// refused ("server refused TLS connection" only means it does not do TLS), then the last.
func connectCause(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return nil
	}
	attempts := []error{ce.Unwrap()}
	if j, ok := attempts[0].(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > 0 {
		attempts = j.Unwrap()
	}
	pick := attempts[len(attempts)-1]
	found := false
	for _, a := range slices.Backward(attempts) {
		var pgErr *pgconn.PgError
		if errors.As(a, &pgErr) {
			pick, found = a, true
			break
		}
	}
	if !found && len(attempts) > 1 {
		for _, a := range slices.Backward(attempts) {
			if !strings.Contains(a.Error(), "server refused TLS connection") {
				pick = a
				break
			}
		}
	}
	return connectAttemptError{ce: ce, attempt: pick}
}

// connectAttemptError is one attempt of a failed connection: it unwraps to that attempt
// alone, and is still a *pgconn.ConnectError (isConnectError).
type connectAttemptError struct {
	ce      *pgconn.ConnectError
	attempt error
}

func (e connectAttemptError) Error() string { return e.attempt.Error() }
func (e connectAttemptError) Unwrap() error { return e.attempt }
func (e connectAttemptError) As(target any) bool {
	if t, ok := target.(**pgconn.ConnectError); ok {
		*t = e.ce
		return true
	}
	return false
}

// tlsFailure is the TLS error in err's chain (certificate not trusted, wrong name, expired,
// handshake refused, or a server that does not speak TLS when sslmode requires it), or nil.
func tlsFailure(err error) error {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		alert    tls.AlertError
	)
	switch {
	case errors.As(err, &verify):
		return verify.Err
	case errors.As(err, &unknown):
		return unknown
	case errors.As(err, &hostname):
		return hostname
	case errors.As(err, &invalid):
		return invalid
	case errors.As(err, &record):
		return record
	case errors.As(err, &alert):
		return alert
	}
	// pgx's own words when the server answers an SSLRequest with "no".
	if msg := err.Error(); strings.Contains(msg, "server refused TLS connection") {
		return errors.New("server refused TLS connection")
	}
	return nil
}
