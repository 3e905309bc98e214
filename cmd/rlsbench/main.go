// Command rlsbench is `make bench-rls`: the gateway's Envoy rate-limit service side by
// side with envoyproxy/ratelimit, and nginx + /v1/check vs nginx alone (e2e/rlsbench): it
// writes docs/bench/rls.json and renders the benchmark documents again.
//
//	go run ./cmd/rlsbench [-duration 10s] [-keys 100000] [-callers 16,64] [-quiet 2m] [-out docs/bench/rls.json]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/quotaplane/quotaplane/e2e/rlsbench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rlsbench.Run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		stop()
		os.Exit(1)
	}
}
