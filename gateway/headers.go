package gateway

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/regions"
)

// Rate-limit response headers, in canonical form so they can be set on an http.Header
// map directly. The names on the wire are case-insensitive (RFC 9110).
const (
	hdrLimit      = "X-Ratelimit-Limit"     // X-RateLimit-Limit
	hdrRemaining  = "X-Ratelimit-Remaining" // X-RateLimit-Remaining
	hdrReset      = "X-Ratelimit-Reset"     // X-RateLimit-Reset
	hdrPolicy     = "Ratelimit-Policy"      // RateLimit-Policy
	hdrRateLimit  = "Ratelimit"             // RateLimit
	hdrRetryAfter = "Retry-After"
	hdrTenant     = "X-Tenant-Id"
)

// policyName is the name of a rule's own bucket in the headers: regions.PrimaryBand,
// quoted as a structured-field string.
const policyName = `"` + regions.PrimaryBand + `"`

// rateHeaders is what a response says about the rule's buckets, mapped from token
// buckets onto draft-ietf-httpapi-ratelimit-headers (see docs/configuration.md):
//
//	RateLimit-Policy: "rate";q=<capacity>;w=<seconds to refill from empty>[, "<band>";q=..;w=..]
//	RateLimit:        "<band>";r=<tokens left>;t=<seconds>
//
// The policy lists every band of the rule, its own ("rate") first; RateLimit, and
// X-RateLimit-Limit, -Remaining and -Reset, describe the band closest to exhaustion (the
// one that refused, on a 429). t is the seconds until that band is full again on an
// allowed response, and the seconds until the next request can be admitted on a 429,
// where it equals Retry-After as the draft requires.
type rateHeaders struct {
	quota     int64 // q: the reported band's capacity
	window    int64 // w: seconds to refill the bucket from empty, >= 1
	remaining int64 // r
	reset     int64 // t
	throttled bool  // also write Retry-After = t
	// band is the reported band's name, for a rule with bands.
	band string
	// policies are every band's q and w, the rule's own first; nil for a rule without
	// bands (the policy is then quota and window, named "rate").
	policies []bandPolicy
}

// bandPolicy is one band's item of RateLimit-Policy.
type bandPolicy struct {
	name          string
	quota, window int64
}

// newRateHeaders maps a decision onto the header values. refill is the bucket's refill
// rate in tokens per second, used only for w.
func newRateHeaders(capacity int64, refill float64, remaining int64, resetAfter, retryAfter time.Duration, throttled bool) rateHeaders {
	h := rateHeaders{quota: capacity, remaining: max(remaining, 0), throttled: throttled}
	h.window = windowOf(capacity, refill)
	if throttled {
		h.reset = max(ceilSeconds(retryAfter), 1)
		h.remaining = 0
	} else {
		h.reset = ceilSeconds(resetAfter)
	}
	return h
}

// decisionHeaders are the headers of d: its top-level fields, and for a decision of a
// rule with bands (d.Bands) the list of bands and the reported band's name.
func decisionHeaders(d limiter.Decision) rateHeaders {
	h := newRateHeaders(d.Limit, d.RefillPerSecond, d.Remaining, d.ResetAfter, d.RetryAfter, !d.Allowed)
	if len(d.Bands) == 0 {
		return h
	}
	h.band = d.Bands[reportedBand(d)].Name
	h.policies = make([]bandPolicy, len(d.Bands))
	for i, b := range d.Bands {
		h.policies[i] = bandPolicy{name: b.Name, quota: b.Limit, window: windowOf(b.Limit, b.RefillPerSecond)}
		if q := b.Quota; q != nil {
			// A quota: its amount at this region's share (steady while the allowance
			// moves with usage) over its calendar period.
			h.policies[i].quota, h.policies[i].window = q.Policy, max(ceilSeconds(q.End.Sub(q.Start)), 1)
		}
	}
	return h
}

// reportedBand is the index in d.Bands of the band d's top-level fields describe (the
// one closest to exhaustion, or the refusing one): the band they equal, else the first
// of the same limit, else the rule's own.
func reportedBand(d limiter.Decision) int {
	same := -1
	for i, b := range d.Bands {
		if b.Limit != d.Limit || b.RefillPerSecond != d.RefillPerSecond {
			continue
		}
		if b.Remaining == d.Remaining && b.ResetAfter == d.ResetAfter {
			return i
		}
		if same < 0 {
			same = i
		}
	}
	return max(same, 0)
}

