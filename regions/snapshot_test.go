package regions

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func defaultRule() Rule {
	return Rule{Tenant: "*", Route: "*", Capacity: 20, RefillPerSecond: 10, Shards: 1}
}

func mustSnapshot(t *testing.T, d SnapshotData) *Snapshot {
	t.Helper()
	s, err := NewSnapshot(d)
	if err != nil {
		t.Fatalf("NewSnapshot: %v", err)
	}
	return s
}

func TestRuleResolution(t *testing.T) {
	t.Parallel()
	rule := func(tenant, route string, capacity int64) Rule {
		return Rule{Tenant: tenant, Route: route, Capacity: capacity, RefillPerSecond: 1, Shards: 1}
	}
	all := []Rule{defaultRule(), rule("*", "r1", 2), rule("t", "*", 3), rule("t", "r1", 4)}
	tests := []struct {
		name          string
		rules         []Rule
		tenant, route string
		want          int64
	}{
		{"tenant and route", all, "t", "r1", 4},
		{"tenant default", all, "t", "r2", 3},
		{"route default", all, "u", "r1", 2},
		{"global default", all, "u", "r2", 20},
		{"tenant default beats route default", all[:3], "t", "r1", 3},
		{"route default when tenant has none", []Rule{defaultRule(), rule("*", "r1", 2), rule("t", "r2", 5)}, "t", "r1", 2},
		{"only the default", all[:1], "t", "r1", 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := mustSnapshot(t, SnapshotData{Rules: tt.rules})
			if got := s.Rule(tt.tenant, tt.route); got.Capacity != tt.want {
				t.Fatalf("Rule(%s, %s) = %+v, want capacity %d", tt.tenant, tt.route, got, tt.want)
			}
		})
	}
}

func TestEffectiveSharePrecedence(t *testing.T) {
	t.Parallel()
	const region = "us-east"
	// One share per level, each with its own value, so the answer names the level.
	type level struct {
		scope  Scope
		source Source
		value  float64
	}
	var (
		oTR = level{Scope{"t", "r"}, SourceOverride, 0.11}
		oT  = level{Scope{"t", "*"}, SourceOverride, 0.12}
		oG  = level{GlobalScope, SourceOverride, 0.13}
		rTR = level{Scope{"t", "r"}, SourceRebalancer, 0.21}
		rT  = level{Scope{"t", "*"}, SourceRebalancer, 0.22}
		rG  = level{GlobalScope, SourceRebalancer, 0.23}
	)
	tests := []struct {
		name       string
		levels     []level
		expired    []level // overrides that expired at t0
		route      string
		want       float64
		wantSource Source
	}{
		{"override tenant/route first", []level{oTR, oT, oG, rTR, rT, rG}, nil, "r", 0.11, SourceOverride},
		{"then override tenant", []level{oT, oG, rTR, rT, rG}, nil, "r", 0.12, SourceOverride},
		{"then override *", []level{oG, rTR, rT, rG}, nil, "r", 0.13, SourceOverride},
		{"then rebalancer tenant/route", []level{rTR, rT, rG}, nil, "r", 0.21, SourceRebalancer},
		{"then rebalancer tenant", []level{rT, rG}, nil, "r", 0.22, SourceRebalancer},
		{"then rebalancer *", []level{rG}, nil, "r", 0.23, SourceRebalancer},
		{"then an equal split", nil, nil, "r", 0.5, SourceDefault},
		{"override * beats rebalancer tenant/route", []level{oG, rTR}, nil, "r", 0.13, SourceOverride},
		{"override tenant covers every route", []level{oT, rTR}, nil, "r", 0.12, SourceOverride},
		{"another route's share does not apply", []level{oTR, rT}, nil, "other", 0.22, SourceRebalancer},
		{"expired override is ignored", []level{rTR}, []level{oTR, oT, oG}, "r", 0.21, SourceRebalancer},
		{"expired override falls back to the split", nil, []level{oG}, "r", 0.5, SourceDefault},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var shares []Share
			for _, l := range tt.levels {
				sh := Share{Scope: l.scope, Region: region, Share: l.value, Source: l.source}
				if l.source == SourceOverride {
					sh.ExpiresAt = t0.Add(time.Hour)
				}
				shares = append(shares, sh, Share{Scope: l.scope, Region: "eu-west", Share: 1 - l.value, Source: l.source})
			}
			for _, l := range tt.expired {
				shares = append(shares, Share{Scope: l.scope, Region: region, Share: 0.99, Source: l.source, ExpiresAt: t0})
			}
			// Another tenant's shares never apply.
			shares = append(shares, Share{Scope: Scope{"u", "*"}, Region: region, Share: 0.77, Source: SourceOverride})
			// Expired by the store's clock at load (LoadedAt), not by the reader's.
			s := mustSnapshot(t, SnapshotData{Regions: []string{region, "eu-west"}, Rules: []Rule{defaultRule()}, Shares: shares, LoadedAt: t0})
			got, src := s.Share(region, "t", tt.route)
			if math.Abs(got-tt.want) > 1e-12 || src != tt.wantSource {
				t.Fatalf("Share = %v (%s), want %v (%s)", got, src, tt.want, tt.wantSource)
			}
			// The next change of state: an override enters its transition ExpiryGrace
			// before it expires; one that expired at t0 leaves it ExpiryGrace after.
			wantNext := time.Time{}
			for _, l := range tt.levels {
				if l.source == SourceOverride {
					wantNext = t0.Add(time.Hour - ExpiryGrace)
				}
			}
			if len(tt.expired) > 0 {
				wantNext = t0.Add(ExpiryGrace)
			}
			if !s.NextExpiry().Equal(wantNext) {
				t.Fatalf("NextExpiry = %v, want %v", s.NextExpiry(), wantNext)
			}
		})
	}
}

