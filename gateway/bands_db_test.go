package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestBandsFromDatabase is issue #24's plan in a gateway in database mode: plan pro is
// 100/s burst 200 and 10,000 per hour; its tenant's responses list both bands, and a
// tenant's own rule without bands still reads as before (the policy named "rate").
func TestBandsFromDatabase(t *testing.T) {
	app := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	ctx := store.WithAudit(context.Background(), "test", "bands")
	pro := regions.Rule{Plan: "pro", Tenant: "*", Route: "*", Capacity: 200, RefillPerSecond: 100,
		Bands: []regions.Band{{Name: "hour", Capacity: 10000, RefillPerSecond: 10000.0 / 3600}}}
	if err := db.store.SetPlanRule(ctx, pro); err != nil {
		t.Fatal(err)
	}
	if err := db.store.AssignPlan(ctx, "shop-a", "pro"); err != nil {
		t.Fatal(err)
	}
	keyA, _ := db.createKey(t, "shop-a")
	keyB, _ := db.createKey(t, "shop-b")
	db.setRule(t, regions.Rule{Tenant: "shop-b", Route: "*", Capacity: 2, RefillPerSecond: 1})
	db.forgetRaises(t)
	rp := testenv.Redis(t)
	p := startProc(t, fmt.Sprintf(`region: us-east
mode: database
reload_interval: 1s
routes:
  - {id: search, match: "GET /search", upstream: %q}
`, app.URL), "RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	p.waitReady(t, 15*time.Second)

	resp, body := call(t, http.MethodGet, p.url+"/search", keyA)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("shop-a: %d %s", resp.StatusCode, body)
	}
	if got, want := resp.Header.Get("RateLimit-Policy"), `"rate";q=200;w=2, "hour";q=10000;w=3600`; got != want {
		t.Errorf("shop-a: RateLimit-Policy %q, want %q", got, want)
	}
	// 199 of 200 left in the burst, 9,999 of 10,000 in the hour: the rule's own bucket
	// has the fewest tokens left.
	if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, `"rate";r=199;t=`) || resp.Header.Get("X-RateLimit-Reset") == "" {
		t.Errorf("shop-a: RateLimit %q, X-RateLimit-Reset %q", got, resp.Header.Get("X-RateLimit-Reset"))
	}
	resp, body = call(t, http.MethodGet, p.url+"/search", keyB)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("shop-b: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"rate";q=2;w=2` {
		t.Errorf("shop-b (no bands): RateLimit-Policy %q", got)
	}
	if got := resp.Header.Get("RateLimit"); got != `"rate";r=1;t=1` || resp.Header.Get("X-RateLimit-Reset") != "1" {
		t.Errorf("shop-b (no bands): RateLimit %q, X-RateLimit-Reset %q", got, resp.Header.Get("X-RateLimit-Reset"))
	}
}
