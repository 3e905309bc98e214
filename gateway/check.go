package gateway

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quotaplane/quotaplane/gateway/limiter"
)

// checkPath is the check endpoint on the proxy's listener.
const checkPath = "/v1/check"

// Headers that carry the original request to the check endpoint.
const (
	hdrForwardedMethod = "X-Forwarded-Method" // Traefik forwardAuth
	hdrForwardedURI    = "X-Forwarded-Uri"
	hdrOriginalMethod  = "X-Original-Method" // nginx auth_request, by convention
	hdrOriginalURI     = "X-Original-Uri"
)

var (
	problemNoOriginal = newProblem(http.StatusBadRequest, "Send the original request's method and URI in X-Original-Method and X-Original-URI (nginx) or X-Forwarded-Method and X-Forwarded-Uri (Traefik).")
	problemBadCost    = newProblem(http.StatusBadRequest, "This route takes its cost from a request header: send exactly one, a whole number from 1 to the route's maximum.")
	problemRLSOnly    = newProblem(http.StatusBadRequest, "This route is limited per value of a rate-limit service descriptor entry: it is decided over gRPC (rls_listen), not over HTTP.")
	problemBadValue   = newProblem(http.StatusBadRequest, "This route is limited per value of a client property: send exactly one non-empty value of at most 256 bytes.")
)

// serveCheck answers an auth_request (nginx) or forwardAuth (Traefik) subrequest: is the
// original request, described by the forwarded method and URI and carrying the client's
// headers, within its limit? 200 with the rate headers when allowed; 429 with them and
// Retry-After when throttled; 401 for a missing, unknown or revoked key; 400 when the
// original method or URI is missing or malformed, or its cost or limit_by value is. The
// route is matched by the proxy's own ServeMux; a request no route matches is decided
// under the "*" rule (route "*"). Nothing is forwarded.
func (g *Gateway) serveCheck(w http.ResponseWriter, r *http.Request) {
	orig, ok := originalRequest(r)
	rt := g.anyRoute
	if ok {
		if _, pattern := g.mux.Handler(orig); pattern != "" {
			if m := g.byPattern[pattern]; m != nil {
				rt = m
			}
		}
	}
	snap, tenant, authed := g.authenticate(w, r, rt, doorCheck)
	if !authed {
		return
	}
	if !ok {
		problemNoOriginal.write(w)
		return
	}
	cost, value, p := g.costAndValue(r, rt)
	if p != nil {
		p.write(w)
		return
	}
	v, alive := g.decide(r.Context(), ask{door: doorCheck, snap: snap, tenant: tenant, rt: rt, cost: cost, value: value})
	if !alive {
		return
	}
	if v.advertised {
		v.hdr.write(w.Header())
	}
	if v.dec == decThrottled {
		problemThrottled.write(w)
		return
	}
	w.Header()["X-Tenant-Id"] = []string{tenant}
	w.Header()["Content-Length"] = zeroLength
	w.WriteHeader(http.StatusOK)
}

var zeroLength = []string{"0"}

// originalRequest rebuilds the request a check is about, for route matching: Traefik's
// X-Forwarded-Method/Uri first, else nginx's X-Original-Method/URI; the host is
// X-Forwarded-Host or the check request's own.
func originalRequest(r *http.Request) (*http.Request, bool) {
	method, uri := r.Header.Get(hdrForwardedMethod), r.Header.Get(hdrForwardedURI)
	if method == "" && uri == "" {
		method, uri = r.Header.Get(hdrOriginalMethod), r.Header.Get(hdrOriginalURI)
	}
	if method == "" || uri == "" || len(uri) > 8192 || !validMethod(method) {
		return nil, false
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil || u.Path == "" || u.Path[0] != '/' {
		return nil, false
	}
	host := r.Header.Get("X-Forwarded-Host")
	if host == "" {
		host = r.Host
	}
	return &http.Request{Method: method, URL: u, Host: host, Header: http.Header{}}, true
}

// validMethod: an RFC 9110 token of at most 32 bytes.
func validMethod(m string) bool {
	if len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' || c == '+' || c == '^' || c == '`' || c == '|' || c == '~') {
			return false
		}
	}
	return m != ""
}

// costAndValue reads an HTTP request's cost (routes[].cost) and limit_by value; p is the
// 400 to answer when either is missing or malformed. A cost is never taken as free.
func (g *Gateway) costAndValue(r *http.Request, rt *route) (cost int64, value string, p *problem) {
	cost = rt.cost.Fixed
	if cost == 0 {
		cost = 1 // a route struct built without a config (tests)
	}
	if rt.cost.Header != "" {
		vals := r.Header[rt.cost.Header]
		if len(vals) != 1 {
			return 0, "", problemBadCost
		}
		n, err := parseCost(vals[0], rt.cost.Max)
		if err != nil {
			return 0, "", problemBadCost
		}
		cost = n
	}
	switch rt.limitBy.kind {
	case limitByClientIP:
		a := clientKey(g.trusted.clientAddr(r))
		if !a.IsValid() {
			return 0, "", problemBadValue
		}
		value = a.String()
	case limitByHeader:
		vals := r.Header[rt.limitBy.name]
		if len(vals) != 1 || vals[0] == "" || len(vals[0]) > limiter.MaxValueLen {
			return 0, "", problemBadValue
		}
		value = vals[0]
	case limitByDescriptor:
		return 0, "", problemRLSOnly // an RLS descriptor entry: no HTTP request carries it
	}
	return cost, value, nil
}

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
