package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Route matching that agrees with the application's router.
//
// A proxy and the application behind it each decide which route a request is. When the
// application routes more spellings of a path to one handler than the gateway matches
// to that handler's route (Express folds case and ignores a trailing slash; servlet
// containers strip ;params; many decode %2F or resolve ..), every extra spelling is a
// request the application runs under another rule, or none. So the gateway matches a
// canonical form of the path, built by the routing rules (RoutingConfig), and refuses
// the spellings whose meaning differs between routers (fragments always; dot segments
// and encoded slashes unless configured). Both HTTP doors (the proxy and /v1/check)
// match through one routeTable; the RLS door names routes by id.

// pathRules are the parsed routing rules.
type pathRules struct {
	fold          bool // case-insensitive paths and methods
	optionalSlash bool // "/orders/" is "/orders"
	stripParams   bool // ";params" removed from every segment (else refused)
	resolveDots   bool // ".", ".." and empty segments resolved (else refused)
	decodeSlashes bool // %2F, %5C and '\' taken for '/' (else refused)
}

// Reasons a path is refused; they name the rule, for the 400's detail.
var (
	errNotPath      = errors.New("the request target is not a path")
	errFragment     = errors.New("a fragment (#) is never part of a request")
	errParams       = errors.New("a ;parameter in a path segment")
	errDotSegment   = errors.New("a dot segment (. or ..) or an empty segment (//)")
	errEncodedSlash = errors.New("an encoded slash (%2F, %5C) or a backslash")
	errBadEscape    = errors.New("a malformed percent-escape")
	errControl      = errors.New("a control character")
)

// maxPathLen bounds the request target the canonical form is built from.
const maxPathLen = 8192

