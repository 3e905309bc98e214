// Package redact is the one scrubber of secrets in connection strings: it hides the
// passwords of database, Redis and Prometheus URLs (postgres:// or key=value strings too)
// in what is shown (URL), and finds them (Secrets) to take them out of messages that may
// quote them (String), such as a parser's or a driver's error.
//
// It imports nothing of this module.
package redact
