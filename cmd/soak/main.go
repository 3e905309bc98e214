// Command soak runs the two-region stack (e2e/faults.Soak) at a fixed rate for a long time
// with a fault injected every interval, and reports whether the gateways' memory and
// goroutines stay flat: heap in use and resident memory over the last minute within
// 1.2 x of minute one, goroutines within 10% + 5. It exits 1 when they do not, or when
// any request got a 5xx. `make soak` runs it for 10 minutes; it is not part of CI.
//
//	go run ./cmd/soak -duration 10m -every 45s
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/quotaplane/quotaplane/e2e/faults"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := faults.Soak(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		stop()
		os.Exit(1)
	}
}
