package limiter

import (
	"math"
	"reflect"
	"testing"
	"time"
)

func TestBucketTake(t *testing.T) {
	type step struct {
		advance   time.Duration
		capacity  int64
		refill    float64
		cost      int64
		allowed   bool
		remaining int64
		retry     time.Duration
		reset     time.Duration
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"article: burst 2 refill 1/s", []step{
			{0, 2, 1, 1, true, 1, 0, time.Second},
			{0, 2, 1, 1, true, 0, 0, 2 * time.Second},
			{0, 2, 1, 1, false, 0, time.Second, 2 * time.Second},
			{time.Second, 2, 1, 1, true, 0, 0, 2 * time.Second},
		}},
		{"partial refill gives the exact wait", []step{
			{0, 1, 1, 1, true, 0, 0, time.Second},
			{250 * time.Millisecond, 1, 1, 1, false, 0, 750 * time.Millisecond, 750 * time.Millisecond},
			{750 * time.Millisecond, 1, 1, 1, true, 0, 0, time.Second},
		}},
		{"fractional refill 0.3/s", []step{
			{0, 1, 0.3, 1, true, 0, 0, 3333333334},
			{time.Second, 1, 0.3, 1, false, 0, 2333333334, 2333333334},
			{2 * time.Second, 1, 0.3, 1, false, 0, 333333334, 333333334},
			{333333334, 1, 0.3, 1, true, 0, 0, 3333333334},
		}},
		{"cost above what is there waits for the whole cost", []step{
			{0, 10, 2, 8, true, 2, 0, 4 * time.Second},
			{0, 10, 2, 5, false, 2, 1500 * time.Millisecond, 4 * time.Second},
		}},
		{"refill stops at capacity", []step{
			{0, 3, 1, 3, true, 0, 0, 3 * time.Second},
			{time.Hour, 3, 1, 1, true, 2, 0, time.Second},
		}},
		{"shrinking capacity clips tokens", []step{
			{0, 10, 1, 1, true, 9, 0, time.Second},
			{0, 3, 1, 1, true, 2, 0, time.Second},
			{0, 10, 1, 1, true, 1, 0, 9 * time.Second}, // growing does not mint tokens
		}},
		{"clock stepping back refills nothing", []step{
			{0, 2, 1, 2, true, 0, 0, 2 * time.Second},
			{-time.Minute, 2, 1, 1, false, 0, time.Second, 2 * time.Second},
			{time.Minute + time.Second, 2, 1, 1, true, 0, 0, 2 * time.Second},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Bucket
			now := time.Unix(1_700_000_000, 0)
			for i, s := range tt.steps {
				now = now.Add(s.advance)
				got := b.Take(now, s.capacity, s.refill, s.cost)
				want := Decision{Allowed: s.allowed, Limit: s.capacity, RefillPerSecond: s.refill, Remaining: s.remaining, RetryAfter: s.retry, ResetAfter: s.reset}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d: got %+v, want %+v", i, got, want)
				}
			}
		})
	}
}

// TestBucketFractionalAccumulates: 0.3 tokens a second for 1000 s, one second at a
// time, yields exactly 300 tokens; float rounding neither loses nor invents one.
func TestBucketFractionalAccumulates(t *testing.T) {
	var b Bucket
	now := time.Unix(1_700_000_000, 0)
	for range 10 {
		b.Take(now, 10, 0.3, 1)
	}
	taken := 0
	for i := 1; i <= 1000; i++ {
		now = now.Add(time.Second)
		if b.Take(now, 10, 0.3, 1).Allowed {
			taken++
		}
		if want := int(math.Floor(float64(i)*0.3 + 1e-9)); taken != want {
			t.Fatalf("after %d s: %d taken, want %d", i, taken, want)
		}
	}
}

func TestBucketFullAt(t *testing.T) {
	var b Bucket
	now := time.Unix(1_700_000_000, 0)
	b.Take(now, 10, 2, 4) // 6 left, 4 missing at 2/s: full 2 s later
	if got, want := b.fullAt(10, 2), now.Add(2*time.Second).UnixNano(); got != want {
		t.Errorf("fullAt = %d, want %d", got, want)
	}
}

// TestBucketLower: lowering refills first and never raises; a missing (full) bucket is
// lowered from its capacity.
func TestBucketLower(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b Bucket
	b.lower(t0, 10, 1, 4)
	if b.tokens != 4 {
		t.Fatalf("full bucket lowered to 4: %v tokens", b.tokens)
	}
	b.lower(t0.Add(2*time.Second), 10, 1, 8) // refilled to 6 first: stays 6
	if b.tokens != 6 {
		t.Errorf("6 tokens after refill, lowered to 8: %v, want 6 (never raised)", b.tokens)
	}
	b.lower(t0.Add(2*time.Second), 10, 1, -3)
	if b.tokens != 0 {
		t.Errorf("lowered below 0: %v, want 0", b.tokens)
	}
	if d := b.Take(t0.Add(3*time.Second), 10, 1, 1); !d.Allowed || d.Remaining != 0 {
		t.Errorf("one second after lowering to 0: %+v, want the refilled token", d)
	}
}
