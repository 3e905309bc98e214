// Package store is the PostgreSQL store of the control-plane data (regions' model): every
// write one validated transaction, recorded by the schema's history and audit triggers
// with the actor and reason given to the method or by WithAudit; the bulk loader that
// builds a regions.Snapshot in one consistent read; heartbeats of gateway instances; the
// NOTIFY channel (NotifyChannel) and the Reloader through which gateways hold a Snapshot:
// loaded whole, validated, swapped atomically, reloaded on NOTIFY and on a timer; the
// declarative Config, planned and applied in one transaction, and its limits file
// (ParseLimits, MarshalLimits: the format of ratectl apply -f and export). Its errors
// never show a password of the database URL (RedactURL, URLSecrets: internal/redact).
//
// It imports regions (the model), migrations and internal/redact; never gateway,
// rebalancer or cmd.
package store
