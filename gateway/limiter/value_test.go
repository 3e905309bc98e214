package limiter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// TestValueBucketsNest (issue 21 item 1): each distinct client value gets its own
// bucket of ValueLimit, nested inside the tenant's route bucket: a request is admitted
// only if both admit, so many values together never get past the tenant's limit (the
// issue: 165 admitted across values where the rule allowed 5). In Redis, in the
// fallback and in a Local limiter, under a key of bounded length whatever the value.
func TestValueBucketsNest(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	l := newTestRedis(t, rdb, Options{Timeout: time.Second})
	route := regions.Limit{Capacity: 5, RefillPerSecond: 0.0001}
	each := regions.Limit{Capacity: 3, RefillPerSecond: 0.0001}
	long := strings.Repeat("203.0.113.7/", 5000) // 60 kB
	values := []string{"198.51.100.1", "198.51.100.2", long, long + "x"}
	req := func(v string) Request {
		return Request{Tenant: "t", Route: "r", Limit: route, Value: v, ValueLimit: each, Shards: 4} // Shards are ignored
	}
	check := func(name string, decide func(Request) int) {
		t.Helper()
		got := []int{decide(req(values[0])), decide(req(values[1])), decide(req(values[2])), decide(req(values[3]))}
		if got[0] != 3 || got[1] != 2 || got[2] != 0 || got[3] != 0 {
			t.Errorf("%s: admitted %v per value, want [3 2 0 0]: each value's 3, and 5 in all", name, got)
		}
	}
	check("redis", func(r Request) int { return decideN(t, l, r, 10) })
	if n := decideN(t, l, Request{Tenant: "t", Route: "r", Limit: route}, 10); n != 0 {
		t.Errorf("the route without a value after its values spent its 5: admitted %d, want 0", n)
	}
	keys, err := rdb.Keys(context.Background(), "rl:{t}:r:v:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Errorf("value keys %v, want the 2 values that were admitted (a refused decision writes nothing)", keys)
	}
	for _, k := range keys {
		if len(k) > 64 {
			t.Errorf("value key %q is %d bytes, want bounded", k, len(k))
		}
	}

	loc := newTestLocal(t, LocalOptions{Now: newFakeClock().Now})
	check("local", func(r Request) int {
		n := 0
		for range 10 {
			if mustDecide(t, loc, r).Allowed {
				n++
			}
		}
		return n
	})

	fb, clock := unreachableRedis(t, 1, nil)
	for _, v := range values {
		decideN(t, fb, req(v), 1) // every fallback bucket starts empty...
	}
	clock.Advance(1e6 * time.Second) // ...and fills
	check("fallback", func(r Request) int { return decideN(t, fb, r, 10) })
}
