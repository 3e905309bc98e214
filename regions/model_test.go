package regions

import (
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestValidateID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		id   string
		ok   bool
	}{
		{"letters", "shop", true},
		{"every allowed class", "Shop-A_1.b", true},
		{"one char", "a", true},
		{"64 chars", strings.Repeat("x", 64), true},
		{"dots only", "...", true},
		{"empty", "", false},
		{"65 chars", strings.Repeat("x", 65), false},
		{"very long", strings.Repeat("x", 10000), false},
		{"space", "shop a", false},
		{"tab", "shop\ta", false},
		{"newline at end", "shop\n", false},
		{"nul", "shop\x00", false},
		{"wildcard", "*", false},
		{"slash", "shop/route", false},
		{"colon", "shop:a", false},
		{"percent", "100%", false},
		{"cyrillic a look-alike", "shop-\u0430", false},
		{"greek omicron look-alike", "sh\u03bfp", false},
		{"fullwidth s", "\uff53hop", false},
		{"zero-width space", "shop\u200b", false},
		{"combining accent", "shope\u0301", false},
		{"latin1 e acute", "caf\u00e9", false},
		{"invalid utf8", "shop\xff", false},
		{"sql quote", "a'b", false},
		{"sql injection", "x'; DROP TABLE api_key; --", false},
		{"sql comment", "a--b/*c*/", false},
		{"semicolon", "a;b", false},
		{"regex meta", "a+b", false},
		{"backslash", `a\b`, false},
		{"the metrics' remainder label", OtherLabel, false},
		{"like it, not it", "_other2", true},
	}
	if err := ValidateID("region", OtherLabel); err != nil {
		t.Errorf("ValidateID(region, %q) = %v: only tenants and routes reserve it", OtherLabel, err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateID("tenant", tt.id)
			if tt.ok && err != nil {
				t.Fatalf("ValidateID(%q) = %v, want nil", tt.id, err)
			}
			if !tt.ok {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("ValidateID(%q) = %v, want ErrInvalid", tt.id, err)
				}
				if !strings.Contains(err.Error(), "tenant") {
					t.Fatalf("error %q does not name the kind", err)
				}
				if len(err.Error()) > 200 {
					t.Fatalf("error is %d bytes long: an over-long id must not be echoed whole", len(err.Error()))
				}
			}
		})
	}
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func FuzzValidateID(f *testing.F) {
	for _, s := range []string{"shop-a", "", "*", "a/b", "shop-\u0430", strings.Repeat("a", 64), strings.Repeat("a", 65), "a\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := ValidateID("route", id)
		if want := idPattern.MatchString(id); want != (err == nil) {
			t.Fatalf("ValidateID(%q) = %v; the pattern says valid=%v", id, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("ValidateID(%q) = %v, not ErrInvalid", id, err)
		}
	})
}

func TestRuleBounds(t *testing.T) {
	t.Parallel()
	ok := Rule{Tenant: "t", Route: "r", Capacity: MaxCapacity, RefillPerSecond: MaxRefillPerSecond, Shards: 1}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a rule at the bounds: %v", err)
	}
	for _, r := range []Rule{
		{Tenant: "t", Route: "r", Capacity: MaxCapacity + 1, RefillPerSecond: 1, Shards: 1},
		{Tenant: "t", Route: "r", Capacity: math.MaxInt64, RefillPerSecond: 1, Shards: 1},
		{Tenant: "t", Route: "r", Capacity: 1, RefillPerSecond: MaxRefillPerSecond * 10, Shards: 1},
		{Tenant: "t", Route: "r", Capacity: 1, RefillPerSecond: math.Inf(1), Shards: 1},
	} {
		if err := r.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "at most") && !strings.Contains(err.Error(), "between 1 and") {
			t.Errorf("%+v: %v, want ErrInvalid naming the bound", r, err)
		}
	}
}

