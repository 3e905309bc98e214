package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// TestParseLimitsRefuses: what YAML would silently read as something else than written is
// refused, naming the line and the field (an id that YAML reads as a number, a fractional
// capacity, a second document), and so is a file that is not a valid configuration.
func TestParseLimitsRefuses(t *testing.T) {
	t.Parallel()
	const rule = `{tenant: "*", route: "*", capacity: 1, refill_per_second: 1}`
	for _, tc := range []struct{ name, yaml, contains string }{
		{"tenant 0042", "rules:\n  - " + rule + "\n  - {tenant: 0042, route: '*', capacity: 1, refill_per_second: 1}\n", `line 3: rules[1].tenant: 0042 is read by YAML as a number, not as the text written: quote it ("0042")`},
		{"route 1.10", "rules:\n  - {tenant: a, route: 1.10, capacity: 1, refill_per_second: 1}\n", `line 2: rules[0].route: 1.10 is read by YAML as a number`},
		{"region number", "regions: [us-east, 1.10]\n", `line 1: regions[1]: 1.10 is read by YAML as a number`},
		{"region bool", "regions:\n  - true\n", `line 2: regions[0]: true is read by YAML as a boolean`},
		{"key tenant", "keys:\n  - {sha256: x, tenant: 7}\n", `keys[0].tenant: 7 is read by YAML as a number`},
		{"share region", "regions: ['1']\noverrides:\n  - {scope: '*', shares: {1: 1}, reason: x}\n", `line 3: overrides[0].shares key: 1 is read by YAML as a number`},
		{"fractional capacity", "rules:\n  - {tenant: '*', route: '*', capacity: 20.7, refill_per_second: 1}\n", `line 2: rules[0].capacity: 20.7 is not a whole number`},
		{"fractional shards", "rules:\n  - {tenant: '*', route: '*', capacity: 2, refill_per_second: 1, shards: 1.5}\n", `rules[0].shards: 1.5 is not a whole number`},
		{"tagged number", "regions: [!!str 1.10]\n", `regions[0]: 1.10 is read by YAML as a number`},
		{"second document", "regions: [a]\n---\nregions: [b]\n", `line 3: a second YAML document (after ---): a limits file holds one`},
		{"deep", "regions: " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\n", "nested deeper than 64 levels"},
		{"unknown key", "rulez: []\n", `unknown field "rulez"`},
		{"empty", "", "the file is empty"},
		{"no default rule", "rules:\n  - {tenant: a, route: '*', capacity: 1, refill_per_second: 1}\n", "the default rule (tenant *, route *) must be listed"},
		{"shares not summing to 1", "regions: [a, b]\noverrides:\n  - {scope: '*', shares: {a: 0.5, b: 0.6}, reason: x}\n", "sum to 1.1"},
		{"bad hash", "keys:\n  - {sha256: abc, tenant: a}\n", "want 64 hex digits"},
		{"bad expiry", "regions: [a]\noverrides:\n  - {scope: '*', shares: {a: 1}, reason: x, expires_at: tomorrow}\n", "want an RFC 3339 time"},
		{"hostile id", "regions: [\"a'; DROP TABLE region; --\"]\n", "invalid"},
		{"plan rule capacity", "plans:\n  - name: pro\n    rules:\n      - {route: '*', capacity: 2.5, refill_per_second: 1}\n", `line 4: plans[0].rules[0].capacity: 2.5 is not a whole number`},
		{"plan route number", "plans:\n  - name: pro\n    rules:\n      - {route: 1.10, capacity: 2, refill_per_second: 1}\n", `plans[0].rules[0].route: 1.10 is read by YAML as a number`},
		{"plan name number", "plans:\n  - {name: 42, rules: []}\n", `plans[0].name: 42 is read by YAML as a number`},
		{"plan rule tenant", "plans:\n  - name: pro\n    rules:\n      - {tenant: a, route: '*', capacity: 2, refill_per_second: 1}\n", `unknown field "tenant"`},
		{"plan twice", "plans:\n  - {name: pro, rules: []}\n  - {name: pro, rules: []}\n", "plans: pro listed twice"},
		{"plan route twice", "plans:\n  - name: pro\n    rules:\n      - {route: '*', capacity: 2, refill_per_second: 1}\n      - {route: '*', capacity: 3, refill_per_second: 1}\n", "plans pro: route * listed twice"},
		{"plan bad rule", "plans:\n  - name: pro\n    rules:\n      - {route: '*', capacity: 0, refill_per_second: 1}\n", "plans pro route *:"},
		{"tenant plan number", "tenant_plans:\n  - {tenant: 7, plan: pro}\n", `tenant_plans[0].tenant: 7 is read by YAML as a number`},
		{"tenant two plans", "tenant_plans:\n  - {tenant: a, plan: pro}\n  - {tenant: a, plan: free}\n", "tenant a listed twice"},
		{"tenant plan wildcard", "tenant_plans:\n  - {tenant: '*', plan: pro}\n", "tenant_plans:"},
		{"too large", "regions: [a]\n" + strings.Repeat(" ", MaxLimitsSize), fmt.Sprintf("larger than %d bytes", MaxLimitsSize)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseLimits(context.Background(), []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.contains) {
				t.Errorf("ParseLimits: %v, want an error containing %q", err, tc.contains)
			}
		})
	}
}

