// Command bench runs the benchmark suite (e2e/bench) and rewrites docs/BENCHMARKS.md and
// the README's headline table. `make bench` runs it with -runs 3.
//
//	go run ./cmd/bench [-runs 3] [-quick] [-out FILE] [-phases overhead,engine,...]
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
