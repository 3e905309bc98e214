// Package torture is the randomized fault-and-change checker of issues 14 and 21: on the
// real two-region stack (e2e/stack: two Redis, PostgreSQL, four gateways, each with
// nginx in front of its /v1/check, the rebalancer) it runs a schedule drawn from a seed
// of faults (Redis stalls, kills, a black-hole or slow proxy between a gateway and its
// Redis, PostgreSQL kills, an evicting Redis policy), of what operators do to the fleet
// during and right after Redis faults (gateway restarts and kills, rolling restarts,
// scale-outs and scale-ins, a region removed and added back) and of changes (rules up
// and down and deleted, shards, share overrides); sends bounded load to every gateway,
// with a hostile client at every door (the proxy, nginx + /v1/check, the RLS gRPC
// service) that spells routes, limit_by values and client addresses its own ways;
// records every admitted request with its send and receive time; and checks the limit
// invariant of DESIGN.md over every window, with exactly the slack docs/reliability.md
// states and nothing more. The fallback terms of that slack are computed from each
// gateway's breaker-open spans, read from its own log.
//
// The schedule is a pure function of the seed (Generate), so a failing seed replays:
//
//	go test -count=1 -run 'TestTorture/seed=N$' ./e2e/torture/ -seed N
//
// The invariant checker (Check) and the log parser (ParseBreakerLog, BreakerSpans) are
// pure too and have their own unit tests. Everything runs on loopback addresses in
// bounded time.
package torture
