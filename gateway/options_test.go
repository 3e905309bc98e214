package gateway

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRegistererWithoutGatherer: a Registerer that cannot gather (a wrapped one) needs
// the Gatherer that shows its series; /metrics must never fall back to the global
// registry, which has none of the gateway's series.
func TestRegistererWithoutGatherer(t *testing.T) {
	reg := prometheus.NewRegistry()
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"pod": "p1"}, reg)
	cfg := articleConfig("us-east", "http://127.0.0.1:1", "")

	if _, err := New(cfg, Options{Registerer: wrapped}); err == nil || !strings.Contains(err.Error(), "Gatherer") {
		t.Fatalf("New with a Registerer that is not a Gatherer and no Gatherer = %v, want an error", err)
	}

	g, err := New(cfg, Options{Registerer: wrapped, Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	admin := httptest.NewServer(g.AdminHandler())
	defer admin.Close()
	if got := scrapeURL(t, admin.URL).series("ratelimit_requests_total", "pod", "p1"); got == 0 {
		t.Fatal("/metrics does not serve the gateway's series from the given Gatherer")
	}
}
