package gateway

import "net/http"

// httpAuth is how an HTTP request (at the proxy or /v1/check) presents its API key, and
// the refusals that say so: auth.key_header, and with auth.bearer "Authorization:
// Bearer <key>".
type httpAuth struct {
	keyHeader string
	bearer    bool
	// identity are the header names stripped from every proxied request under any
	// spelling: the tenant header and the headers that carry the key.
	identity []string
	problems keyProblems
}

func newHTTPAuth(a AuthConfig) httpAuth {
	h := httpAuth{keyHeader: a.KeyHeader, bearer: a.Bearer, identity: []string{hdrTenant, a.KeyHeader}, problems: newKeyProblems(a)}
	if a.Bearer {
		h.identity = append(h.identity, "Authorization")
	}
	return h
}

// keys are the API keys an HTTP request presents: every value of the key header under
// any spelling of its name, and with bearer the token of every Authorization header
// ("" for another scheme).
func (a *httpAuth) keys(h http.Header) []string {
	keys := headerValues(h, a.keyHeader)
	if a.bearer {
		for _, v := range h["Authorization"] {
			token, _ := bearerToken(v)
			keys = append(keys[:len(keys):len(keys)], token)
		}
	}
	return keys
}