func TestScale(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		capacity int64
		refill   float64
		share    float64
		want     Limit
	}{
		{"whole", 1000, 100, 1, Limit{1000, 100}},
		{"half", 10, 5, 0.5, Limit{5, 2.5}},
		{"70 percent", 2000, 1000, 0.7, Limit{1400, 700}},
		{"rounds half away from zero", 5, 10, 0.7, Limit{4, 7}}, // 3.5 -> 4
		{"rounds down", 10, 1, 0.33, Limit{3, 0.33}},            // 3.3 -> 3
		{"rounds up", 10, 1, 0.37, Limit{4, 0.37}},              // 3.7 -> 4
		{"exact half of odd", 3, 1, 0.5, Limit{2, 0.5}},         // 1.5 -> 2
		{"min one token", 7, 1, 0.05, Limit{1, 0.05}},           // 0.35 -> 1
		{"zero share keeps one token and a tiny refill", 100, 10, 0, Limit{1, 10 * MinScaleShare}},
		{"NaN share is the minimum", 100, 10, math.NaN(), Limit{1, 10 * MinScaleShare}},
		{"negative share is the minimum", 100, 10, -1, Limit{1, 10 * MinScaleShare}},
		{"capacity one", 1, 0.3, 0.3, Limit{1, 0.09}},
		{"fractional refill", 2, 0.3, 0.5, Limit{1, 0.15}},
		// Issue 14 item 5: MaxInt64, a natural "unlimited", wrapped around to 1 token.
		{"MaxInt64 saturates, never wraps to 1 token", math.MaxInt64, 1, 1, Limit{MaxCapacity, 1}},
		{"MaxInt64 halved saturates", math.MaxInt64, 1, 0.5, Limit{MaxCapacity, 0.5}},
		{"huge refill saturates", 10, 1e300, 1, Limit{10, MaxRefillPerSecond}},
		{"the bounds themselves", MaxCapacity, MaxRefillPerSecond, 1, Limit{MaxCapacity, MaxRefillPerSecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Scale(tt.capacity, tt.refill, tt.share)
			if got.Capacity != tt.want.Capacity || math.Abs(got.RefillPerSecond-tt.want.RefillPerSecond) > 1e-12 {
				t.Fatalf("Scale(%d, %v, %v) = %+v, want %+v", tt.capacity, tt.refill, tt.share, got, tt.want)
			}
		})
	}
}

func TestRuleValidate(t *testing.T) {
	t.Parallel()
	good := Rule{Tenant: "shop-a", Route: "create-order", Capacity: 2, RefillPerSecond: 1, Shards: 1}
	tests := []struct {
		name   string
		modify func(*Rule)
		ok     bool
	}{
		{"good", func(*Rule) {}, true},
		{"default rule", func(r *Rule) { r.Tenant, r.Route = "*", "*" }, true},
		{"fractional refill", func(r *Rule) { r.RefillPerSecond = 0.001 }, true},
		{"max shards", func(r *Rule) { r.Shards = 1024 }, true},
		{"bad tenant", func(r *Rule) { r.Tenant = "a b" }, false},
		{"empty route", func(r *Rule) { r.Route = "" }, false},
		{"zero capacity", func(r *Rule) { r.Capacity = 0 }, false},
		{"negative capacity", func(r *Rule) { r.Capacity = -1 }, false},
		{"zero refill", func(r *Rule) { r.RefillPerSecond = 0 }, false},
		{"NaN refill", func(r *Rule) { r.RefillPerSecond = math.NaN() }, false},
		{"infinite refill", func(r *Rule) { r.RefillPerSecond = math.Inf(1) }, false},
		{"zero shards", func(r *Rule) { r.Shards = 0 }, false},
		{"too many shards", func(r *Rule) { r.Shards = 1025 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := good
			tt.modify(&r)
			err := r.Validate()
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", r, err, tt.ok)
			}
		})
	}
}

