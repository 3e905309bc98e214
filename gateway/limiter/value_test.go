package limiter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// TestValueBuckets (issue 14, Request.Value): each distinct client value gets its own
// bucket of the rule's size, in Redis, in the fallback and in a Local limiter, under a
// key of bounded length whatever the value.
func TestValueBuckets(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	l := newTestRedis(t, rdb, Options{Timeout: time.Second})
	lim := regions.Limit{Capacity: 3, RefillPerSecond: 0.0001}
	long := strings.Repeat("203.0.113.7/", 5000) // 60 kB
	values := []string{"198.51.100.1", "198.51.100.2", long, long + "x"}
	for _, v := range values {
		r := Request{Tenant: "t", Route: "r", Limit: lim, Value: v, Shards: 4} // Shards are ignored
		if n := decideN(t, l, r, 10); n != 3 {
			t.Errorf("value %.20q: admitted %d, want its own 3", v, n)
		}
	}
	if n := decideN(t, l, Request{Tenant: "t", Route: "r", Limit: lim}, 10); n != 3 {
		t.Errorf("the route without a value: admitted %d, want its own 3", n)
	}
	keys, err := rdb.Keys(context.Background(), "rl:{t}:r:v:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(values) {
		t.Errorf("value keys %v, want %d", keys, len(values))
	}
	for _, k := range keys {
		if len(k) > 64 {
			t.Errorf("value key %q is %d bytes, want bounded", k, len(k))
		}
	}

	// The Local limiter, and so the fallback, key by the value too.
	loc := newTestLocal(t, LocalOptions{Now: newFakeClock().Now})
	for _, v := range values {
		admitted := 0
		for range 10 {
			if mustDecide(t, loc, Request{Tenant: "t", Route: "r", Limit: lim, Value: v}).Allowed {
				admitted++
			}
		}
		if admitted != 3 {
			t.Errorf("local, value %.20q: admitted %d, want 3", v, admitted)
		}
	}
	fb := unreachableRedis(t, 1, nil)
	for _, v := range values[:2] {
		if n := decideN(t, fb, Request{Tenant: "t", Route: "r", Limit: lim, Value: v}, 10); n != 3 {
			t.Errorf("fallback, value %q: admitted %d, want 3", v, n)
		}
	}
}