// canonicalPath is the path a request target is matched as: percent-decoded segment by
// segment, ;params stripped, dot segments resolved and encoded slashes decoded (or each
// refused, as the rules say), case folded when configured. The trailing slash is kept:
// the route table matches "/x" and "/x/" alike when trailing_slash is optional. target
// is the raw request target: origin form ("/orders?x=1") or absolute form
// ("http://host/orders"); a '#' anywhere in it is refused.
func (p pathRules) canonicalPath(target string) (string, error) {
	if len(target) > maxPathLen {
		return "", errNotPath
	}
	if strings.IndexByte(target, '#') >= 0 {
		return "", errFragment
	}
	raw, ok := targetPath(target)
	if !ok {
		return "", errNotPath
	}
	if strings.IndexByte(raw, '\\') >= 0 {
		if !p.decodeSlashes {
			return "", errEncodedSlash
		}
		raw = strings.ReplaceAll(raw, `\`, "/")
	}
	segs := strings.Split(raw[1:], "/")
	out := make([]string, 0, len(segs))
	trailing := false
	for i, seg := range segs {
		last := i == len(segs)-1
		if j := strings.IndexByte(seg, ';'); j >= 0 {
			if !p.stripParams {
				return "", errParams
			}
			seg = seg[:j]
		}
		dec, err := unescapeSegment(seg)
		if err != nil {
			return "", err
		}
		parts := []string{dec}
		if strings.ContainsAny(dec, `/\`) {
			if !p.decodeSlashes {
				return "", errEncodedSlash
			}
			parts = strings.Split(strings.ReplaceAll(dec, `\`, "/"), "/")
		}
		for k, s := range parts {
			end := last && k == len(parts)-1
			switch s {
			case "":
				if end {
					trailing = true
					continue
				}
				if !p.resolveDots {
					return "", errDotSegment
				}
			case ".", "..":
				if !p.resolveDots {
					return "", errDotSegment
				}
				if s == ".." && len(out) > 0 {
					out = out[:len(out)-1]
				}
				trailing = trailing || end
			default:
				if p.fold {
					s = foldString(s)
				}
				out = append(out, s)
			}
		}
	}
	var b strings.Builder
	b.Grow(len(raw))
	for _, s := range out {
		b.WriteByte('/')
		b.WriteString(s)
	}
	if trailing || len(out) == 0 {
		b.WriteByte('/')
	}
	return b.String(), nil
}

// targetPath is the raw path of a request target: origin form as it is, absolute form
// (http://host/path) without scheme and authority; the query is cut off.
func targetPath(target string) (string, bool) {
	if i := strings.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	if strings.HasPrefix(target, "/") {
		return target, true
	}
	for _, scheme := range []string{"http://", "https://"} {
		if len(target) >= len(scheme) && strings.EqualFold(target[:len(scheme)], scheme) {
			rest := target[len(scheme):]
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				return rest[i:], true
			}
			return "/", true
		}
	}
	return "", false
}

// unescapeSegment percent-decodes one path segment; a malformed escape or a control
// character (escaped or not) is refused.
func unescapeSegment(s string) (string, error) {
	if strings.IndexByte(s, '%') < 0 {
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] == 0x7f {
				return "", errControl
			}
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' {
			if i+2 >= len(s) || !ishex(s[i+1]) || !ishex(s[i+2]) {
				return "", errBadEscape
			}
			c = unhex(s[i+1])<<4 | unhex(s[i+2])
			i += 2
		}
		if c < 0x20 || c == 0x7f {
			return "", errControl
		}
		b = append(b, c)
	}
	return string(b), nil
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

// foldString maps every letter to one member of its case class, so that spellings a
// case-insensitive router takes as equal compare equal: ASCII and Unicode (the Kelvin
// sign and "k", the long s and "s" fold together). Invalid UTF-8 is kept as it is.
func foldString(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return strings.ToLower(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteByte(s[i])
		} else {
			b.WriteRune(unicode.ToLower(unicode.ToUpper(r)))
		}
		i += n
	}
	return b.String()
}

// canonicalHost is a Host header as patterns are matched against it: lower case, no
// port, no trailing dot.
func canonicalHost(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		h = h[:i]
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// routeTable matches HTTP requests to routes under the routing rules. Its ServeMux
// holds every route's pattern in canonical form (and, with trailing_slash optional,
// the other spelling of its trailing slash) and is only ever asked, never served.
type routeTable struct {
	rules pathRules
	mux   *http.ServeMux
	byID  map[string]*route
	// star is the "*" rule's route (RLS descriptors that name "*", and unmatched
	// requests under routing.unmatched "*"); unmatched is the route an unmatched check
	// or RLS request is decided under, nil when such requests are refused; none counts
	// requests that matched nothing.
	star, unmatched, none *route
}

// matched marks a route's patterns in the table's ServeMux.
type matched struct{ rt *route }

// ServeHTTP is never called: the table is only asked (Handler), never served.
func (m matched) ServeHTTP(w http.ResponseWriter, _ *http.Request) { problemNotFound.write(w) }

// routeOutcome is what matching found.
type routeOutcome uint8

const (
	outMatched   routeOutcome = iota
	outUnmatched              // no route matches the canonical request
	outRefused                // a spelling the routing rules refuse
)

// match finds the route of a request given by method, host and raw request target.
func (t *routeTable) match(method, host, target string) (*route, routeOutcome) {
	path, err := t.rules.canonicalPath(target)
	if err != nil {
		return nil, outRefused
	}
	if t.rules.fold {
		method = strings.ToUpper(method)
	}
	req := &http.Request{Method: method, Host: canonicalHost(host), URL: &url.URL{Path: path}}
	if h, _ := t.mux.Handler(req); h != nil {
		if m, ok := h.(matched); ok {
			return m.rt, outMatched
		}
	}
	return nil, outUnmatched
}

// newRouteMux builds the ServeMux of the routes' canonical patterns, handler(i) marking
// routes[i]. A pattern that matches the same requests as another under the rules is an
// error naming both.
func newRouteMux(routes []RouteConfig, rules pathRules, handler func(i int) http.Handler) (*http.ServeMux, error) {
	mux := http.NewServeMux()
	pats := make([][]string, len(routes))
	for i, rc := range routes {
		p, err := rules.patterns(rc.Match)
		if err != nil {
			return nil, &ConfigError{Key: fmt.Sprintf("routes[%d].match", i), Reason: err.Error()}
		}
		pats[i] = p
		for _, pat := range p {
			if err := registerPattern(mux, pat, handler(i)); err != nil {
				return nil, conflictError(routes, pats, i, rules, err)
			}
		}
	}
	return mux, nil
}

// conflictError names the earlier route routes[i]'s patterns collide with.
func conflictError(routes []RouteConfig, pats [][]string, i int, rules pathRules, err error) error {
	key := fmt.Sprintf("routes[%d].match", i)
	for j := range i {
		pair := http.NewServeMux()
		if registerAll(pair, pats[j]) == nil && registerAll(pair, pats[i]) != nil {
			reason := fmt.Sprintf("%q matches the same requests as routes[%d].match %q", routes[i].Match, j, routes[j].Match)
			if raw := http.NewServeMux(); registerAll(raw, []string{routes[j].Match}) == nil && registerAll(raw, []string{routes[i].Match}) == nil {
				reason += " under the routing rules (" + rules.describe() + ")"
			}
			return &ConfigError{Key: key, Reason: reason}
		}
	}
	return &ConfigError{Key: key, Reason: err.Error()}
}

func registerAll(mux *http.ServeMux, pats []string) error {
	for _, p := range pats {
		if err := registerPattern(mux, p, http.NotFoundHandler()); err != nil {
			return err
		}
	}
	return nil
}

// describe names the rules that make two patterns collide.
func (p pathRules) describe() string {
	var s []string
	if p.fold {
		s = append(s, "routing.case: fold")
	}
	if p.optionalSlash {
		s = append(s, "routing.trailing_slash: optional")
	}
	return strings.Join(s, ", ")
}

// patterns are the ServeMux patterns a route's match stands for under the rules: the
// pattern in canonical form, and with trailing_slash optional the other spelling of its
// trailing slash ("/orders" also as "/orders/{$}", "/docs/" also as "/docs").
func (p pathRules) patterns(match string) ([]string, error) {
	method, rest := "", match
	if i := strings.IndexAny(match, " \t"); i >= 0 {
		method, rest = match[:i], strings.TrimLeft(match[i:], " \t")
	}
	slash := strings.IndexByte(rest, '/')
	if slash < 0 {
		return nil, fmt.Errorf("%q: want [METHOD ][HOST]/PATH", match)
	}
	host, path := strings.ToLower(rest[:slash]), rest[slash:]
	if p.fold {
		method, path = strings.ToUpper(method), foldString(path)
	}
	prefix := host
	if method != "" {
		prefix = method + " " + host
	}
	out := []string{prefix + path}
	if !p.optionalSlash || path == "/" {
		return out, nil
	}
	var alt string
	switch {
	case strings.HasSuffix(path, "/{$}"):
		alt = strings.TrimSuffix(path, "/{$}")
	case strings.HasSuffix(path, "/"):
		alt = strings.TrimSuffix(path, "/")
	case strings.HasSuffix(path, "...}"):
		alt = path[:strings.LastIndexByte(path, '/')]
	default:
		alt = path + "/{$}"
	}
	if alt != "" {
		out = append(out, prefix+alt)
	}
	return out, nil
}

// lookup is the route a door decides an HTTP request under (match, then resolve).
func (t *routeTable) lookup(d door, method, host, target string) (*route, routeOutcome) {
	rt, out := t.match(method, host, target)
	return t.resolve(d, rt, out)
}

// resolve is the route a door decides a request under: the matched one; at the check
// and RLS doors, for a request no route matches, the route routing.unmatched names
// (when it names one); otherwise the table's none route, with the outcome kept.
func (t *routeTable) resolve(d door, rt *route, out routeOutcome) (*route, routeOutcome) {
	switch {
	case out == outMatched:
		return rt, out
	case out == outUnmatched && d != doorProxy && t.unmatched != nil:
		return t.unmatched, outMatched
	}
	return t.none, out
}

// named is the route an RLS descriptor names by id: "*" is the "*" rule, named by the
// caller; an id no route has, or no route entry at all, is unmatched.
func (t *routeTable) named(id string, present bool) (*route, routeOutcome) {
	switch rt, ok := t.byID[id]; {
	case present && id == "*" && t.star != nil:
		return t.star, outMatched
	case ok:
		return rt, outMatched
	}
	return t.resolve(doorRLS, nil, outUnmatched)
}
