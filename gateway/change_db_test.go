package gateway

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// TestLoweredRefillHoldsFromTheChange: a tenant drains its bucket, its refill is lowered
// from 50/s to 0.5/s, and nobody calls that bucket for over a second. The bucket, which
// its old rule would have refilled in that second, holds what it held at the change plus
// the new refill since (the snapshot dates the change by the rule's row), not a full
// burst of 50. A sleep stands in for the idle time: Redis TIME, the buckets' clock,
// cannot be injected.
func TestLoweredRefillHoldsFromTheChange(t *testing.T) {
	app := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	key, _ := db.createKey(t, "shop")
	db.setRule(t, regions.Rule{Tenant: "shop", Route: "*", Capacity: 50, RefillPerSecond: 50})
	db.forgetRaises(t)
	rp := testenv.Redis(t)
	p := startProc(t, fmt.Sprintf(`region: us-east
mode: database
reload_interval: 1s
routes:
  - {id: search, match: "GET /search", upstream: %q}
  - {id: other, match: "GET /other", upstream: %q}
`, app.URL, app.URL), "RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	p.waitReady(t, 15*time.Second)

	burst := func(n int) int {
		ok := 0
		for range n {
			if resp, _ := call(t, http.MethodGet, p.url+"/search", key); resp.StatusCode == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	if got := burst(60); got < 50 {
		t.Fatalf("drain: %d of 60 admitted, want at least the capacity of 50", got)
	}
	drained := time.Now()
	db.setRule(t, regions.Rule{Tenant: "shop", Route: "*", Capacity: 50, RefillPerSecond: 0.5})
	changed := time.Now()
	// The reload, seen on another route's bucket (its window: 50 / 0.5 per s = 100 s).
	waitFor(t, 15*time.Second, "the lowered rule loaded", func() bool {
		resp, _ := call(t, http.MethodGet, p.url+"/other", key)
		return resp.Header.Get("RateLimit-Policy") == `"rate";q=50;w=100`
	})
	if idle := 1500*time.Millisecond - time.Since(drained); idle > 0 {
		time.Sleep(idle) // the old 50/s would refill the whole bucket in this time
	}
	got := burst(50)
	// What it held at the change (the old refill between the drain and the change), the
	// new refill since, and the one token a rounding may give.
	bound := 50*changed.Sub(drained).Seconds() + 0.5*time.Since(drained).Seconds() + 1
	if float64(got) > bound {
		t.Fatalf("after the lowering: %d of 50 admitted, want at most %.1f (the old rule refilled the idle bucket past the change)", got, bound)
	}
	t.Logf("after the lowering: %d admitted (bound %.1f)", got, bound)
}
