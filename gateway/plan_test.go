package gateway

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestPlanRuleBucketsPerTenant: a plan is a template, not a shared bucket. Two tenants
// on plan pro (capacity 2) each get two requests from a gateway in database mode, in
// buckets of their own (rl:{tenant}:route, the request's tenant); a tenant's own rule
// wins over the plan's.
func TestPlanRuleBucketsPerTenant(t *testing.T) {
	app := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	ctx := store.WithAudit(context.Background(), "test", "plans")
	if err := db.store.SetPlanRule(ctx, regions.Rule{Plan: "pro", Tenant: "*", Route: "*", Capacity: 2, RefillPerSecond: 0.001}); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, tenant := range []string{"shop-a", "shop-b", "shop-c"} {
		if err := db.store.AssignPlan(ctx, tenant, "pro"); err != nil {
			t.Fatal(err)
		}
		keys[tenant], _ = db.createKey(t, tenant)
	}
	db.setRule(t, regions.Rule{Tenant: "shop-c", Route: "*", Capacity: 4, RefillPerSecond: 0.001})
	db.forgetRaises(t)
	rp := testenv.Redis(t)
	p := startProc(t, fmt.Sprintf(`region: us-east
mode: database
reload_interval: 1s
routes:
  - {id: create-order, match: "POST /orders", upstream: %q}
`, app.URL), "RATELIMIT_DATABASE_URL="+db.url, "RATELIMIT_REDIS_URL="+testenv.RedisURL(rp))
	p.waitReady(t, 15*time.Second)

	admitted := func(tenant string) int {
		n := 0
		for range 6 {
			resp, _ := call(t, http.MethodPost, p.url+"/orders", keys[tenant])
			if resp.StatusCode == http.StatusOK {
				n++
			}
		}
		return n
	}
	for tenant, want := range map[string]int{"shop-a": 2, "shop-b": 2, "shop-c": 4} {
		if got := admitted(tenant); got != want {
			t.Errorf("%s admitted %d of 6, want %d", tenant, got, want)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	defer rdb.Close()
	for _, tenant := range []string{"shop-a", "shop-b", "shop-c"} {
		k := "rl:{" + tenant + "}:create-order"
		if n, err := rdb.Exists(context.Background(), k).Result(); err != nil || n != 1 {
			t.Errorf("bucket %s: exists %d, %v; want the tenant's own", k, n, err)
		}
	}
	if n, _ := rdb.Exists(context.Background(), "rl:{pro}:create-order", "rl:{*}:create-order").Result(); n != 0 {
		t.Errorf("a bucket named after the plan or the wildcard exists")
	}
}