// windowOf is w: the whole seconds a bucket of capacity takes to refill from empty, at
// least 1 (1 for an unknown refill).
func windowOf(capacity int64, refill float64) int64 {
	if !(refill > 0) {
		return 1
	}
	w := math.Ceil(float64(capacity) / refill)
	switch {
	case w >= math.MaxInt32:
		return math.MaxInt32
	case w > 1:
		return int64(w)
	default:
		return 1
	}
}

// ceilSeconds rounds d up to whole seconds; negative is 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// write sets the headers on h with two allocations for a rule without bands: one string
// holding every value and one array holding the header slices (a band list longer than
// the stack buffer takes one more).
func (r rateHeaders) write(h http.Header) {
	var buf [160]byte
	b := buf[:0]
	b = strconv.AppendInt(b, r.quota, 10)
	e0 := len(b)
	b = strconv.AppendInt(b, r.remaining, 10)
	e1 := len(b)
	if r.policies == nil {
		b = append(b, policyName+";q="...)
		b = strconv.AppendInt(b, r.quota, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, r.window, 10)
	} else {
		for i, p := range r.policies {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPolicy(b, p)
		}
	}
	e2 := len(b)
	if r.policies == nil {
		b = append(b, policyName...)
	} else {
		b = appendName(b, r.band)
	}
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, r.remaining, 10)
	b = append(b, ";t="...)
	e3 := len(b)
	b = strconv.AppendInt(b, r.reset, 10)
	e4 := len(b)
	s := string(b)

	v := new([6]string)
	v[0], v[1], v[2], v[3], v[4], v[5] = s[:e0], s[e0:e1], s[e1:e2], s[e2:e4], s[e3:e4], s[e3:e4]
	h[hdrLimit] = v[0:1:1]
	h[hdrRemaining] = v[1:2:2]
	h[hdrPolicy] = v[2:3:3]
	h[hdrRateLimit] = v[3:4:4]
	h[hdrReset] = v[4:5:5]
	if r.throttled {
		h[hdrRetryAfter] = v[5:6:6]
	}
}

// appendPolicy appends one band's policy item: "name";q=..;w=...
func appendPolicy(b []byte, p bandPolicy) []byte {
	b = appendName(b, p.name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, p.quota, 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, p.window, 10)
}

// appendName appends a band's name as a structured-field string. Band names are ids
// ([A-Za-z0-9._-], regions.ValidateID), which need no escaping.
func appendName(b []byte, name string) []byte {
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"')
}

// isRateHeader reports whether a header name (in canonical form) is a rate-limit
// header of any draft or vendor: RateLimit* or X-RateLimit-* (X-RateLimit-Reset
// included), '_' read as '-' as sameHeaderName reads it.
func isRateHeader(name string) bool {
	return hasPrefixFold(name, "ratelimit") || hasPrefixFold(name, "x-ratelimit-")
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && sameHeaderName(s[:len(prefix)], prefix)
}

// headerValues are the values of every header whose name is name once ASCII case is
// ignored and '_' is read as '-': upstreams built on CGI, WSGI or PHP fold "X_User" and
// "X-User" into one variable, so both spellings are one header here too. Without a
// second spelling (the usual case) it is h[name] itself, no copy.
func headerValues(h http.Header, name string) []string {
	vals, other := h[name], false
	for k := range h {
		if k != name && sameHeaderName(k, name) {
			other = true
			break
		}
	}
	if !other {
		return vals
	}
	var all []string
	for k, v := range h {
		if sameHeaderName(k, name) {
			all = append(all, v...)
		}
	}
	return all
}

// stripHeaders deletes every header whose name is one of names under any spelling
// (sameHeaderName).
func stripHeaders(h http.Header, names []string) {
	for k := range h {
		for _, n := range names {
			if sameHeaderName(k, n) {
				delete(h, k)
				break
			}
		}
	}
}

// sameHeaderName compares header names ignoring ASCII case and treating '_' as '-'.
func sameHeaderName(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == '_' {
			x = '-'
		}
		if y == '_' {
			y = '-'
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
