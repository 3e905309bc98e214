package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// problem is a fixed RFC 9457 application/problem+json response. Bodies are built once:
// the hot path writes bytes and never formats an error, so no internal text can leak.
type problem struct {
	status int
	body   []byte
	length []string
}

var contentTypeProblem = []string{"application/problem+json"}

func newProblem(status int, detail string) *problem {
	body, err := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{"about:blank", http.StatusText(status), status, detail})
	if err != nil {
		panic(err) // a constant struct always marshals
	}
	body = append(body, '\n')
	return &problem{status: status, body: body, length: []string{strconv.Itoa(len(body))}}
}

var (
	problemBadKey    = newProblem(http.StatusUnauthorized, "The API key is unknown or revoked.")
	problemNotFound  = newProblem(http.StatusNotFound, "No route matches this method and path.")
	problemThrottled = newProblem(http.StatusTooManyRequests, "Rate limit exceeded; retry after the number of seconds in Retry-After.")
	problemUpstream  = newProblem(http.StatusBadGateway, "The upstream service could not be reached.")
	problemNotReady  = newProblem(http.StatusServiceUnavailable, "The gateway has not loaded its configuration yet; retry shortly.")
	problemBadPath   = newProblem(http.StatusBadRequest, "The path is spelled in a way the gateway does not route (a fragment, a dot segment or empty segment, an encoded slash or backslash, a ;parameter, a malformed escape or a control character): send it in plain form.")
	problemBadCost   = newProblem(http.StatusBadRequest, "This route takes its cost from a request header: send exactly one, a whole number from 1 to the route's maximum.")
	problemRLSOnly   = newProblem(http.StatusBadRequest, "This route is limited per value of a rate-limit service descriptor entry: it is decided over gRPC (rls_listen), not over HTTP.")
	problemBadValue  = newProblem(http.StatusBadRequest, "This route is limited per value of a client property: send exactly one value of at most 256 bytes, without ',', ';' or '\"'.")
	// problemTooManyFailures answers a client blocked by unauthenticated_limit.
	problemTooManyFailures = newProblem(http.StatusTooManyRequests, "Too many requests without a valid API key from this address; retry after the number of seconds in Retry-After.")
)

// keyProblems are the refusals that name where the key goes, built once per gateway
// from auth.
type keyProblems struct {
	missingKey, manyKeys *problem
}

func newKeyProblems(a AuthConfig) keyProblems {
	where := "the " + a.KeyHeader + " header"
	if a.Bearer {
		where += " or as \"Authorization: Bearer <key>\""
	}
	return keyProblems{
		missingKey: newProblem(http.StatusUnauthorized, "Send your API key in "+where+"."),
		manyKeys:   newProblem(http.StatusBadRequest, "Send exactly one API key, in "+where+"."),
	}
}

// write answers an HTTP request that admit refused.
func (p keyProblems) write(w http.ResponseWriter, a admission) {
	switch a.refused {
	case refusedBlocked:
		writeGuardRefusal(w, a.retry)
	case refusedNoKey:
		p.missingKey.write(w)
	case refusedManyKeys:
		p.manyKeys.write(w)
	case refusedBadKey:
		problemBadKey.write(w)
	case refusedNotReady:
		problemNotReady.write(w)
	case refusedPath:
		problemBadPath.write(w)
	case refusedUnmatched:
		problemNotFound.write(w)
	case refusedCost:
		problemBadCost.write(w)
	case refusedValue:
		problemBadValue.write(w)
	case refusedRLSOnly:
		problemRLSOnly.write(w)
	}
}

// write sends the problem. Shared slices are safe in the header map: nothing appends to
// a response's header after it is written.
func (p *problem) write(w http.ResponseWriter) {
	h := w.Header()
	h["Content-Type"] = contentTypeProblem
	h["Content-Length"] = p.length
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(p.status)
	_, _ = w.Write(p.body)
}

var nosniff = []string{"nosniff"}
