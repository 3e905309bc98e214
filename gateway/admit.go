package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/quotaplane/quotaplane/gateway/limiter"
	"github.com/quotaplane/quotaplane/regions"
)

// The one admission path of every door. A door reads what a request says about itself
// in its own protocol (headers and a path, or descriptor entries) into a claim; admit
// decides, the same way for all three, who the request is before any bucket is chosen:
// one route, one tenant, one cost and at most one per-value key, or a refusal. The door
// then maps the refusal onto its protocol (an HTTP status, or OVER_LIMIT).

// claim is what one request says about itself, believed by nothing yet.
type claim struct {
	door door
	// rt is the route to decide under (routeTable.resolve): the matched one, the one
	// routing.unmatched names, or the table's none route with outcome saying why.
	rt      *route
	outcome routeOutcome
	// client is the client address as the unauthenticated guard counts clients
	// (clientKey); invalid when the door cannot tell (no remote_address entry).
	client netip.Addr
	// keys are the API keys the request presents (an empty one for a credential that
	// carries none); tenants the tenant ids its RLS caller vouches for.
	keys, tenants []string
	// costs are the values of the route's cost header; with fromHits the cost is hits
	// instead (RLS hits_addend; 0 means the route's fixed cost).
	costs    []string
	hits     uint64
	fromHits bool
	// done: an RLS descriptor sent when the stream is done (quotaplane_phase=done):
	// its hits are the real cost, charged after the fact (settle.go).
	done bool
	// values are the values of the route's limit_by header or descriptor entry, under
	// every spelling of its name.
	values []string
}

// refusal is why a request is not decided; each door answers it in its protocol.
type refusal uint8

const (
	admitted         refusal = iota
	refusedBlocked           // the client used up its unauthenticated_limit (retry)
	refusedNoKey             // no API key, or an empty one
	refusedManyKeys          // more than one identity: which would a log believe?
	refusedBadKey            // unknown, revoked or over-long key; an untrusted tenant
	refusedNotReady          // no snapshot yet
	refusedPath              // a path spelling the routing rules refuse
	refusedUnmatched         // no route matches, and routing.unmatched refuses
	refusedCost              // a missing, malformed or too large cost
	refusedValue             // a missing, repeated, list-valued or malformed limit_by value
	refusedRLSOnly           // a descriptor: value asked over HTTP
)

// unauthenticated reports whether the refusal is a failed authentication.
func (r refusal) unauthenticated() bool { return r >= refusedBlocked && r <= refusedBadKey }

// admission is admit's verdict: the canonical identity, or a refusal.
type admission struct {
	ask
	refused refusal
	retry   time.Duration // refusedBlocked: until the client's next attempt
}

// admit decides a claim's identity. Order matters and is the same at every door: a
// blocked client is refused before its key is looked up (a guesser must not learn which
// guesses hit); a failed authentication takes one of the client's attempts and is
// counted under the claim's route; only an authenticated request learns that its path,
// cost or value is refused. It never touches Redis and keeps no state that grows with
// what clients send.
func (g *Gateway) admit(ctx context.Context, snap *regions.Snapshot, c *claim) admission {
	if g.guard != nil && c.client.IsValid() {
		if retry, blocked := g.guard.blocked(c.client); blocked {
			return g.unauthenticated(ctx, c, refusedBlocked, retry)
		}
	}
	tenant, r := g.identify(snap, c)
	switch {
	case r == refusedNotReady:
		return admission{refused: r}
	case r != admitted:
		return g.unauthenticated(ctx, c, r, 0)
	}
	a := admission{ask: ask{door: c.door, snap: snap, tenant: tenant, rt: c.rt}}
	switch c.outcome {
	case outRefused:
		g.m.invalid[c.door][invalidPath].Inc()
		a.refused = refusedPath
		return a
	case outUnmatched:
		g.m.unmatched.Inc()
		a.refused = refusedUnmatched
		return a
	}
	var ok bool
	if a.cost, ok = c.rt.costOf(c); !ok {
		g.m.invalid[c.door][invalidCost].Inc()
		a.refused = refusedCost
		return a
	}
	if a.value, a.refused = c.rt.limitBy.valueOf(c); a.refused != admitted {
		g.m.invalid[c.door][invalidValue].Inc()
	}
	return a
}

// identify resolves the claim's one identity to a tenant.
func (g *Gateway) identify(snap *regions.Snapshot, c *claim) (string, refusal) {
	switch n := len(c.keys) + len(c.tenants); {
	case n > 1:
		return "", refusedManyKeys
	case n == 0 || len(c.keys) == 1 && trimOWS(c.keys[0]) == "":
		return "", refusedNoKey
	case snap == nil:
		return "", refusedNotReady
	case len(c.tenants) == 1:
		if !g.cfg.RLSTrustTenant || regions.ValidateID("tenant", c.tenants[0]) != nil {
			return "", refusedBadKey
		}
		return c.tenants[0], admitted
	}
	tenant, ok := lookupKey(snap, trimOWS(c.keys[0]))
	if !ok {
		return "", refusedBadKey
	}
	return tenant, admitted
}

