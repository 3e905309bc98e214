package main

import (
	"context"
	"net/http"
	"time"
)

// regionLister is the part of the store /readyz asks.
type regionLister interface {
	Regions(ctx context.Context) ([]string, error)
}

// readyTimeout bounds one /readyz probe's database query.
const readyTimeout = 2 * time.Second

// readyHandler is /readyz: 200 once the control-plane database answers and holds at
// least one region row, as the gateways' /readyz; 503 with the reason otherwise (the
// reason never shows the URL). A rebalancer that is not ready writes nothing: each tick
// is skipped until the database is back or has regions.
func readyHandler(st regionLister) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		list, err := st.Regions(ctx)
		switch {
		case err != nil:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("database not reachable\n"))
		case len(list) == 0:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("no region rows: add regions with ratectl\n"))
		default:
			_, _ = w.Write([]byte("ready\n"))
		}
	}
}
