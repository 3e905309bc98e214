package gateway

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// quotaConfig is shop-a's create-order rule of 2/s burst 4 with a calendar quota
// "month" of 5 per month (UTC), in the gateway's standalone YAML form.
func quotaConfig(upstream, redisURL string) Config {
	cfg := bandsConfig(upstream, redisURL)
	cfg.Tenants[0].Rules = []TenantRuleConfig{
		{Route: "create-order", Capacity: 4, RefillPerSecond: 2, Bands: []BandConfig{{Name: "month", Capacity: 5, Period: "month"}}},
	}
	return cfg
}

// TestQuotaEveryDoor (#24): a monthly quota of 5 at each door, on the standalone limiter
// with a fake clock in March 2027 (31 days: w=2678400): the policy lists the quota with
// its amount and its period, the 5th request leaves the quota closest to exhaustion (it is
// reported), the 6th is refused naming "month" with Retry-After the seconds to 1 April,
// and over RLS current_limit is the quota's 5 per MONTH.
func TestQuotaEveryDoor(t *testing.T) {
	up := newUpstream(t, 0)
	for _, door := range []string{"proxy", "check", "rls"} {
		t.Run(door, func(t *testing.T) {
			clock := newFakeClock()
			clock.ns.Store(time.Date(2027, 3, 31, 23, 0, 0, 0, time.UTC).UnixNano())
			gw := newInProcess(t, quotaConfig(up.URL, ""))
			local, err := limiter.NewLocal(limiter.LocalOptions{Region: "us-east", Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			gw.g.lim, gw.g.now = local, clock.Now
			ask := bandDoors(t, gw)[door]
			const policy = `"rate";q=4;w=2, "month";q=5;w=2678400`
			for i := range 5 {
				clock.Advance(time.Second) // the rate band refills: only the quota binds
				a := ask()
				if !a.allowed || a.hdr.Get("RateLimit-Policy") != policy {
					t.Fatalf("request %d: allowed %v, headers %v; want admitted with policy %s", i+1, a.allowed, a.hdr, policy)
				}
				if i == 4 && !strings.HasPrefix(a.hdr.Get("RateLimit"), `"month";r=0;`) {
					t.Errorf("5th request: RateLimit %q, want the quota with none left", a.hdr.Get("RateLimit"))
				}
			}
			clock.Advance(time.Second)
			a := ask()
			want := strconv.Itoa(3600 - 6) // seconds to 1 April 00:00
			if a.allowed || a.hdr.Get("RateLimit") != `"month";r=0;t=`+want || a.hdr.Get("Retry-After") != want || a.hdr.Get("X-RateLimit-Reset") != want {
				t.Fatalf("6th request: allowed %v, headers %v; want refused by \"month\" with Retry-After %s", a.allowed, a.hdr, want)
			}
			if st := a.status; st != nil && (st.CurrentLimit.GetRequestsPerUnit() != 5 || st.CurrentLimit.GetUnit().String() != "MONTH") {
				t.Errorf("RLS current_limit %v, want 5 per MONTH", st.CurrentLimit)
			}
			clock.Advance(time.Hour) // April: a new period, a new counter
			if a := ask(); !a.allowed || !strings.HasSuffix(a.hdr.Get("RateLimit-Policy"), `"month";q=5;w=2592000`) {
				t.Errorf("first request in April: allowed %v, policy %q; want admitted, w of 30 days", a.allowed, a.hdr.Get("RateLimit-Policy"))
			}
		})
	}
}

// TestQuotaRedisProxy: a quota of 5 a month on the region's Redis, through the proxy,
// under a rate band that never binds (100/s burst 100): exactly 5 of 8 requests are
// admitted, the other 3 refused naming "month".
func TestQuotaRedisProxy(t *testing.T) {
	up := newUpstream(t, 0)
	cfg := quotaConfig(up.URL, testenv.RedisURL(testenv.Redis(t)))
	cfg.Tenants[0].Rules[0].Capacity, cfg.Tenants[0].Rules[0].RefillPerSecond = 100, 100
	gw := newInProcess(t, cfg)
	ask := bandDoors(t, gw)["proxy"]
	admitted := 0
	for i := range 8 {
		a := ask()
		if a.allowed {
			admitted++
		} else if !strings.HasPrefix(a.hdr.Get("RateLimit"), `"month";r=0;`) {
			t.Errorf("request %d refused with RateLimit %q, want the quota's refusal", i+1, a.hdr.Get("RateLimit"))
		}
	}
	if admitted != 5 {
		t.Errorf("admitted %d, want the month's 5", admitted)
	}
}
