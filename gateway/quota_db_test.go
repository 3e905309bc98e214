package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestQuotaTwoRegions (#24): one daily quota of 40 for two regions (share 0.5 each, each
// its own Redis, one PostgreSQL), their gateways syncing usage every 200 ms. us-east alone
// takes far more than its half (the budget goes where the traffic is: its allowance grows
// as eu-west's usage stays 0), and what eu-west then admits brings the fleet to at most
// 40: requests one after the other, so the count each region decides with is never
// behind by an admission (the slack term is 0). Then an operator moves the shares to
// 0.9/0.1 mid-period and a new day-long quota of 40 on another route is run the same way
// from eu-west: the total stays at most 40 again.
func TestQuotaTwoRegions(t *testing.T) {
	app := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east", "eu-west")
	ctx := store.WithAudit(context.Background(), "test", "quota")
	for _, route := range []string{"search", "export"} {
		db.setRule(t, regions.Rule{Tenant: "shop-a", Route: route, Capacity: 100000, RefillPerSecond: 100000, Shards: 1,
			Bands: []regions.Band{{Name: "day", Capacity: 40, Period: regions.PeriodDay}}})
	}
	db.setRule(t, regions.Rule{Tenant: "shop-b", Route: "search", Capacity: 100000, RefillPerSecond: 100000, Shards: 1})
	key, _ := db.createKey(t, "shop-a")
	probe, _ := db.createKey(t, "shop-b")
	db.forgetRaises(t)
	gw := map[string]*proc{}
	for _, region := range []string{"us-east", "eu-west"} {
		gw[region] = startProc(t, fmt.Sprintf(`region: %s
mode: database
reload_interval: 1s
quota_sync_interval: 200ms
redis: {timeout: 500ms}
routes:
  - {id: search, match: "GET /search", upstream: %q}
  - {id: export, match: "GET /export", upstream: %q}
`, region, app.URL, app.URL), "RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(testenv.Redis(t)))
	}
	for region, p := range gw {
		p.waitReady(t, 15*time.Second)
		// The regions' shares were just written: each region enforces its half once the
		// other's gateway has acknowledged it (regions.Snapshot.Pending). Probed with
		// shop-b, which has no quota to spend.
		waitFor(t, 20*time.Second, region+" enforcing its share", func() bool {
			resp, _ := call(t, http.MethodGet, p.url+"/search", probe)
			return resp.Header.Get("RateLimit-Policy") == `"rate";q=50000;w=1`
		})
	}
	// drive sends n requests to region's gateway, 20 ms apart (ten syncs a second: the
	// allowance follows), and returns how many were admitted; every refusal names the
	// quota.
	var firstRetry, lastRetry string // Retry-After of the first and the last refusal
	drive := func(region, path string, n int) int {
		admitted := 0
		for i := range n {
			resp, body := call(t, http.MethodGet, gw[region].url+path, key)
			switch {
			case resp.StatusCode == http.StatusOK:
				admitted++
			case resp.StatusCode != http.StatusTooManyRequests:
				t.Fatalf("%s %s request %d: %d %s", region, path, i+1, resp.StatusCode, body)
			case !strings.HasPrefix(resp.Header.Get("RateLimit"), `"day";r=0;`):
				t.Fatalf("%s %s request %d refused with headers %v, want the quota's refusal", region, path, i+1, resp.Header)
			default:
				if firstRetry == "" {
					firstRetry = resp.Header.Get("Retry-After")
				}
				lastRetry = resp.Header.Get("Retry-After")
			}
			time.Sleep(20 * time.Millisecond) // pacing the load, not waiting for a state
		}
		return admitted
	}
	settle := func() {
		t.Helper()
		// Both regions' counts are in the store and read back: three sync intervals.
		time.Sleep(600 * time.Millisecond) // pacing: the sync runs on its own timer
	}
	east := drive("us-east", "/search", 60)
	// Refused once its share of the 1 left rounds down to nothing: its allowance cannot
	// grow, so Retry-After runs to midnight (UTC), not to the next sync.
	_, midnight := regions.Band{Name: "day", Capacity: 40, Period: regions.PeriodDay}.Window(time.Now())
	if n, _ := strconv.Atoi(lastRetry); n < int(time.Until(midnight).Seconds())-5 {
		t.Errorf("us-east refused with Retry-After %q (first %q), want the seconds to midnight (%v)", lastRetry, firstRetry, time.Until(midnight).Round(time.Second))
	}
	settle()
	west := drive("eu-west", "/search", 30)
	t.Logf("search: us-east admitted %d, eu-west %d of a day's 40", east, west)
	if east <= 20 {
		t.Errorf("us-east admitted %d, want more than its half (20): eu-west used nothing", east)
	}
	if east+west > 40 {
		t.Errorf("the fleet admitted %d + %d = %d, want at most the budget of 40", east, west, east+west)
	}
	// A gateway of a region the database does not know would get an equal split on top of
	// the known regions' shares: it admits nothing of a quota.
	ap := startProc(t, fmt.Sprintf(`region: ap-south
mode: database
quota_sync_interval: 200ms
redis: {timeout: 500ms}
routes:
  - {id: export, match: "GET /export", upstream: %q}
`, app.URL), "RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(testenv.Redis(t)))
	ap.waitReady(t, 15*time.Second)
	gw["ap-south"] = ap
	if n := drive("ap-south", "/export", 5); n != 0 { // export's quota is untouched yet
		t.Errorf("a gateway of region ap-south, unknown to the database, admitted %d of a quota", n)
	}
	if err := db.store.SetOverride(ctx, regions.Scope{Tenant: "shop-a"}, map[string]float64{"us-east": 0.9, "eu-west": 0.1}, "test", "quota test", time.Hour); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // pacing: both gateways reload the new shares (reload_interval 1s)
	west = drive("eu-west", "/export", 30)
	settle()
	east = drive("us-east", "/export", 60)
	t.Logf("export at 0.9/0.1: eu-west admitted %d, us-east %d of a day's 40", west, east)
	if west <= 4 || east+west > 40 {
		t.Errorf("export: eu-west %d (want more than its 0.1 of 40), total %d (want at most 40)", west, east+west)
	}
}
