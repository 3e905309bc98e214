package gateway

import (
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

// TestFailedNewUnregisters: a New that fails after registering its metrics (here at the
// Redis URL) unregisters them, so New with a fixed config succeeds on the same registry.
func TestFailedNewUnregisters(t *testing.T) {
	reg := prometheus.NewRegistry()
	bad := articleConfig("us-east", "http://127.0.0.1:1", "redis://127.0.0.1:6379/notanumber")
	if _, err := New(bad, Options{Registerer: reg}); err == nil {
		t.Fatal("New accepted a Redis URL with a bad database number")
	}
	if fams, err := reg.Gather(); err != nil || len(fams) != 0 {
		t.Fatalf("after a failed New the registry has %d families (%v), want none", len(fams), err)
	}
	good := articleConfig("us-east", "http://127.0.0.1:1", "redis://127.0.0.1:6379/0")
	g, err := New(good, Options{Registerer: reg})
	if err != nil {
		t.Fatalf("New after a failed New on the same registry: %v", err)
	}
	g.closeClients()
}

// TestReloadRacingDrainStaysNotReady: snapshot swaps racing the start of the drain never
// leave ratelimit_gateway_ready at 1 once draining.
func TestReloadRacingDrainStaysNotReady(t *testing.T) {
	cfg := articleConfig("us-east", "http://127.0.0.1:1", "")
	for i := range 300 {
		reg := prometheus.NewRegistry()
		g, err := New(cfg, Options{Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		s := g.snap.Load()
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				<-start
				for range 20 {
					g.setSnapshot(s)
				}
			})
		}
		wg.Go(func() { <-start; g.startDraining() })
		close(start)
		wg.Wait()
		if v := testutil.ToFloat64(g.m.ready); v != 0 {
			t.Fatalf("round %d: ratelimit_gateway_ready = %v after the drain started, want 0", i, v)
		}
	}
}