func TestRegionalAndScopeShare(t *testing.T) {
	t.Parallel()
	s := mustSnapshot(t, SnapshotData{
		Regions: []string{"us-east", "eu-west"},
		Rules:   []Rule{defaultRule(), {Tenant: "shop-a", Route: "create-order", Capacity: 2000, RefillPerSecond: 1000, Shards: 1}},
		Shares: []Share{
			{Scope: Scope{Tenant: "shop-a"}, Region: "us-east", Share: 0.7, Source: SourceRebalancer}, // Route "" means "*"
			{Scope: Scope{Tenant: "shop-a"}, Region: "eu-west", Share: 0.3, Source: SourceRebalancer},
		},
	})
	r, lim, share := s.RegionalRule("us-east", "shop-a", "create-order")
	if r.Capacity != 2000 || lim.Capacity != 1400 || lim.RefillPerSecond != 700 || share != 0.7 {
		t.Fatalf("Regional = %+v %+v %v, want 2000 -> 1400/700 at 0.7", r, lim, share)
	}
	if _, lim, _ := s.RegionalRule("eu-west", "other", "x"); lim.Capacity != 10 || lim.RefillPerSecond != 5 {
		t.Fatalf("default rule at the equal split = %+v, want 10/5", lim)
	}
	for _, sc := range []Scope{{"shop-a", "*"}, {"shop-a", ""}} {
		if sh, ok := s.ScopeRow("eu-west", sc); !ok || sh.Share != 0.3 {
			t.Fatalf("ScopeShare(%+v) = %+v, %v; want 0.3", sc, sh, ok)
		}
	}
	if _, ok := s.ScopeRow("eu-west", GlobalScope); ok {
		t.Fatal("ScopeShare(*) found a share where there is none")
	}
	if got := s.Regions(); strings.Join(got, ",") != "us-east,eu-west" {
		t.Fatalf("Regions() = %v", got)
	}
}

func TestSnapshotKeysAndInstances(t *testing.T) {
	t.Parallel()
	s := mustSnapshot(t, SnapshotData{
		Regions: []string{"us-east"},
		Rules:   []Rule{defaultRule()},
		Keys: []APIKey{
			{ID: 1, Hash: HashKey("qp_good"), Tenant: "shop-a"},
			{ID: 2, Hash: HashKey("qp_revoked"), Tenant: "shop-a", RevokedAt: t0.Add(-time.Minute)},
		},
		Instances: []Instance{
			{ID: "gw-1", Region: "us-east", LastSeen: t0.Add(-5 * time.Second)},
			{ID: "gw-2", Region: "us-east", LastSeen: t0.Add(-15 * time.Second)},
			{ID: "gw-3", Region: "us-east", LastSeen: t0.Add(-16 * time.Second)},
			{ID: "gw-4", Region: "eu-west", LastSeen: t0},
		},
		InstanceTTL: 15 * time.Second,
		LoadedAt:    t0,
	})
	if tenant, ok := s.Tenant(HashKey("qp_good")); !ok || tenant != "shop-a" {
		t.Fatalf("valid key: %q, %v", tenant, ok)
	}
	for _, k := range []string{"qp_revoked", "qp_unknown", ""} {
		if tenant, ok := s.Tenant(HashKey(k)); ok {
			t.Fatalf("key %q authenticates as %q", k, tenant)
		}
	}
	if n := s.LiveInstances("us-east"); n != 2 {
		t.Fatalf("LiveInstances(us-east) = %d, want 2 (gw-3 is past the TTL)", n)
	}
	if n := s.LiveInstances("ap-south"); n != 0 {
		t.Fatalf("LiveInstances(ap-south) = %d, want 0", n)
	}
	if s.LoadedAt() != t0 || s.RuleCount() != 1 {
		t.Fatalf("LoadedAt %v RuleCount %d", s.LoadedAt(), s.RuleCount())
	}
}

