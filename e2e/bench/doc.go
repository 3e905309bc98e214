// Command bench is `make bench`: the end-to-end benchmark suite. In one run on one machine
// it measures the gateway's overhead (a fast upstream reached directly, through a bare
// httputil.ReverseProxy and through real gateway processes: local limiting, Redis
// limiting, the Redis-down fallback) at fixed rates and at the highest rate each
// sustains with p99 < 10 ms; runs the decision-engine, peer (go-redis/redis_rate) and
// Redis-ceiling benchmarks of gateway/limiter and the hot-path benchmarks of lua and
// gateway from their compiled test binaries; measures the Redis ceiling of each script
// (ours, the article's, redis_rate's, many buckets per call) with redis-benchmark;
// measures memory (Redis bytes per bucket, gateway RSS with 100k tenants and 1M keys,
// snapshot reload time), accuracy at scale (20 limiter instances on one Redis) and CPU
// and allocation profiles of a loaded gateway. It writes every figure, with medians of
// -runs runs and their min-max, to a results file (docs/bench/results.json) and renders
// the documents from it (e2e/bench/results): it prints no document text itself.
//
//	go run ./cmd/bench [-runs 3] [-quick] [-phases overhead,engine,...] [-results FILE] [-out FILE]
//	go run ./cmd/bench -render
//
// The only file that uses lua's script API is luaapi.go (what our script is called
// with, how many keys a bucket holds): the one to change with the scripts.
//
// Everything runs on servers it starts on loopback ports (internal/testenv), loads only
// loopback addresses (e2e/loadgen) and is bounded in time. The program, built once
// per run, also serves as its own echo upstream, bare reverse proxy and profiled gateway (child processes
// selected by the QUOTAPLANE_BENCH_CHILD environment variable).
//
// It is a program: nothing imports it. It may import e2e/bench/results,
// internal/testenv, e2e/loadgen, gateway, gateway/limiter, regions and lua (and
// go-redis/redis_rate, the peer it is compared with); none of them may import it.
package bench
