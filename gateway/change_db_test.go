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
// from 5/s to 0.1/s, and nobody calls that bucket for 6 s, in which its old rule would
// refill 30 of its 50 (its key lives until the old rule fills it, 10 s). The bucket refills at the old rate only until the change is in force
// everywhere (the rule row's date plus one reload lag L, 2 s here: the old rule may be
// enforced that long) and at the new one since: about 10.6 tokens, not 30. A sleep stands in
// for the idle time: Redis TIME, the buckets' clock, cannot be injected.
func TestLoweredRefillHoldsFromTheChange(t *testing.T) {
	app := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	key, _ := db.createKey(t, "shop")
	db.setRule(t, regions.Rule{Tenant: "shop", Route: "*", Capacity: 50, RefillPerSecond: 5})
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
	db.setRule(t, regions.Rule{Tenant: "shop", Route: "*", Capacity: 50, RefillPerSecond: 0.1})
	changed := time.Now()
	// The reload, seen on another route's bucket (its window: 50 / 0.1 per s = 500 s).
	waitFor(t, 15*time.Second, "the lowered rule loaded", func() bool {
		resp, _ := call(t, http.MethodGet, p.url+"/other", key)
		return resp.Header.Get("RateLimit-Policy") == `"rate";q=50;w=500`
	})
	if idle := 6*time.Second - time.Since(drained); idle > 0 {
		time.Sleep(idle) // the old 5/s would refill 30 tokens
	}
	got := burst(50)
	// The old refill from the drain until L after the change, the new one since, and the
	// one token a rounding may give.
	const lag = 2 * time.Second // reload_interval 1s + 1 s
	bound := 5*(changed.Sub(drained)+lag).Seconds() + 0.1*time.Since(drained).Seconds() + 1
	if float64(got) > bound {
		t.Fatalf("after the lowering: %d of 50 admitted, want at most %.1f (the old rule refilled the idle bucket past the change)", got, bound)
	}
	t.Logf("after the lowering: %d admitted (bound %.1f)", got, bound)
}