// TestParseLimitsAsWritten: quoted ids are read exactly as written, however much they
// look like numbers.
func TestParseLimitsAsWritten(t *testing.T) {
	t.Parallel()
	c, err := ParseLimits(context.Background(), []byte("regions: [\"0042\", '1.10']\nrules:\n"+
		"  - {tenant: '*', route: '*', capacity: 1, refill_per_second: 1}\n"+
		"  - {tenant: \"0042\", route: '1.10', capacity: 3, refill_per_second: 0.5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := *c.Regions; len(got) != 2 || got[0] != "0042" || got[1] != "1.10" {
		t.Errorf("regions %q, want [0042 1.10] as written", got)
	}
	if r := (*c.Rules)[1]; r.Tenant != "0042" || r.Route != "1.10" || r.Capacity != 3 {
		t.Errorf("rule %+v, want tenant 0042, route 1.10 as written", r)
	}
}

// TestParseLimitsBudget: a "billion laughs" file of a few hundred bytes (nine levels of ten
// aliases: 10^9 nodes expanded) fails at once with an error naming the budget, instead of
// eating gigabytes; and reading stops when the context ends (SIGTERM).
func TestParseLimitsBudget(t *testing.T) {
	t.Parallel()
	laughs := billionLaughs()
	if len(laughs) > 600 {
		t.Fatalf("the file is %d bytes, want a few hundred", len(laughs))
	}
	start := time.Now()
	_, err := ParseLimits(context.Background(), []byte(laughs))
	if err == nil || !strings.Contains(err.Error(), "more than 5000000 YAML nodes once aliases are expanded") {
		t.Errorf("billion laughs: %v, want the node budget's error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("billion laughs took %v to refuse", d)
	}

	// A large valid file, read with the context already cancelled.
	var big strings.Builder
	big.WriteString("rules:\n")
	for i := range 20000 {
		fmt.Fprintf(&big, "  - {tenant: t%d, route: r, capacity: 1, refill_per_second: 1}\n", i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ParseLimits(ctx, []byte(big.String())); !errors.Is(err, context.Canceled) {
		t.Errorf("parse after cancel: %v, want context.Canceled", err)
	}
	// The walk over the nodes stops too (decodeLimits waits for nothing once ctx ends).
	if _, err := decodeLimitsNow(ctx, []byte(big.String())); !errors.Is(err, context.Canceled) {
		t.Errorf("node walk after cancel: %v, want context.Canceled", err)
	}
}

// billionLaughs is a YAML file of a few hundred bytes that expands to 10^9 nodes.
func billionLaughs() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i <= 9; i++ {
		p := fmt.Sprintf("*a%d", i-1)
		fmt.Fprintf(&b, "a%d: &a%d [%s]\n", i, i, strings.Repeat(p+", ", 9)+p)
	}
	return b.String()
}

// TestMarshalLimitsRoundTrip: what MarshalLimits and MarshalLimitsJSON write, ParseLimits
// reads back as the same configuration; a section left out stays out.
func TestMarshalLimitsRoundTrip(t *testing.T) {
	t.Parallel()
	hash := regions.HashKey("qp_secret")
	c := Config{
		Regions: &[]string{"eu-west", "us-east"},
		Rules: &[]regions.Rule{
			{Tenant: "*", Route: "*", Capacity: 10, RefillPerSecond: 2, Shards: 1},
			{Tenant: "shop-a", Route: "search", Capacity: 7, RefillPerSecond: 0.5, Shadow: true, Shards: 4},
		},
		Overrides: &[]Override{{
			Scope:     regions.Scope{Tenant: "shop-a", Route: "*"},
			Shares:    map[string]float64{"eu-west": 0.25, "us-east": 0.75},
			ExpiresAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
			Reason:    "migration",
		}},
		Keys: &[]KeySpec{{Hash: hash, Tenant: "shop-a", Label: "ci"}},
		Plans: &[]regions.Plan{
			{Name: "pro", Rules: []regions.Rule{
				{Route: "*", Capacity: 200, RefillPerSecond: 100},
				{Route: "search", Capacity: 20, RefillPerSecond: 0.5, Shadow: true, Shards: 2},
			}},
			{Name: "empty"},
		},
		TenantPlans: &[]regions.TenantPlan{{Tenant: "shop-b", Plan: "pro"}, {Tenant: "shop-a", Plan: "empty"}},
	}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	for name, marshal := range map[string]func(Config) ([]byte, error){"yaml": MarshalLimits, "json": MarshalLimitsJSON} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseLimits(context.Background(), b)
			if err != nil {
				t.Fatalf("%v:\n%s", err, b)
			}
			if !reflect.DeepEqual(got, c) {
				t.Errorf("read back %+v, want %+v:\n%s", got, c, b)
			}
			rulesOnly, err := marshal(Config{Rules: c.Rules})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := ParseLimits(context.Background(), rulesOnly); err != nil || got.Regions != nil || got.Overrides != nil || got.Keys != nil || got.Plans != nil || got.TenantPlans != nil {
				t.Errorf("rules only: %+v, %v; want the other sections absent:\n%s", got, err, rulesOnly)
			}
		})
	}
}