func TestNewSnapshotRejectsBadData(t *testing.T) {
	t.Parallel()
	good := func() SnapshotData {
		return SnapshotData{
			Regions: []string{"us-east", "eu-west"},
			Rules:   []Rule{defaultRule(), {Tenant: "t", Route: "r", Capacity: 1, RefillPerSecond: 1, Shards: 1}},
			Keys:    []APIKey{{ID: 1, Hash: HashKey("k"), Tenant: "t"}},
			Shares:  []Share{{Scope: GlobalScope, Region: "us-east", Share: 0.5, Source: SourceRebalancer}},
		}
	}
	tests := []struct {
		name   string
		modify func(*SnapshotData)
		want   string // part of the error; "" = accepted
	}{
		{"good", func(*SnapshotData) {}, ""},
		{"no regions is fine", func(d *SnapshotData) { d.Regions, d.Shares = nil, nil }, ""},
		{"bad region id", func(d *SnapshotData) { d.Regions[1] = "eu west" }, "region id"},
		{"duplicate region", func(d *SnapshotData) { d.Regions[1] = "us-east" }, "duplicate region"},
		{"no default rule", func(d *SnapshotData) { d.Rules = d.Rules[1:] }, "no default rule"},
		{"duplicate rule", func(d *SnapshotData) { d.Rules = append(d.Rules, d.Rules[1]) }, "duplicate rule"},
		{"bad rule", func(d *SnapshotData) { d.Rules[1].Capacity = 0 }, "capacity"},
		{"bad rule tenant", func(d *SnapshotData) { d.Rules[1].Tenant = "t'" }, "tenant id"},
		{"key with bad tenant", func(d *SnapshotData) { d.Keys[0].Tenant = "*" }, "key 1"},
		{"share of unknown region", func(d *SnapshotData) { d.Shares[0].Region = "ap-south" }, "unknown region"},
		{"share above one", func(d *SnapshotData) { d.Shares[0].Share = 1.5 }, "share 1.5"},
		{"negative share", func(d *SnapshotData) { d.Shares[0].Share = -0.1 }, "share -0.1"},
		{"NaN share", func(d *SnapshotData) { d.Shares[0].Share = math.NaN() }, "share NaN"},
		{"bad share source", func(d *SnapshotData) { d.Shares[0].Source = SourceDefault }, "source"},
		{"bad share scope", func(d *SnapshotData) { d.Shares[0].Scope = Scope{"a b", "*"} }, "tenant id"},
		{"route scope without tenant", func(d *SnapshotData) { d.Shares[0].Scope = Scope{"*", "r"} }, "needs a tenant"},
		{"duplicate share", func(d *SnapshotData) { d.Shares = append(d.Shares, d.Shares[0]) }, "duplicate rebalancer share"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := good()
			tt.modify(&d)
			s, err := NewSnapshot(d)
			if tt.want == "" {
				if err != nil || s == nil {
					t.Fatalf("NewSnapshot rejected good data: %v", err)
				}
				return
			}
			if err == nil || s != nil {
				t.Fatalf("NewSnapshot accepted bad data (want %q)", tt.want)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want ErrInvalid mentioning %q", err, tt.want)
			}
		})
	}
}

func BenchmarkSnapshotHotPath(b *testing.B) {
	s, err := NewSnapshot(SnapshotData{
		Regions: []string{"us-east", "eu-west"},
		Rules:   []Rule{defaultRule(), {Tenant: "t", Route: "r", Capacity: 100, RefillPerSecond: 10, Shards: 1}},
		Keys:    []APIKey{{ID: 1, Hash: HashKey("k"), Tenant: "t"}},
		Shares:  []Share{{Scope: GlobalScope, Region: "us-east", Share: 0.7, Source: SourceRebalancer}},
	})
	if err != nil {
		b.Fatal(err)
	}
	h := HashKey("k")
	b.ReportAllocs()
	for b.Loop() {
		tenant, _ := s.Tenant(h)
		s.RegionalRule("us-east", tenant, "r")
	}
}

