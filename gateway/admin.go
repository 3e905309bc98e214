package gateway

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newAdminHandler serves /metrics, /healthz (alive) and /readyz (a snapshot is loaded
// and the gateway is not draining).
func (g *Gateway) newAdminHandler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch {
		case g.ready.isDraining():
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("draining\n"))
		case g.snap.Load() == nil:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("no snapshot loaded yet\n"))
		default:
			_, _ = w.Write([]byte("ready\n"))
		}
	})
	return mux
}
