// Command bench is `make bench`: the end-to-end benchmark suite. In one run on one machine
// it measures the gateway's overhead (a fast upstream reached directly and through real
// gateway processes: local limiting, Redis limiting, the Redis-down fallback) at fixed
// rates and at the highest rate each sustains with p99 < 10 ms; runs the decision-engine,
// peer (go-redis/redis_rate) and Redis-ceiling benchmarks of gateway/limiter and the
// hot-path benchmarks of lua and gateway from their compiled test binaries; measures
// memory (Redis bytes per bucket, gateway RSS with 100k tenants and 1M keys, snapshot
// reload time), accuracy at scale (20 limiter instances on one Redis) and CPU and
// allocation profiles of a loaded gateway; and rewrites docs/BENCHMARKS.md and the
// headline table of README.md with medians of -runs runs and their min-max.
//
//	go run ./cmd/bench [-runs 3] [-quick] [-out FILE] [-phases overhead,engine,...]
//
// Everything runs on servers it starts on loopback ports (internal/testenv), loads only
// loopback addresses (e2e/loadgen) and is bounded in time. The program, built once
// per run, also serves as its own echo upstream and profiled gateway (child processes
// selected by the QUOTAPLANE_BENCH_CHILD environment variable).
//
// It is a program: nothing imports it. It may import internal/testenv, e2e/loadgen,
// gateway, gateway/limiter, regions and lua (and go-redis/redis_rate, the peer it is
// compared with); none of them may import it.
package bench