// TestRaise: a pair's raise, its tenant's every route's, its route's for every tenant
// and everything's fold into the later time and the smaller ratio; a raise for every
// region counts in each; the age runs from the store's clock at load plus the caller's
// time since.
func TestRaise(t *testing.T) {
	d := SnapshotData{
		Regions: []string{"us-east", "eu-west"},
		Rules:   []Rule{{Tenant: Wildcard, Route: Wildcard, Capacity: 20, RefillPerSecond: 10, Shards: 1}},
		Raises: []Raise{
			{Region: "us-east", Tenant: "a", Route: "r", At: t0.Add(-10 * time.Second), Ratio: 0.5},
			{Region: Wildcard, Tenant: "a", Route: Wildcard, At: t0.Add(-30 * time.Second), Ratio: 0.8},
			{Region: "eu-west", Tenant: Wildcard, Route: Wildcard, At: t0.Add(-5 * time.Second), Ratio: 0.9},
			{Region: Wildcard, Tenant: Wildcard, Route: "s", At: t0.Add(-20 * time.Second), Ratio: 0.7},
		},
		LoadedAt: t0,
	}
	s, err := NewSnapshot(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		region, tenant, route string
		ago                   time.Duration
		ratio                 float64
		ok                    bool
	}{
		{"us-east", "a", "r", 10*time.Second + time.Second, 0.5, true},
		{"us-east", "a", "q", 30*time.Second + time.Second, 0.8, true}, // not r's: only a's every route
		{"eu-west", "a", "r", 5*time.Second + time.Second, 0.8, true},  // its own 30 s ago folded with everyone's 5 s ago
		{"eu-west", "b", "r", 5*time.Second + time.Second, 0.9, true},
		{"us-east", "b", "s", 20*time.Second + time.Second, 0.7, true},
		{"us-east", "b", "r", 0, 0, false},
		{"ap-south", "a", "r", 0, 0, false},
	} {
		ago, ratio, ok := s.Raise(tt.region, tt.tenant, tt.route, time.Second)
		if ago != tt.ago || ratio != tt.ratio || ok != tt.ok {
			t.Errorf("Raise(%s, %s, %s) = %v, %v, %v; want %v, %v, %v", tt.region, tt.tenant, tt.route, ago, ratio, ok, tt.ago, tt.ratio, tt.ok)
		}
	}
}

