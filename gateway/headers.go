package gateway

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Rate-limit response headers, in canonical form so they can be set on an http.Header
// map directly. The names on the wire are case-insensitive (RFC 9110).
const (
	hdrLimit      = "X-Ratelimit-Limit"     // X-RateLimit-Limit
	hdrRemaining  = "X-Ratelimit-Remaining" // X-RateLimit-Remaining
	hdrPolicy     = "Ratelimit-Policy"      // RateLimit-Policy
	hdrRateLimit  = "Ratelimit"             // RateLimit
	hdrRetryAfter = "Retry-After"
	hdrTenant     = "X-Tenant-Id"
)

// policyName is the name of the one quota policy a response describes.
const policyName = `"default"`

// rateHeaders is what a response says about the bucket, mapped from a token bucket onto
// draft-ietf-httpapi-ratelimit-headers (see docs/configuration.md):
//
//	RateLimit-Policy: "default";q=<capacity>;w=<seconds to refill from empty>
//	RateLimit:        "default";r=<tokens left>;t=<seconds>
//
// t is the seconds until the quota has fully reset (the bucket is full again) on an
// allowed response, and the seconds until the next request can be admitted on a 429,
// where it equals Retry-After as the draft requires.
type rateHeaders struct {
	quota     int64 // q: the bucket's capacity
	window    int64 // w: seconds to refill the bucket from empty, >= 1
	remaining int64 // r
	reset     int64 // t
	throttled bool  // also write Retry-After = t
}

// newRateHeaders maps a decision onto the header values. refill is the bucket's refill
// rate in tokens per second, used only for w.
func newRateHeaders(capacity int64, refill float64, remaining int64, resetAfter, retryAfter time.Duration, throttled bool) rateHeaders {
	h := rateHeaders{quota: capacity, remaining: max(remaining, 0), throttled: throttled}
	h.window = 1
	if refill > 0 {
		if w := math.Ceil(float64(capacity) / refill); w > 1 && w < math.MaxInt32 {
			h.window = int64(w)
		} else if w >= math.MaxInt32 {
			h.window = math.MaxInt32
		}
	}
	if throttled {
		h.reset = max(ceilSeconds(retryAfter), 1)
		h.remaining = 0
	} else {
		h.reset = ceilSeconds(resetAfter)
	}
	return h
}

// ceilSeconds rounds d up to whole seconds; negative is 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// write sets the headers on h with two allocations: one string holding every value and
// one array holding the header slices.
func (r rateHeaders) write(h http.Header) {
	var buf [160]byte
	b := buf[:0]
	b = strconv.AppendInt(b, r.quota, 10)
	e0 := len(b)
	b = strconv.AppendInt(b, r.remaining, 10)
	e1 := len(b)
	b = append(b, policyName+";q="...)
	b = strconv.AppendInt(b, r.quota, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, r.window, 10)
	e2 := len(b)
	b = append(b, policyName+";r="...)
	b = strconv.AppendInt(b, r.remaining, 10)
	b = append(b, ";t="...)
	e3 := len(b)
	b = strconv.AppendInt(b, r.reset, 10)
	e4 := len(b)
	s := string(b)

	v := new([5]string)
	v[0], v[1], v[2], v[3], v[4] = s[:e0], s[e0:e1], s[e1:e2], s[e2:e4], s[e3:e4]
	h[hdrLimit] = v[0:1:1]
	h[hdrRemaining] = v[1:2:2]
	h[hdrPolicy] = v[2:3:3]
	h[hdrRateLimit] = v[3:4:4]
	if r.throttled {
		h[hdrRetryAfter] = v[4:5:5]
	}
}

// isRateHeader reports whether a header name (in canonical form) is a rate-limit
// header of any draft or vendor: RateLimit* or X-RateLimit-*.
func isRateHeader(name string) bool {
	return hasPrefixFold(name, "ratelimit") || hasPrefixFold(name, "x-ratelimit-")
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
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
