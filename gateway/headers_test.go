package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/gateway/limiter"
)

func TestRateHeaders(t *testing.T) {
	tests := []struct {
		name                               string
		capacity                           int64
		refill                             float64
		remaining                          int64
		resetAfter, retryAfter             time.Duration
		throttled                          bool
		limit, rem, policy, rl, ret, reset string
	}{
		{
			name: "allowed, bucket refilling", capacity: 2, refill: 1, remaining: 1, resetAfter: 1500 * time.Millisecond,
			limit: "2", rem: "1", policy: `"rate";q=2;w=2`, rl: `"rate";r=1;t=2`, reset: "2",
		},
		{
			name: "allowed, bucket full", capacity: 200, refill: 100, remaining: 200,
			limit: "200", rem: "200", policy: `"rate";q=200;w=2`, rl: `"rate";r=200;t=0`, reset: "0",
		},
		{
			name: "throttled: t equals Retry-After, rounded up", capacity: 2, refill: 1, remaining: 0,
			resetAfter: 2 * time.Second, retryAfter: 1100 * time.Millisecond, throttled: true,
			limit: "2", rem: "0", policy: `"rate";q=2;w=2`, rl: `"rate";r=0;t=2`, reset: "2", ret: "2",
		},
		{
			name: "throttled: Retry-After at least 1", capacity: 10, refill: 1000, retryAfter: time.Millisecond, throttled: true,
			limit: "10", rem: "0", policy: `"rate";q=10;w=1`, rl: `"rate";r=0;t=1`, reset: "1", ret: "1",
		},
		{
			name: "fractional refill gives a long window", capacity: 3, refill: 0.1, remaining: 3,
			limit: "3", rem: "3", policy: `"rate";q=3;w=30`, rl: `"rate";r=3;t=0`, reset: "0",
		},
		{
			name: "negative remaining is clamped", capacity: 1, refill: 1, remaining: -4,
			limit: "1", rem: "0", policy: `"rate";q=1;w=1`, rl: `"rate";r=0;t=0`, reset: "0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			newRateHeaders(tt.capacity, tt.refill, tt.remaining, tt.resetAfter, tt.retryAfter, tt.throttled).write(h)
			for name, want := range map[string]string{
				"X-RateLimit-Limit": tt.limit, "X-RateLimit-Remaining": tt.rem,
				"RateLimit-Policy": tt.policy, "RateLimit": tt.rl, "Retry-After": tt.ret, "X-RateLimit-Reset": tt.reset,
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

func TestBandHeaders(t *testing.T) {
	rate := limiter.BandState{Name: "rate", Limit: 200, RefillPerSecond: 100, Remaining: 150, ResetAfter: 500 * time.Millisecond}
	hour := limiter.BandState{Name: "hour", Limit: 10000, RefillPerSecond: 10000.0 / 3600, Remaining: 20, ResetAfter: 3590 * time.Second}
	day := limiter.BandState{Name: "day", Limit: 50000, RefillPerSecond: 50000.0 / 86400, Remaining: 30000, ResetAfter: 40000 * time.Second}
	top := func(b limiter.BandState, allowed bool, retry time.Duration, bands ...limiter.BandState) limiter.Decision {
		return limiter.Decision{Allowed: allowed, Limit: b.Limit, RefillPerSecond: b.RefillPerSecond, Remaining: b.Remaining,
			ResetAfter: b.ResetAfter, RetryAfter: retry, Bands: bands}
	}
	tests := []struct {
		name                               string
		d                                  limiter.Decision
		limit, rem, policy, rl, reset, ret string
	}{
		{
			name: "allowed: the band closest to exhaustion is reported", d: top(hour, true, 0, rate, hour, day),
			limit: "10000", rem: "20", policy: `"rate";q=200;w=2, "hour";q=10000;w=3600, "day";q=50000;w=86400`,
			rl: `"hour";r=20;t=3590`, reset: "3590",
		},
		{
			name: "refused by the rule's own bucket", d: top(limiter.BandState{Name: "rate", Limit: 200, RefillPerSecond: 100, ResetAfter: 2 * time.Second}, false, 10*time.Millisecond,
				limiter.BandState{Name: "rate", Limit: 200, RefillPerSecond: 100, ResetAfter: 2 * time.Second}, hour),
			limit: "200", rem: "0", policy: `"rate";q=200;w=2, "hour";q=10000;w=3600`, rl: `"rate";r=0;t=1`, reset: "1", ret: "1",
		},
		{
			name: "two bands of one limit: the one whose state the top-level fields hold",
			d: top(limiter.BandState{Name: "b", Limit: 5, RefillPerSecond: 1, Remaining: 1, ResetAfter: 4 * time.Second}, true, 0,
				limiter.BandState{Name: "rate", Limit: 5, RefillPerSecond: 1, Remaining: 3, ResetAfter: 2 * time.Second},
				limiter.BandState{Name: "b", Limit: 5, RefillPerSecond: 1, Remaining: 1, ResetAfter: 4 * time.Second}),
			limit: "5", rem: "1", policy: `"rate";q=5;w=5, "b";q=5;w=5`, rl: `"b";r=1;t=4`, reset: "4",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			decisionHeaders(tt.d).write(h)
			for name, want := range map[string]string{
				"X-RateLimit-Limit": tt.limit, "X-RateLimit-Remaining": tt.rem, "X-RateLimit-Reset": tt.reset,
				"RateLimit-Policy": tt.policy, "RateLimit": tt.rl, "Retry-After": tt.ret,
			} {
				if got := h.Get(name); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestBandHeadersAllocations(t *testing.T) {
	h := http.Header{}
	d := limiter.Decision{Allowed: true, Limit: 200, RefillPerSecond: 100, Remaining: 153, ResetAfter: time.Second}
	if n := testing.AllocsPerRun(100, func() { decisionHeaders(d).write(h) }); n > 2 {
		t.Fatalf("a decision without bands allocates %v times, want <= 2", n)
	}
}