// unauthenticated counts a failed authentication under the claim's route and charges
// it to the client's unauthenticated_limit; a client with no attempt left is refused
// as blocked instead.
func (g *Gateway) unauthenticated(ctx context.Context, c *claim, r refusal, retry time.Duration) admission {
	c.rt.counters[c.door][decUnauthenticated][srcNone].Inc()
	if r != refusedBlocked && g.guard != nil && c.client.IsValid() {
		if wait, ok := g.guard.fail(ctx, c.client); !ok {
			r, retry = refusedBlocked, wait
		}
	}
	if r == refusedBlocked {
		g.m.unauthThrottled.Inc()
	}
	return admission{refused: r, retry: retry}
}

// costOf is the claim's cost on rt: the route's fixed cost, or the one value of its
// cost header, or the RLS hits, capped by cost.max. A cost is never taken as free.
func (rt *route) costOf(c *claim) (int64, bool) {
	cost := max(rt.cost.Fixed, 1) // a route struct built without a config (tests) has 0
	switch {
	case c.fromHits && c.hits > 0:
		if c.hits > MaxCost || (rt.cost.Max > 0 && int64(c.hits) > rt.cost.Max) {
			return 0, false
		}
		return int64(c.hits), true
	case c.fromHits || rt.cost.Header == "":
		return cost, true
	case len(c.costs) != 1:
		return 0, false
	}
	n, err := parseCost(trimOWS(c.costs[0]), rt.cost.Max)
	return n, err == nil
}

// valueOf is the claim's per-value key on a limit_by route ("" for none): the client
// address for client_ip, else the one value of the header or descriptor entry,
// normalised (normalValue).
func (lb limitBy) valueOf(c *claim) (string, refusal) {
	switch lb.kind {
	case limitByNone:
		return "", admitted
	case limitByClientIP:
		if !c.client.IsValid() {
			return "", refusedValue
		}
		return c.client.String(), admitted
	case limitByDescriptor:
		if c.door != doorRLS {
			return "", refusedRLSOnly // an RLS descriptor entry: no HTTP request carries it
		}
	}
	if len(c.values) != 1 {
		return "", refusedValue
	}
	v, ok := normalValue(c.values[0], lb.fold)
	if !ok {
		return "", refusedValue
	}
	return v, admitted
}

// normalValue is the declared rule every spelling of a limit_by value goes through, so
// that one value is one key: surrounding spaces and tabs trimmed, inner runs of them one
// space, case folded with limit_by_case: fold. A value that reads as a list or carries
// parameters (',', ';'), is quoted ('"') or holds a control character (C0 or C1, such as
// NEL) or a space other than ' ' and tab (NBSP, U+2003) is refused: an application may
// take "acme, x", "acme;v=1", "\"acme\"" or "acme\u00a0" for acme, and each would be a
// bucket of its own. The result is at most limiter.MaxValueLen bytes.
func normalValue(v string, fold bool) (string, bool) {
	v = trimOWS(v)
	if v == "" || len(v) > limiter.MaxValueLen {
		return "", false
	}
	clean, ascii := true, true
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == ',' || c == ';' || c == '"' || c == 0x7f || c < 0x20 && c != '\t':
			return "", false
		case c == '\t' || c == ' ' && i > 0 && v[i-1] == ' ':
			clean = false
		case c >= 0x80:
			ascii = false
		}
	}
	if !ascii {
		for _, r := range v {
			if r >= 0x80 && (unicode.IsControl(r) || unicode.IsSpace(r)) {
				return "", false
			}
		}
	}
	if !clean {
		v = strings.Join(strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == '\t' }), " ")
	}
	if fold {
		v = foldString(v)
	}
	return v, true
}

// trimOWS trims HTTP's optional whitespace (spaces and tabs).
func trimOWS(s string) string { return strings.Trim(s, " \t") }

// errBadCost: not a whole number from 1 to the cap.
var errBadCost = errors.New("cost is not a whole number from 1 to the route's maximum")

// parseCost reads a decimal cost 1..max (max 0: no cap but MaxCost). Signs, spaces and
// leading zeros beyond "0" are refused: a cost is plain digits.
func parseCost(s string, max int64) (int64, error) {
	if s == "" || len(s) > 10 {
		return 0, errBadCost
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errBadCost
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > MaxCost || (max > 0 && n > max) {
		return 0, errBadCost
	}
	return n, nil
}

// maxKeyLen bounds the API key the gateway hashes; longer keys are unknown.
const maxKeyLen = 256

// bearerToken is the token of an RFC 6750 "Bearer <token>" credential; the scheme is
// case-insensitive.
func bearerToken(v string) (string, bool) {
	const scheme = "bearer "
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	token := strings.TrimLeft(v[len(scheme):], " ")
	return token, token != ""
}

// lookupKey resolves a presented key to its tenant: false for an unknown, revoked or
// over-long key.
func lookupKey(snap *regions.Snapshot, key string) (string, bool) {
	if key == "" || len(key) > maxKeyLen {
		return "", false
	}
	return snap.Tenant(hashKey(key))
}

// hashKey is regions.HashKey without a heap copy of the key.
func hashKey(key string) regions.KeyHash {
	var buf [maxKeyLen]byte
	return sha256.Sum256(append(buf[:0], key...))
}
