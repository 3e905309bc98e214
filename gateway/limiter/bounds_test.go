package limiter

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// TestBounds (issue 14 item 5): the stated upper bounds agree between the model and the
// scripts; a rule at them is decided by Redis exactly to the token (no fail-open); a
// rule past them is an invalid request, and regions.Scale of MaxInt64 is the maximum,
// not 1 token.
func TestBounds(t *testing.T) {
	if regions.MaxCapacity != lua.MaxCapacity || regions.MaxRefillPerSecond != lua.MaxRefill {
		t.Fatalf("regions bounds %d, %d differ from lua's %d, %d", int64(regions.MaxCapacity), int64(regions.MaxRefillPerSecond), int64(lua.MaxCapacity), int64(lua.MaxRefill))
	}
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{Timeout: time.Second})
	ctx := context.Background()
	top := regions.Limit{Capacity: regions.MaxCapacity, RefillPerSecond: 0.000001}
	steps := []struct {
		cost          int64
		allowed       bool
		remaining     int64
		alsoRemaining int64
	}{
		{regions.MaxCapacity - 1, true, 1, 1},
		{1, true, 0, 0},
		{1, false, 0, 0},
	}
	for i, s := range steps {
		d := mustDecide(t, l, Request{Tenant: "t", Route: "top", Limit: top, Cost: s.cost})
		if d.Source != SourceRedis || d.Allowed != s.allowed || d.Remaining != s.remaining {
			t.Fatalf("step %d at MaxCapacity: %+v, want allowed %v with %d left, from redis", i, d, s.allowed, s.remaining)
		}
	}
	fast := regions.Limit{Capacity: 10, RefillPerSecond: regions.MaxRefillPerSecond}
	if d := mustDecide(t, l, Request{Tenant: "t", Route: "fast", Limit: fast}); !d.Allowed || d.Source != SourceRedis {
		t.Fatalf("a rule at MaxRefillPerSecond: %+v, want allowed by redis", d)
	}
	for _, lim := range []regions.Limit{
		{Capacity: regions.MaxCapacity + 1, RefillPerSecond: 1},
		{Capacity: 1, RefillPerSecond: regions.MaxRefillPerSecond * 2},
	} {
		if _, err := l.Decide(ctx, Request{Tenant: "t", Route: "r", Limit: lim}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: %v, want ErrInvalidRequest", lim, err)
		}
	}
	if got := regions.Scale(math.MaxInt64, 1, 0.5); got.Capacity != regions.MaxCapacity {
		t.Errorf("Scale(MaxInt64, 1, 0.5) = %+v, want the maximum capacity", got)
	}
}

// TestLoadWarnsOfEvictingPolicy (issue 14 item 8): Load reads maxmemory-policy; an
// evicting one is a loud warning and ratelimit_redis_evicting_policy 1.
func TestLoadWarnsOfEvictingPolicy(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	ctx := context.Background()
	for _, tt := range []struct {
		policy string
		want   float64
	}{
		{"allkeys-lru", 1},
		{"volatile-ttl", 1},
		{"noeviction", 0},
	} {
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", tt.policy).Err(); err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		var logs bytes.Buffer
		l := newTestRedis(t, rdb, Options{Region: "test", Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err := l.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if v := metricValue(t, reg, "ratelimit_redis_evicting_policy", nil); v != tt.want {
			t.Errorf("%s: ratelimit_redis_evicting_policy = %v, want %v", tt.policy, v, tt.want)
		}
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), tt.policy)
		if warned != (tt.want == 1) {
			t.Errorf("%s: warned %v; logs %q", tt.policy, warned, logs.String())
		}
	}
}

// TestCheckEvictionFollowsConfigSet: a policy changed with CONFIG SET after Load shows at
// the next CheckEviction, in the gauge and with one WARN line per change to evicting
// (not one per check).
func TestCheckEvictionFollowsConfigSet(t *testing.T) {
	p := testenv.Redis(t)
	rdb := newClient(t, p)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	l := newTestRedis(t, rdb, Options{Region: "test", Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		policy string
		want   float64
	}{
		{"allkeys-lru", 1}, {"allkeys-lru", 1}, {"volatile-lru", 1}, {"noeviction", 0}, {"allkeys-random", 1},
	} {
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", step.policy).Err(); err != nil {
			t.Fatal(err)
		}
		l.CheckEviction(ctx)
		if v := metricValue(t, reg, "ratelimit_redis_evicting_policy", nil); v != step.want {
			t.Errorf("step %d (%s): ratelimit_redis_evicting_policy = %v, want %v", i, step.policy, v, step.want)
		}
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 {
		t.Errorf("%d WARN lines, want 2 (one per change to evicting); logs:\n%s", n, logs.String())
	}
}
