// Command bench runs the benchmark suite (e2e/bench): it writes docs/bench/results.json
// and renders docs/BENCHMARKS.md, the README's headline and docs/proxies.md's figures
// from the results files (e2e/bench/results). `make bench` runs it with -runs 3; -render
// renders the documents again without measuring (`make bench-render`).
//
//	go run ./cmd/bench [-runs 3] [-quick] [-phases overhead,engine,...] [-results FILE] [-out FILE]
//	go run ./cmd/bench -render [-results FILE -out FILE]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/quotaplane/quotaplane/e2e/bench"
)

func main() {
	if kind := bench.ChildKind(); kind != "" {
		if err := bench.RunChild(kind); err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.Run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}
