// Package migrations owns the PostgreSQL schema of the control plane: goose SQL migrations
// embedded in the binary, and Up/Down/Status helpers that run them through goose's Provider
// API with a session advisory lock, so several processes may migrate at once safely.
//
// The schema (see the .sql files): rate_limit_rule, api_key, region, region_share,
// region_share_history, gateway_instance and audit_log, with CHECK constraints on every id
// and number, one NOTIFY channel (NotifyChannel) fired on every change of rules, keys,
// regions and shares, a trigger that writes region_share_history for every share change,
// and one that writes audit_log for every change of rules, keys and regions. Writers name
// themselves through the transaction-local settings quotaplane.actor, quotaplane.reason
// and quotaplane.inputs (see SettingActor); since 00009 the actor is the connected role
// (session_user) and the name they give is kept as on_behalf_of. 00009 also creates the
// group roles of the components (RoleGateway, RoleRebalancer, RoleOperator) with their
// grants, and makes audit_log and region_share_history append-only for every role.
// 00013 adds calendar quota bands and quota_usage, what each region has counted of each
// quota period (written by the gateways, pruned by the rebalancer).
// DownChecked rolls back one step unless it would lose data, remove a protection or pull
// the schema from under live gateways (down.go).
//
// It imports nothing from this module; only regions and cmd/ratectl import it.
package migrations
