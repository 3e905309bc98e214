package gateway

import (
	"context"
	"fmt"
	"hash/maphash"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/regions"
)

// maxForwardedHops bounds the X-Forwarded-For entries examined for one request.
const maxForwardedHops = 32

// parseTrustedProxy reads a trusted_proxies entry: a CIDR, or one address.
func parseTrustedProxy(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an address", s)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an address", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// trustedProxies is the parsed trusted_proxies list.
type trustedProxies []netip.Prefix

func newTrustedProxies(list []string) (trustedProxies, error) {
	out := make(trustedProxies, 0, len(list))
	for _, s := range list {
		p, err := parseTrustedProxy(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func (t trustedProxies) contains(a netip.Addr) bool {
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr is the address of the connection's far end; invalid for a non-IP listener.
func peerAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// clientAddr is the request's client: the connection's peer, unless the peer is a trusted
// proxy; then X-Forwarded-For is read from the right (the entry the nearest proxy added)
// and the first address that is not a trusted proxy is the client. An entry that does not
// parse ends the walk at the last trusted hop, so a client cannot choose its address by
// writing one: only what trusted proxies appended counts.
func (t trustedProxies) clientAddr(r *http.Request) netip.Addr {
	a := peerAddr(r)
	if len(t) == 0 || !a.IsValid() || !t.contains(a) {
		return a
	}
	vals := r.Header["X-Forwarded-For"]
	hops := 0
	for i := len(vals) - 1; i >= 0; i-- {
		v := vals[i]
		for v != "" {
			if hops++; hops > maxForwardedHops {
				return a
			}
			var part string
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				part, v = v[j+1:], v[:j]
			} else {
				part, v = v, ""
			}
			next, err := netip.ParseAddr(strings.TrimSpace(part))
			if err != nil || next.Zone() != "" {
				return a
			}
			a = next.Unmap()
			if !t.contains(a) {
				return a
			}
		}
	}
	return a
}

// clientKey is the unit the unauthenticated limit counts: an IPv4 address, or the /64 of
// an IPv6 address (one host usually holds a whole /64, so a per-address limit would be
// no limit at all).
func clientKey(a netip.Addr) netip.Addr {
	if a.Is6() {
		p, _ := a.WithZone("").Prefix(64)
		return p.Addr()
	}
	return a
}

// blockSlots is the size of the table of blocked clients (a power of two).
const blockSlots = 4096

// clientGuard is the per-client limit on requests that fail authentication.
//
// Each client (clientKey) has a token bucket in a limiter.Local, which bounds the buckets
// held and evicts idle (full) ones exactly. A request that fails authentication (no key,
// an unknown or revoked one, several) takes a token; when there is none the request is
// answered 429 and the client is blocked until a token is due. While a client is
// blocked, every request of it is answered 429 before its key is even looked up, a valid
// key included: otherwise a guesser would still learn at full speed which guesses hit.
// The price is that clients sharing one address with a guesser (a NAT, or every client
// when the gateway sits behind a proxy that is not in trusted_proxies) are refused with
// it; docs/SECURITY.md discusses this.
//
// Blocks live in a fixed table indexed by a seeded hash of the client: a lossy cache
// with no lock on the read path. Two blocked clients that share a slot overwrite each
// other; the one overwritten has its next request looked up, and its next failure blocks
// it again at once, since its bucket is still empty. So memory is fixed and a collision
// costs at most one lookup.
type clientGuard struct {
	fails *limiter.Local
	limit regions.Limit
	now   func() time.Time
	seed  maphash.Seed
	box   [blockSlots]atomic.Pointer[block]
}

type block struct {
	client netip.Addr
	until  int64 // Unix ns
}

// unauthRoute names the guard's buckets in its own limiter.
const unauthRoute = "unauthenticated"

func newClientGuard(c UnauthLimitConfig, now func() time.Time) (*clientGuard, error) {
	l, err := limiter.NewLocal(limiter.LocalOptions{Now: now, MaxBuckets: c.MaxClients})
	if err != nil {
		return nil, err
	}
	return &clientGuard{
		fails: l,
		limit: regions.Limit{Capacity: c.Capacity, RefillPerSecond: c.RefillPerSecond},
		now:   now,
		seed:  maphash.MakeSeed(),
	}, nil
}

func (g *clientGuard) slot(client netip.Addr) *atomic.Pointer[block] {
	b := client.As16()
	return &g.box[maphash.Bytes(g.seed, b[:])&(blockSlots-1)]
}

// blocked reports whether client is blocked, and for how long still.
func (g *clientGuard) blocked(client netip.Addr) (time.Duration, bool) {
	b := g.slot(client).Load()
	if b == nil || b.client != client {
		return 0, false
	}
	left := b.until - g.now().UnixNano()
	return time.Duration(left), left > 0
}

// fail records a failed authentication of client. It reports false, with the time until
// the next attempt is allowed, when the client has no attempts left (and blocks it).
func (g *clientGuard) fail(ctx context.Context, client netip.Addr) (time.Duration, bool) {
	d, err := g.fails.Decide(ctx, limiter.Request{Tenant: client.String(), Route: unauthRoute, Limit: g.limit, Cost: 1})
	if err != nil || d.Allowed {
		return 0, true // a request whose client has gone needs no answer; the limit is valid
	}
	g.slot(client).Store(&block{client: client, until: g.now().Add(d.RetryAfter).UnixNano()})
	return d.RetryAfter, false
}

// writeGuardRefusal answers a blocked client: 429 with Retry-After in whole seconds >= 1.
func writeGuardRefusal(w http.ResponseWriter, retry time.Duration) {
	w.Header()[hdrRetryAfter] = []string{strconv.FormatInt(max(ceilSeconds(retry), 1), 10)}
	problemTooManyFailures.write(w)
}