func TestParseKeyHash(t *testing.T) {
	t.Parallel()
	want := regions.HashKey("qp_x")
	for _, s := range []string{fmt.Sprintf("%x", want), fmt.Sprintf(" sha256:%x\n", want)} {
		if h, err := ParseKeyHash(s); err != nil || h != want {
			t.Errorf("ParseKeyHash(%q) = %x, %v; want %x", s, h, err, want)
		}
	}
	long := strings.Repeat("z", 100)
	if _, err := ParseKeyHash(long); err == nil || !strings.Contains(err.Error(), `sha256 "`+long[:80]+`...": want 64 hex digits`) {
		t.Errorf("ParseKeyHash of 100 bytes: %v, want the first 80 quoted", err)
	}
}

// FuzzParseLimits: ParseLimits never panics on any input, and what it accepts,
// MarshalLimits writes back to a file it reads as the same configuration.
func FuzzParseLimits(f *testing.F) {
	for _, s := range []string{
		"rules:\n  - {tenant: '*', route: '*', capacity: 1, refill_per_second: 1}\n",
		"regions: [a, b]\noverrides:\n  - {scope: 't/r', shares: {a: 0.25, b: 0.75}, reason: x, expires_at: '2030-01-01T00:00:00.5Z'}\n",
		"keys:\n  - {sha256: '" + strings.Repeat("ab", 32) + "', tenant: t, label: \"a: b # c\"}\n",
		`{"regions": ["a"], "rules": [{"tenant": "*", "route": "*", "capacity": 3, "refill_per_second": 0.5, "shards": 2}]}`,
		"rules:\n  - {tenant: '*', route: '*', capacity: 2, refill_per_second: 1, bands: [{name: h, capacity: 7, per: 1h}, {name: d, capacity: 3, refill_per_second: 0.7}]}\n",
		billionLaughs(),
		"a: &a [*a]\n",
		"regions: !!map {}\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := ParseLimits(context.Background(), []byte(in))
		if err != nil {
			return
		}
		b, err := MarshalLimits(c)
		if err != nil {
			t.Fatalf("MarshalLimits of a parsed file: %v", err)
		}
		back, err := ParseLimits(context.Background(), b)
		if err != nil {
			t.Fatalf("the marshalled file does not parse: %v\n%s", err, b)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("read back %+v, want %+v:\n%s", back, c, b)
		}
	})
}

// TestMarshalLimitsQuotesNonFiniteIDs: ids YAML would read as infinity or NaN (.inf,
// -.inf, .NaN: valid ids) are written quoted, as values and as map keys, so what export
// writes apply -f reads back.
func TestMarshalLimitsQuotesNonFiniteIDs(t *testing.T) {
	t.Parallel()
	c := Config{
		Regions: &[]string{".inf", "-.inf", ".nan", ".NaN", ".INF", "eu-west"},
		Rules: &[]regions.Rule{
			{Tenant: "*", Route: "*", Capacity: 10, RefillPerSecond: 2, Shards: 1},
			{Tenant: ".nan", Route: ".Inf", Capacity: 7, RefillPerSecond: 0.5, Shards: 1},
		},
		Overrides: &[]Override{{
			Scope:  regions.Scope{Tenant: "-.inf", Route: "*"},
			Shares: map[string]float64{".inf": 0.25, "-.inf": 0.25, ".nan": 0.25, ".NaN": 0, ".INF": 0, "eu-west": 0.25},
			Reason: ".inf",
		}},
		Plans:       &[]regions.Plan{{Name: ".NAN", Rules: []regions.Rule{{Route: ".nan", Capacity: 5, RefillPerSecond: 1}}}},
		TenantPlans: &[]regions.TenantPlan{{Tenant: ".inf", Plan: ".NAN"}},
	}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	b, err := MarshalLimits(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseLimits(context.Background(), b)
	if err != nil {
		t.Fatalf("ParseLimits of what MarshalLimits wrote: %v\n%s", err, b)
	}
	if !reflect.DeepEqual(back, c) {
		t.Errorf("round trip:\n got %+v\nwant %+v\n%s", back, c, b)
	}
}