// TestBandRaise: a band's bucket is held by the raises of its region's shares and of the
// band itself (route#band rows), never by a raise of the rule's own capacity, which
// would hold a slow band it did not raise for the band's whole fill time.
func TestBandRaise(t *testing.T) {
	d := SnapshotData{
		Regions: []string{"us-east", "eu-west"},
		Rules:   []Rule{{Tenant: Wildcard, Route: Wildcard, Capacity: 20, RefillPerSecond: 10, Shards: 1}},
		Raises: []Raise{
			{Region: Wildcard, Tenant: Wildcard, Route: "r", At: t0.Add(-10 * time.Second), Ratio: 0.1},      // the route's default raised
			{Region: Wildcard, Tenant: "a", Route: "r#hour", At: t0.Add(-20 * time.Second), Ratio: 0.5},      // a's hour band raised
			{Region: Wildcard, Tenant: Wildcard, Route: "*#day", At: t0.Add(-40 * time.Second), Ratio: 0.25}, // every day band raised
			{Region: "eu-west", Tenant: "a", Route: Wildcard, At: t0.Add(-5 * time.Second), Ratio: 0.8},      // a's share in eu-west raised
		},
		LoadedAt: t0,
	}
	s, err := NewSnapshot(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		region, tenant, route, band string
		ago                         time.Duration
		ratio                       float64
		ok                          bool
	}{
		{"us-east", "a", "r", "month", 0, 0, false},                            // the rule's own raise does not hold it
		{"us-east", "a", "r", "hour", 20*time.Second + time.Second, 0.5, true}, // its own raise
		{"us-east", "b", "r", "hour", 0, 0, false},                             // a's band, not b's
		{"us-east", "b", "q", "day", 40*time.Second + time.Second, 0.25, true}, // every tenant's, every route's
		{"eu-west", "a", "r", "month", 5*time.Second + time.Second, 0.8, true}, // a's share: every bucket
		{"eu-west", "a", "r", "hour", 20*time.Second + time.Second, 0.5, true}, // the tighter of the share's and its own
		{"ap-south", "a", "r", "hour", 0, 0, false},
	} {
		ago, ratio, ok := s.BandRaise(tt.region, tt.tenant, tt.route, tt.band, 1000*time.Hour, time.Second)
		if ago != tt.ago || ratio != tt.ratio || ok != tt.ok {
			t.Errorf("BandRaise(%s, %s, %s, %s) = %v, %v, %v; want %v, %v, %v", tt.region, tt.tenant, tt.route, tt.band, ago, ratio, ok, tt.ago, tt.ratio, tt.ok)
		}
	}
	// A share raise older than the band's fill time holds nothing: a recent raise of the
	// band is not given its small ratio (a fold of the two would).
	stale, err := NewSnapshot(SnapshotData{
		Regions: []string{"us-east"},
		Rules:   d.Rules,
		Raises: []Raise{
			{Region: "us-east", Tenant: Wildcard, Route: Wildcard, At: t0.Add(-48 * time.Hour), Ratio: 0.2},
			{Region: Wildcard, Tenant: "a", Route: "r#day", At: t0.Add(-time.Minute), Ratio: 0.5},
		},
		LoadedAt: t0,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ago, ratio, ok := stale.BandRaise("us-east", "a", "r", "day", 24*time.Hour, 0); !ok || ratio != 0.5 || ago != time.Minute {
		t.Errorf("a 2-day-old share raise and the band's own of a minute ago: %v, %v, %v; want the band's (1m, 0.5)", ago, ratio, ok)
	}
	if _, _, ok := stale.BandRaise("us-east", "b", "r", "day", 24*time.Hour, 0); ok {
		t.Error("a share raise older than the band's fill time still holds it")
	}
	// The rule's own bucket is held by the route's raise, as before.
	if _, ratio, ok := s.Raise("us-east", "a", "r", time.Second); !ok || ratio != 0.1 {
		t.Errorf("Raise(us-east, a, r) = %v, %v; want 0.1", ratio, ok)
	}
}

// TestExpiryTransition: an override within ExpiryGrace of its expiry gives every lookup
// the lower of it and what replaces it, so holders on either side of the expiry (old,
// transition, new; never old and new, as their clocks differ by less than the grace)
// enforce shares that sum to at most 1. At judges a held snapshot again.
func TestExpiryTransition(t *testing.T) {
	t.Parallel()
	exp := t0.Add(time.Minute)
	shares := []Share{
		{Scope: GlobalScope, Region: "us-east", Share: 0.1, Source: SourceOverride, ExpiresAt: exp},
		{Scope: GlobalScope, Region: "eu-west", Share: 0.9, Source: SourceOverride, ExpiresAt: exp},
		{Scope: GlobalScope, Region: "us-east", Share: 0.6, Source: SourceRebalancer},
		{Scope: GlobalScope, Region: "eu-west", Share: 0.4, Source: SourceRebalancer},
	}
	s := mustSnapshot(t, SnapshotData{Regions: []string{"us-east", "eu-west"}, Rules: []Rule{defaultRule()}, Shares: shares, LoadedAt: t0})
	if !s.NextExpiry().Equal(exp.Add(-ExpiryGrace)) {
		t.Fatalf("NextExpiry %v, want %v", s.NextExpiry(), exp.Add(-ExpiryGrace))
	}
	states := map[string]*Snapshot{"old": s, "transition": s.At(exp.Add(-ExpiryGrace)), "new": s.At(exp.Add(ExpiryGrace))}
	want := map[string][2]float64{"old": {0.1, 0.9}, "transition": {0.1, 0.4}, "new": {0.6, 0.4}}
	for name, snap := range states {
		us, _ := snap.Share("us-east", "t", "r")
		eu, _ := snap.Share("eu-west", "t", "r")
		if math.Abs(us-want[name][0]) > 1e-12 || math.Abs(eu-want[name][1]) > 1e-12 {
			t.Errorf("%s: us-east %v eu-west %v, want %v", name, us, eu, want[name])
		}
	}
	if !states["transition"].NextExpiry().Equal(exp.Add(ExpiryGrace)) || !states["new"].NextExpiry().IsZero() {
		t.Errorf("NextExpiry in transition %v, after %v", states["transition"].NextExpiry(), states["new"].NextExpiry())
	}
	for _, a := range []string{"old", "transition"} {
		for _, b := range []string{"transition", "new"} {
			if a == "old" && b == "new" {
				continue // never at once: the grace exceeds the holders' skew
			}
			us, _ := states[a].Share("us-east", "t", "r")
			eu, _ := states[b].Share("eu-west", "t", "r")
			us2, _ := states[b].Share("us-east", "t", "r")
			eu2, _ := states[a].Share("eu-west", "t", "r")
			if us+eu > 1+1e-12 || us2+eu2 > 1+1e-12 {
				t.Errorf("holders in %s and %s enforce %v and %v", a, b, us+eu, us2+eu2)
			}
		}
	}
	if s.At(t0.Add(-time.Second)) != s {
		t.Error("At before AsOf made a new snapshot")
	}
}

// TestPending: a raise of one region's share waits until every gateway of the other
// regions seen within AckHorizon has reported a transaction horizon above the raise's
// transaction; rule raises ("*") and expiries (no transaction) never wait.
func TestPending(t *testing.T) {
	base := SnapshotData{
		Regions:  []string{"us-east", "eu-west"},
		Rules:    []Rule{{Tenant: Wildcard, Route: Wildcard, Capacity: 20, RefillPerSecond: 10, Shards: 1}},
		LoadedAt: t0,
		Raises: []Raise{
			{Region: "us-east", Tenant: Wildcard, Route: Wildcard, At: t0.Add(-time.Second), Ratio: 0.5, Xid: 100, GateRatio: 0.5},
			{Region: Wildcard, Tenant: "a", Route: Wildcard, At: t0.Add(-time.Second), Ratio: 0.2, Xid: 101, GateRatio: 0.2},
			{Region: "eu-west", Tenant: "b", Route: "r", At: t0.Add(-time.Second), Ratio: 0.3}, // an expiry
		},
	}
	gw := func(region string, xmin int64, ago time.Duration) Instance {
		return Instance{ID: "gw-" + region, Region: region, LastSeen: t0.Add(-ago), SnapshotXmin: xmin}
	}
	for _, tt := range []struct {
		name      string
		instances []Instance
		region    string
		tenant    string
		ratio     float64
		pending   bool
	}{
		{"eu-west has not loaded the raise", []Instance{gw("eu-west", 100, time.Second)}, "us-east", "a", 0.5, true},
		{"eu-west never reported", []Instance{gw("eu-west", 0, time.Second)}, "us-east", "a", 0.5, true},
		{"eu-west has loaded it", []Instance{gw("eu-west", 101, time.Second)}, "us-east", "a", 0, false},
		{"eu-west gone past the horizon", []Instance{gw("eu-west", 100, AckHorizon+time.Second)}, "us-east", "a", 0, false},
		{"only us-east's own gateways", []Instance{gw("us-east", 1, time.Second)}, "us-east", "a", 0, false},
		{"no gateway anywhere", nil, "us-east", "a", 0, false},
		{"a rule raise in eu-west", []Instance{gw("us-east", 1, time.Second)}, "eu-west", "a", 0, false},
		{"an expiry in eu-west", []Instance{gw("us-east", 1, time.Second)}, "eu-west", "b", 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := base
			d.Instances = tt.instances
			s, err := NewSnapshot(d)
			if err != nil {
				t.Fatal(err)
			}
			ratio, pending := s.Pending(tt.region, tt.tenant, "r")
			if pending != tt.pending || ratio != tt.ratio {
				t.Errorf("Pending(%s, %s, r) = %v, %v; want %v, %v", tt.region, tt.tenant, ratio, pending, tt.ratio, tt.pending)
			}
			if n := s.HeldRaises(tt.region); (n > 0) != tt.pending {
				t.Errorf("HeldRaises(%s) = %d with Pending %v", tt.region, n, pending)
			}
		})
	}
}

// TestPendingOnlyTheDecidingScope: a raise of "*" in us-east holds the tenants that
// follow "*" (a) but not one whose share comes from rows of its own (sa), which that
// raise did not move; a raise of sa's own row holds sa. Before, the smallest gate of every
// scope applied to every pair: the black-box attack saw sa advertised 12 of its 19 for
// 3 s after a "*" raise in us-east.
func TestPendingOnlyTheDecidingScope(t *testing.T) {
	sa := Scope{Tenant: "sa", Route: "r"}
	d := SnapshotData{
		Regions:  []string{"us-east", "eu-west"},
		Rules:    []Rule{{Tenant: Wildcard, Route: Wildcard, Capacity: 20, RefillPerSecond: 10, Shards: 1}},
		LoadedAt: t0,
		Shares: []Share{
			{Scope: GlobalScope, Region: "us-east", Share: 0.8, Source: SourceRebalancer},
			{Scope: GlobalScope, Region: "eu-west", Share: 0.2, Source: SourceRebalancer},
			{Scope: sa, Region: "us-east", Share: 0.95, Source: SourceRebalancer},
			{Scope: sa, Region: "eu-west", Share: 0.05, Source: SourceRebalancer},
		},
		Raises:    []Raise{{Region: "us-east", Tenant: Wildcard, Route: Wildcard, At: t0.Add(-time.Second), Ratio: 0.625, Xid: 100, GateRatio: 0.625}},
		Instances: []Instance{{ID: "gw-eu", Region: "eu-west", LastSeen: t0.Add(-time.Second), SnapshotXmin: 90}},
	}
	s, err := NewSnapshot(d)
	if err != nil {
		t.Fatal(err)
	}
	if ratio, pending := s.Pending("us-east", "a", "r"); !pending || ratio != 0.625 {
		t.Errorf("a tenant following *: Pending = %v, %v; want 0.625, true", ratio, pending)
	}
	if ratio, pending := s.Pending("us-east", "sa", "r"); pending {
		t.Errorf("sa, with rows of its own: Pending = %v, true; want none (the * raise did not move it)", ratio)
	}
	d.Raises = append(d.Raises, Raise{Region: "us-east", Tenant: "sa", Route: "r", At: t0.Add(-time.Second), Ratio: 0.9, Xid: 101, GateRatio: 0.9})
	if s, err = NewSnapshot(d); err != nil {
		t.Fatal(err)
	}
	if ratio, pending := s.Pending("us-east", "sa", "r"); !pending || ratio != 0.9 {
		t.Errorf("sa's own row raised: Pending = %v, %v; want 0.9, true", ratio, pending)
	}
}

// TestRulePlans: a rule resolves tenant+route, tenant+*, plan+route, plan+*, *+route,
// *+*; a plan's rule comes back with its plan named, and a tenant without a plan (or on
// a plan without a rule that matches) skips the plan's steps.
func TestRulePlans(t *testing.T) {
	rule := func(tenant, route string, c int64) Rule {
		return Rule{Tenant: tenant, Route: route, Capacity: c, RefillPerSecond: 1, Shards: 1}
	}
	plan := func(p, route string, c int64) Rule {
		r := rule(Wildcard, route, c)
		r.Plan = p
		return r
	}
	s, err := NewSnapshot(SnapshotData{
		Rules:       []Rule{rule("*", "*", 1), rule("*", "r", 2), rule("own", "r", 3), rule("wide", "*", 4)},
		PlanRules:   []Rule{plan("pro", "*", 10), plan("pro", "search", 11), plan("free", "search", 12)},
		TenantPlans: []TenantPlan{{"a", "pro"}, {"own", "pro"}, {"wide", "pro"}, {"f", "free"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tenant, route string
		capacity      int64
		plan          string
	}{
		{"own", "r", 3, ""},          // tenant+route
		{"wide", "search", 4, ""},    // tenant+* beats the plan's route
		{"a", "search", 11, "pro"},   // plan+route
		{"a", "r", 10, "pro"},        // plan+* beats *+route
		{"own", "search", 11, "pro"}, // no own rule for search
		{"f", "search", 12, "free"},
		{"f", "r", 2, ""},    // free has no rule for r nor *: *+route
		{"f", "x", 1, ""},    // nor the default's
		{"none", "r", 2, ""}, // no plan
		{"none", "x", 1, ""},
	} {
		got := s.Rule(c.tenant, c.route)
		if got.Capacity != c.capacity || got.Plan != c.plan {
			t.Errorf("Rule(%s, %s) = capacity %d plan %q, want %d %q", c.tenant, c.route, got.Capacity, got.Plan, c.capacity, c.plan)
		}
	}
	if p, ok := s.TenantPlan("a"); !ok || p != "pro" {
		t.Errorf("TenantPlan(a) = %q, %v", p, ok)
	}
	if allocs := testing.AllocsPerRun(100, func() { s.Rule("a", "r") }); allocs != 0 {
		t.Errorf("Rule through a plan allocates %v times", allocs)
	}
	for _, bad := range []SnapshotData{
		{Rules: []Rule{rule("*", "*", 1)}, PlanRules: []Rule{rule("*", "x", 1)}},
		{Rules: []Rule{rule("*", "*", 1)}, PlanRules: []Rule{plan("pro", "x", 1), plan("pro", "x", 2)}},
		{Rules: []Rule{rule("*", "*", 1)}, PlanRules: []Rule{plan("bad plan", "x", 1)}},
		{Rules: []Rule{rule("*", "*", 1)}, TenantPlans: []TenantPlan{{"a", "pro"}, {"a", "free"}}},
		{Rules: []Rule{rule("*", "*", 1)}, TenantPlans: []TenantPlan{{"*", "pro"}}},
	} {
		if _, err := NewSnapshot(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewSnapshot(%+v): %v, want ErrInvalid", bad, err)
		}
	}
}

// BenchmarkSnapshotRulePlan is the hot path's lookup for a tenant on a plan (compare
// BenchmarkSnapshotHotPath, a tenant's own rule).
func BenchmarkSnapshotRulePlan(b *testing.B) {
	rules := []Rule{defaultRule()}
	var tps []TenantPlan
	for i := range 1000 {
		tps = append(tps, TenantPlan{Tenant: "t" + strconv.Itoa(i), Plan: "pro"})
	}
	s, err := NewSnapshot(SnapshotData{
		Regions:     []string{"us-east", "eu-west"},
		Rules:       rules,
		PlanRules:   []Rule{{Plan: "pro", Tenant: Wildcard, Route: Wildcard, Capacity: 200, RefillPerSecond: 100, Shards: 1}},
		TenantPlans: tps,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.RegionalRule("us-east", "t7", "r")
	}
}

// TestChangedAgo: a limit is dated by the latest of its rule's row, the share rows that
// decide it (an override before a rebalancer row, the pair before the tenant and "*")
// and a raise of the pair; a row that decides nothing does not date it.
func TestChangedAgo(t *testing.T) {
	at := func(s time.Duration) time.Time { return t0.Add(-s * time.Second) }
	d := SnapshotData{
		Regions: []string{"us-east", "eu-west"},
		Rules: []Rule{
			{Tenant: Wildcard, Route: Wildcard, Capacity: 20, RefillPerSecond: 10, Shards: 1, UpdatedAt: at(900)},
			{Tenant: "a", Route: "r", Capacity: 20, RefillPerSecond: 10, Shards: 1, UpdatedAt: at(100)},
		},
		Shares: []Share{
			{Scope: GlobalScope, Region: "us-east", Share: 0.5, Source: SourceRebalancer, UpdatedAt: at(300)},
			{Scope: GlobalScope, Region: "eu-west", Share: 0.5, Source: SourceRebalancer, UpdatedAt: at(300)},
			{Scope: Scope{"b", Wildcard}, Region: "us-east", Share: 0.7, Source: SourceOverride, UpdatedAt: at(50)},
			{Scope: Scope{"b", Wildcard}, Region: "eu-west", Share: 0.3, Source: SourceOverride, UpdatedAt: at(50)},
			{Scope: Scope{"b", "r"}, Region: "us-east", Share: 0.6, Source: SourceRebalancer, UpdatedAt: at(5)}, // beneath b's override
			{Scope: Scope{"b", "r"}, Region: "eu-west", Share: 0.4, Source: SourceRebalancer, UpdatedAt: at(5)},
		},
		Raises:   []Raise{{Region: "eu-west", Tenant: "c", Route: "r", At: at(20), Ratio: 0.5}},
		LoadedAt: t0,
	}
	s, err := NewSnapshot(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		region, tenant, route string
		want                  time.Duration
	}{
		{"us-east", "a", "r", 101 * time.Second}, // its own rule, newer than the share
		{"us-east", "a", "q", 301 * time.Second}, // the default rule, older than the share
		{"us-east", "b", "r", 51 * time.Second},  // the override decides, not the newer rebalancer row
		{"eu-west", "c", "r", 21 * time.Second},  // the raise
		{"us-east", "c", "r", 301 * time.Second},
	} {
		raised, _, _ := s.Raise(tt.region, tt.tenant, tt.route, time.Second)
		got := s.ChangedAgo(tt.region, tt.tenant, tt.route, s.Rule(tt.tenant, tt.route), raised, time.Second)
		if got != tt.want {
			t.Errorf("ChangedAgo(%s, %s, %s) = %v, want %v", tt.region, tt.tenant, tt.route, got, tt.want)
		}
	}
	bare, err := NewSnapshot(SnapshotData{Regions: []string{"us-east"}, Rules: []Rule{{Tenant: Wildcard, Route: Wildcard, Capacity: 1, RefillPerSecond: 1, Shards: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := bare.ChangedAgo("us-east", "a", "r", bare.Rule("a", "r"), 0, time.Second); got != 0 {
		t.Errorf("nothing dated: ChangedAgo = %v, want 0", got)
	}
}
