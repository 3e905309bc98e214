package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
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
