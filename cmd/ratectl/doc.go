// Command ratectl is the operator CLI of the control plane: regions, shares, rules, API
// keys, live status from Prometheus, the Redis bucket of one tenant, and the trace
// simulator of the rebalancer.
//
// It is wiring only: the cobra tree is built by newRootCmd from an app (clock, OS user,
// environment, output streams) so every command runs in-process in tests; main sets up
// signals and turns the returned error into one line on stderr and an exit code:
//
//	0  success
//	1  the operation failed (for example a row that does not exist)
//	2  usage: a bad flag, argument or value (bad id, shares not summing to 1, ...)
//	3  a dependency is unreachable: PostgreSQL, Prometheus or Redis
//
// except for `diff --exit-code`, for CI: 0 no change, 2 changes, 1 any error.
//
// The database URL, passwords and API key secrets never appear in its errors or logs.
// It imports regions, migrations, lua, rebalancer/sim and rebalancer/demand (the
// offered-demand query it shares with the rebalancer); nothing imports it.
package main
