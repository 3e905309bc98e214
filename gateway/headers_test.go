package gateway

import (
	"net/http"
	"testing"
	"time"
)

func TestRateHeaders(t *testing.T) {
	tests := []struct {
		name                        string
		capacity                    int64
		refill                      float64
		remaining                   int64
		resetAfter, retryAfter      time.Duration
		throttled                   bool
		limit, rem, policy, rl, ret string
	}{
		{
			name: "allowed, bucket refilling", capacity: 2, refill: 1, remaining: 1, resetAfter: 1500 * time.Millisecond,
			limit: "2", rem: "1", policy: `"default";q=2;w=2`, rl: `"default";r=1;t=2`,
		},
		{
			name: "allowed, bucket full", capacity: 200, refill: 100, remaining: 200,
			limit: "200", rem: "200", policy: `"default";q=200;w=2`, rl: `"default";r=200;t=0`,
		},
		{
			name: "throttled: t equals Retry-After, rounded up", capacity: 2, refill: 1, remaining: 0,
			resetAfter: 2 * time.Second, retryAfter: 1100 * time.Millisecond, throttled: true,
			limit: "2", rem: "0", policy: `"default";q=2;w=2`, rl: `"default";r=0;t=2`, ret: "2",
		},
		{
			name: "throttled: Retry-After at least 1", capacity: 10, refill: 1000, retryAfter: time.Millisecond, throttled: true,
			limit: "10", rem: "0", policy: `"default";q=10;w=1`, rl: `"default";r=0;t=1`, ret: "1",
		},
		{
			name: "fractional refill gives a long window", capacity: 3, refill: 0.1, remaining: 3,
			limit: "3", rem: "3", policy: `"default";q=3;w=30`, rl: `"default";r=3;t=0`,
		},
		{
			name: "negative remaining is clamped", capacity: 1, refill: 1, remaining: -4,
			limit: "1", rem: "0", policy: `"default";q=1;w=1`, rl: `"default";r=0;t=0`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			newRateHeaders(tt.capacity, tt.refill, tt.remaining, tt.resetAfter, tt.retryAfter, tt.throttled).write(h)
			for name, want := range map[string]string{
				"X-RateLimit-Limit": tt.limit, "X-RateLimit-Remaining": tt.rem,
				"RateLimit-Policy": tt.policy, "RateLimit": tt.rl, "Retry-After": tt.ret,
			} {
				if got := h.Get(name); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
				if len(h.Values(name)) > 1 {
					t.Errorf("%s set %d times", name, len(h.Values(name)))
				}
			}
		})
	}
}

func TestRateHeadersAllocations(t *testing.T) {
	h := http.Header{}
	rh := newRateHeaders(200, 100, 153, time.Second, 0, false)
	if n := testing.AllocsPerRun(100, func() { rh.write(h) }); n > 2 {
		t.Fatalf("write allocates %v times, want <= 2", n)
	}
}
