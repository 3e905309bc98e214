// Package torture is the randomized fault-and-change checker of issue 14: on the real
// two-region stack (e2e/stack: two Redis, PostgreSQL, four gateways, the rebalancer)
// it runs a schedule of faults (Redis stalls, kills, a black-hole or slow proxy between a
// gateway and its Redis, PostgreSQL kills, gateway restarts) and changes (rules up and
// down, shards, share overrides) drawn from a seed, sends bounded load to every gateway,
// records every admitted request with its send and receive time, and checks the limit
// invariant of DESIGN.md over every window, with the slack docs/reliability.md states.
//
// The schedule is a pure function of the seed (Generate), so a failing seed replays:
//
//	go test -count=1 -run 'TestTorture/seed' ./e2e/torture/ -seed N
//
// The invariant checker (Check) is pure too and has its own unit test. Everything runs on
// loopback addresses in bounded time.
package torture
