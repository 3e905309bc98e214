package limiter

import (
	"math"
	"time"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// eps absorbs float rounding in token counts, as in lua/token_bucket.lua: ten refills
// of 0.3 tokens make 3 tokens, not 2.9999999999999996.
const eps = 1e-9

// Bucket is one in-memory token bucket: the same maths as lua/token_bucket.lua, with
// the clock passed in. The zero value is a full bucket. A Bucket is not safe for
// concurrent use; Local guards its buckets.
type Bucket struct {
	tokens float64
	// last is the time of the last refill in Unix nanoseconds; 0 means never used (full).
	last int64
}

// Take refills the bucket up to now at refill tokens per second, clips it to capacity
// (a rule that shrank takes effect at once), and takes cost tokens if they are there.
// The Decision's Source is left empty for the caller to set.
//
// Callers ensure capacity >= 1, refill > 0 and finite, 1 <= cost <= capacity. A now
// earlier than the last call (a clock stepping back) refills nothing, so a bucket
// never holds more tokens than were due.
func (b *Bucket) Take(now time.Time, capacity int64, refill float64, cost int64) Decision {
	c := float64(capacity)
	b.refill(now, c, refill)
	d := Decision{Limit: capacity, RefillPerSecond: refill}
	if b.tokens+eps >= float64(cost) {
		d.Allowed = true
		b.tokens = max(b.tokens-float64(cost), 0)
	} else {
		d.RetryAfter = secondsUp((float64(cost) - b.tokens) / refill)
	}
	d.Remaining = max(int64(math.Floor(b.tokens+eps)), 0) // 0 in debt (a settle)
	d.ResetAfter = secondsUp((c - b.tokens) / refill)
	return d
}

// has reports whether the bucket, refilled to now under lim, holds cost tokens.
func (b *Bucket) has(now time.Time, lim regions.Limit, cost int64) bool {
	b.refill(now, float64(lim.Capacity), lim.RefillPerSecond)
	return b.tokens+eps >= float64(cost)
}

// decide is Take when take, and otherwise the same refusal Take would give, with
// nothing taken (the other bucket of a nested request refused).
func (b *Bucket) decide(now time.Time, lim regions.Limit, cost int64, take bool) Decision {
	if take {
		return b.Take(now, lim.Capacity, lim.RefillPerSecond, cost)
	}
	b.refill(now, float64(lim.Capacity), lim.RefillPerSecond)
	d := Decision{Limit: lim.Capacity, RefillPerSecond: lim.RefillPerSecond, Remaining: int64(math.Floor(b.tokens + eps))}
	if b.tokens+eps < float64(cost) {
		d.RetryAfter = secondsUp((float64(cost) - b.tokens) / lim.RefillPerSecond)
	}
	d.ResetAfter = secondsUp((float64(lim.Capacity) - b.tokens) / lim.RefillPerSecond)
	d.Remaining = max(d.Remaining, 0)
	return d
}

// refill brings the bucket up to now and clips it to capacity c.
func (b *Bucket) refill(now time.Time, c, refill float64) {
	t := now.UnixNano()
	if b.last == 0 {
		b.tokens, b.last = c, t
	} else if t > b.last {
		b.tokens += float64(t-b.last) * refill / 1e9
		b.last = t
	}
	if b.tokens > c {
		b.tokens = c
	}
}

// settle refills the bucket up to now under lim, then takes delta > 0 tokens whatever it
// holds, into debt down to lim's depth bound (lua.MaxDebtSeconds of refill below full,
// as decide.lua bounds it; a bucket already past it is not raised), or gives -delta back
// up to the capacity.
func (b *Bucket) settle(now time.Time, lim regions.Limit, delta int64) {
	c := float64(lim.Capacity)
	b.refill(now, c, lim.RefillPerSecond)
	if delta < 0 {
		b.tokens = min(b.tokens-float64(delta), c)
		return
	}
	deep := c - lim.RefillPerSecond*lua.MaxDebtSeconds
	if after := b.tokens - float64(delta); after >= deep {
		b.tokens = after
	} else if b.tokens > deep {
		b.tokens = deep
	}
}

// empty makes a bucket that has never been used (last == 0) an empty one at now; it then
// holds only what it refills from now on. A used bucket is left as it is.
func (b *Bucket) empty(now time.Time) {
	if b.last == 0 {
		b.tokens, b.last = 0, now.UnixNano()
	}
}

// lower refills the bucket up to now and then clips it to at most tokens (not below 0).
func (b *Bucket) lower(now time.Time, capacity int64, refill float64, tokens float64) {
	b.refill(now, float64(capacity), refill)
	if b.tokens > tokens {
		b.tokens = max(tokens, 0)
	}
}

// fullAt is when the bucket will be full if nothing more is taken (Unix nanoseconds):
// from then on it is indistinguishable from a missing, that is full, bucket.
func (b *Bucket) fullAt(capacity int64, refill float64) int64 {
	missing := float64(capacity) - b.tokens
	if missing <= eps {
		return b.last
	}
	d := int64(secondsUp(missing / refill))
	if d > math.MaxInt64-b.last {
		return math.MaxInt64
	}
	return b.last + d
}

// secondsUp converts seconds to a Duration, rounding up to the nanosecond, saturating
// instead of overflowing.
func secondsUp(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	ns := math.Ceil(s*1e9 - 1e-3) // a thousandth of a ns absorbs float noise
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}