func TestParseScope(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Scope
		ok   bool
	}{
		{"*", GlobalScope, true},
		{"shop-a", Scope{"shop-a", "*"}, true},
		{"shop-a/create-order", Scope{"shop-a", "create-order"}, true},
		{"", Scope{}, false},
		{"shop-a/", Scope{}, false},
		{"/route", Scope{}, false},
		{"*/route", Scope{}, false},
		{"shop-a/*", Scope{}, false},
		{"a/b/c", Scope{}, false},
		{"shop a", Scope{}, false},
		{"**", Scope{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseScope(tt.in)
			if !tt.ok {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("ParseScope(%q) = %v, %v; want ErrInvalid", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseScope(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
			if got.String() != tt.in {
				t.Fatalf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
}

func FuzzParseScope(f *testing.F) {
	for _, s := range []string{"*", "shop-a", "shop-a/r", "a/b/c", "*/r", "a/", "", "a/*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, err := ParseScope(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseScope(%q) = %v, not ErrInvalid", s, err)
			}
			return
		}
		if sc.String() != s {
			t.Fatalf("ParseScope(%q).String() = %q", s, sc.String())
		}
		if err := sc.Validate(); err != nil {
			t.Fatalf("ParseScope(%q) = %+v, which does not Validate: %v", s, sc, err)
		}
		again, err := ParseScope(sc.String())
		if err != nil || again != sc {
			t.Fatalf("round trip of %q: %+v, %v; want %+v", s, again, err, sc)
		}
	})
}

func TestScopeValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		scope Scope
		ok    bool
	}{
		{GlobalScope, true},
		{Scope{"*", ""}, true},
		{Scope{"t", "*"}, true},
		{Scope{"t", ""}, true},
		{Scope{"t", "r"}, true},
		{Scope{"*", "r"}, false},
		{Scope{"", ""}, false},
		{Scope{"t", "a/b"}, false},
		{Scope{"t u", "*"}, false},
	}
	for _, tt := range tests {
		if err := tt.scope.Validate(); tt.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%+v.Validate() = %v, want ok=%v", tt.scope, err, tt.ok)
		}
	}
}

func TestValidateShares(t *testing.T) {
	t.Parallel()
	regions := []string{"us-east", "eu-west"}
	tests := []struct {
		name   string
		shares map[string]float64
		ok     bool
	}{
		{"70/30", map[string]float64{"us-east": 0.7, "eu-west": 0.3}, true},
		{"all in one", map[string]float64{"us-east": 1, "eu-west": 0}, true},
		{"within tolerance", map[string]float64{"us-east": 0.7, "eu-west": 0.3 + 0.9e-6}, true},
		{"outside tolerance", map[string]float64{"us-east": 0.7, "eu-west": 0.3 + 2e-6}, false},
		{"sum below 1", map[string]float64{"us-east": 0.5, "eu-west": 0.3}, false},
		{"missing region", map[string]float64{"us-east": 1}, false},
		{"unknown region", map[string]float64{"us-east": 0.5, "eu-west": 0.3, "ap-south": 0.2}, false},
		{"negative", map[string]float64{"us-east": 1.2, "eu-west": -0.2}, false},
		{"above one", map[string]float64{"us-east": 1.5, "eu-west": -0.5}, false},
		{"NaN", map[string]float64{"us-east": math.NaN(), "eu-west": 0.3}, false},
		{"empty", map[string]float64{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateShares(tt.shares, regions)
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("ValidateShares(%v) = %v, want ok=%v", tt.shares, err, tt.ok)
			}
		})
	}
}

func TestShareActive(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		expires time.Time
		want    bool
	}{
		{time.Time{}, true},
		{now.Add(time.Second), true},
		{now, false},
		{now.Add(-time.Second), false},
	} {
		if got := (Share{ExpiresAt: tt.expires}).Active(now); got != tt.want {
			t.Errorf("Active with expiry %v at %v = %v, want %v", tt.expires, now, got, tt.want)
		}
	}
}

func TestHashKey(t *testing.T) {
	t.Parallel()
	a, b := HashKey("qp_a"), HashKey("qp_b")
	if a == b || a != HashKey("qp_a") {
		t.Fatal("HashKey is not a deterministic, distinguishing hash")
	}
}

// TestAPIKeyJSON: the key's JSON is ratectl's public shape, in UTC, without the hash.
func TestAPIKeyJSON(t *testing.T) {
	t.Parallel()
	est := time.FixedZone("EST", -5*3600)
	created := time.Date(2026, 3, 1, 7, 0, 0, 0, est)
	tests := []struct {
		name string
		key  APIKey
		want string
	}{
		{"valid", APIKey{ID: 7, Hash: HashKey("secret"), Tenant: "shop-a", Label: "ci", CreatedAt: created},
			`{"id":7,"tenant":"shop-a","label":"ci","created_at":"2026-03-01T12:00:00Z","revoked_at":null}`},
		{"revoked", APIKey{ID: 8, Tenant: "shop-b", CreatedAt: created, RevokedAt: created.Add(time.Hour)},
			`{"id":8,"tenant":"shop-b","label":"","created_at":"2026-03-01T12:00:00Z","revoked_at":"2026-03-01T13:00:00Z"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, err := json.Marshal(tt.key)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("got  %s\nwant %s", b, tt.want)
			}
		})
	}
}
