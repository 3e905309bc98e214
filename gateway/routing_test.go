package gateway

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestCanonicalPath: the canonical form of each spelling under the default rules and
// under the looser settings.
func TestCanonicalPath(t *testing.T) {
	def := RoutingConfig{}.rules()
	loose := RoutingConfig{DotSegments: routingResolve, EncodedSlashes: routingDecode}.rules()
	exact := RoutingConfig{Case: routingExact, PathParams: routingRefuse}.rules()
	for _, tc := range []struct {
		rules        pathRules
		target, want string // want "" means refused
	}{
		{def, "/orders", "/orders"},
		{def, "/Orders/", "/orders/"},
		{def, "/ORDERS?x=1", "/orders"},
		{def, "/orders;jsessionid=1", "/orders"},
		{def, "/a;x/b;y", "/a/b"},
		{def, "/%6Frders", "/orders"},
		{def, "http://example.com/Orders", "/orders"},
		{def, "/", "/"},
		{def, "/orders#frag", ""},
		{def, "/orders?a#frag", ""},
		{def, "/x/../orders", ""},
		{def, "/x/%2e%2E/orders", ""},
		{def, "//orders", ""},
		{def, "/orders/.", ""},
		{def, "/orders%2Fx", ""},
		{def, "/orders%5cx", ""},
		{def, `/orders\x`, ""},
		{def, "/orders%00", ""},
		{def, "/or%zzders", ""},
		{def, "orders", ""},
		{def, "*", ""},
		{loose, "/x/../orders", "/orders"},
		{loose, "/x/%2e%2e/Orders/", "/orders/"},
		{loose, "//orders", "/orders"},
		{loose, "/a/b/..", "/a/"},
		{loose, "/orders%2Fx", "/orders/x"},
		{loose, `/orders\x`, "/orders/x"},
		{loose, "/../..", "/"},
		{exact, "/Orders", "/Orders"},
		{exact, "/orders;x", ""},
		{def, "/\u212Aits", "/kits"}, // the Kelvin sign folds to k
	} {
		got, err := tc.rules.canonicalPath(tc.target)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%+v %q: %q, want refused", tc.rules, tc.target, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v %q: %q %v, want %q", tc.rules, tc.target, got, err, tc.want)
		}
	}
}

// TestRoutingConflicts: two routes that only the rules make equal are a config error
// naming both.
func TestRoutingConflicts(t *testing.T) {
	for _, tc := range []struct {
		a, b    string
		routing RoutingConfig
		want    string
	}{
		{"POST /orders", "POST /Orders", RoutingConfig{}, `"POST /Orders" matches the same requests as routes[0].match "POST /orders" under the routing rules (routing.case: fold, routing.trailing_slash: optional)`},
		{"GET /docs/", "GET /docs", RoutingConfig{}, `"GET /docs" matches the same requests as routes[0].match "GET /docs/"`},
		{"POST /orders", "POST /Orders", RoutingConfig{Case: routingExact}, ""},
		{"GET /docs/", "GET /docs", RoutingConfig{TrailingSlash: routingExact}, ""},
	} {
		cfg := articleConfig("us-east", "http://127.0.0.1:1", "")
		cfg.Routes = []RouteConfig{{ID: "a", Match: tc.a, Upstream: "http://127.0.0.1:1"}, {ID: "b", Match: tc.b, Upstream: "http://127.0.0.1:1"}}
		cfg.Tenants[0].Rules = nil
		cfg.Tenants[1].Rules = nil
		cfg.Routing = tc.routing
		err := cfg.normalize()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s / %s %+v: %v", tc.a, tc.b, tc.routing, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s / %s: %v, want %s", tc.a, tc.b, err, tc.want)
		}
	}
}

// FuzzCanonicalPath: any request target either is refused or has a canonical form that
// starts with '/', has no dot, empty or control segment, no backslash, is folded when
// folding, and is the same for the upper-case spelling of the target.
func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{"/orders", "/Orders/", "/orders;x=1", "/x/%2e%2e/orders", "/orders#f", "//a", "/a%2Fb", `/a\b`, "/%zz", "http://h/A", "/\u212A", "/a/./b/../c/"} {
		f.Add(s, uint8(0))
	}
	f.Fuzz(func(t *testing.T, target string, bits uint8) {
		rules := pathRules{fold: bits&1 == 0, optionalSlash: true, stripParams: bits&2 == 0, resolveDots: bits&4 != 0, decodeSlashes: bits&8 != 0}
		got, err := rules.canonicalPath(target)
		if err != nil {
			return
		}
		if got == "" || got[0] != '/' || strings.Contains(got, "//") || strings.ContainsAny(got, "\\\x00\x7f") {
			t.Fatalf("%q -> %q", target, got)
		}
		for _, seg := range strings.Split(strings.Trim(got, "/"), "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("%q -> %q: a dot segment", target, got)
			}
		}
		if rules.fold && foldString(got) != got {
			t.Fatalf("%q -> %q: not folded", target, got)
		}
		if rules.fold && !strings.Contains(target, "%") && utf8.ValidString(target) {
			if up, err := rules.canonicalPath(strings.ToUpper(target)); err != nil || up != got {
				t.Fatalf("%q -> %q, but its upper case -> %q %v", target, got, up, err)
			}
		}
	})
}

// FuzzLimitByValue: a limit_by value is refused or normalised to one key: trimmed, no
// list, parameter or quote, at most 256 bytes, the same again when normalised twice,
// and case-blind with fold.
func FuzzLimitByValue(f *testing.F) {
	for _, s := range []string{"acme", "ACME", " acme ", "acme,", "acme, x", "acme;x", `"acme"`, "a  b", "a\tb", "\x00", "Ünïcode"} {
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, v string, fold bool) {
		got, ok := normalValue(v, fold)
		if !ok {
			return
		}
		if got == "" || len(got) > 256 || strings.ContainsAny(got, ",;\"\t") || got != strings.TrimSpace(got) || strings.Contains(got, "  ") {
			t.Fatalf("%q -> %q", v, got)
		}
		if again, ok := normalValue(got, fold); !ok || again != got {
			t.Fatalf("%q -> %q -> %q %v: not one key", v, got, again, ok)
		}
		if fold && utf8.ValidString(v) {
			if up, ok := normalValue(strings.ToUpper(v), fold); ok && up != got {
				t.Fatalf("%q -> %q but %q -> %q", v, got, strings.ToUpper(v), up)
			}
		}
	})
}
