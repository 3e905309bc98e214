package gateway

import (
	"net/http"
)

// The check door: nginx auth_request and Traefik forwardAuth ask, for a request they
// are about to forward, whether it is within its limit. Only the protocol is here: the
// route, identity, cost and value come from the one admission path (admit.go).

// checkPath is the check endpoint on the proxy's listener.
const checkPath = "/v1/check"

// Headers that carry the original request to the check endpoint.
const (
	hdrForwardedMethod = "X-Forwarded-Method" // Traefik forwardAuth
	hdrForwardedURI    = "X-Forwarded-Uri"
	hdrOriginalMethod  = "X-Original-Method" // nginx auth_request, by convention
	hdrOriginalURI     = "X-Original-Uri"
)

var problemNoOriginal = newProblem(http.StatusBadRequest, "Send the original request's method and URI in X-Original-Method and X-Original-URI (nginx) or X-Forwarded-Method and X-Forwarded-Uri (Traefik).")

// serveCheck answers an auth_request (nginx) or forwardAuth (Traefik) subrequest: is the
// original request, described by the forwarded method and URI and carrying the client's
// headers, within its limit? 200 with the rate headers when allowed; 429 with them and
// Retry-After when throttled; 401 for a missing, unknown or revoked key; 400 when the
// original method or URI is missing or spelled in a way the routing rules refuse, or its
// cost or limit_by value is malformed; 404 when no route matches and routing.unmatched
// refuses. Routes are matched exactly as the proxy door matches them. Nothing is
// forwarded.
func (g *Gateway) serveCheck(w http.ResponseWriter, r *http.Request) {
	method, target, host, ok := originalRequest(r)
	rt, out := g.routes.none, outRefused
	if ok {
		rt, out = g.routes.lookup(doorCheck, method, host, target)
	}
	c := claim{door: doorCheck, rt: rt, outcome: out, client: clientKey(g.trusted.clientAddr(r)), keys: g.auth.keys(r.Header)}
	readHTTPFields(&c, r.Header)
	a := g.admit(r.Context(), g.snap.Load(), &c)
	switch {
	case a.refused == refusedPath && !ok:
		problemNoOriginal.write(w)
		return
	case a.refused != admitted:
		g.auth.problems.write(w, a)
		return
	}
	v, alive := g.decide(r.Context(), a.ask)
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
	w.Header()["X-Tenant-Id"] = []string{a.tenant}
	w.Header()["Content-Length"] = zeroLength
	w.WriteHeader(http.StatusOK)
}

var zeroLength = []string{"0"}

// originalRequest is the request a check is about: Traefik's X-Forwarded-Method/Uri
// first, else nginx's X-Original-Method/URI; the host is X-Forwarded-Host or the check
// request's own. target is the URI as the proxy received it, for the route table.
func originalRequest(r *http.Request) (method, target, host string, ok bool) {
	method, target = r.Header.Get(hdrForwardedMethod), r.Header.Get(hdrForwardedURI)
	if method == "" && target == "" {
		method, target = r.Header.Get(hdrOriginalMethod), r.Header.Get(hdrOriginalURI)
	}
	if method == "" || target == "" || len(target) > maxPathLen || !validMethod(method) {
		return "", "", "", false
	}
	host = r.Header.Get("X-Forwarded-Host")
	if host == "" {
		host = r.Host
	}
	return method, target, host, true
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
