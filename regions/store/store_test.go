package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

func TestOpenNeverShowsThePassword(t *testing.T) {
	t.Parallel()
	port, err := testenv.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	const secret = "s3cr3t-Pw_9"
	tests := []struct {
		name    string
		url     string
		invalid bool   // a malformed url: ErrInvalid
		shows   string // the message names the server
	}{
		{"url, nothing listening", fmt.Sprintf("postgres://bob:%s@127.0.0.1:%d/db?sslmode=disable", secret, port), false, fmt.Sprintf("127.0.0.1:%d", port)},
		{"url with password parameter", fmt.Sprintf("postgres://bob@127.0.0.1:%d/db?sslmode=disable&password=%s", port, secret), false, fmt.Sprintf("127.0.0.1:%d", port)},
		{"key=value, nothing listening", fmt.Sprintf("host=127.0.0.1 port=%d user=bob password=%s dbname=db sslmode=disable", port, secret), false, fmt.Sprintf("127.0.0.1:%d", port)},
		{"key=value, quoted password", fmt.Sprintf("host=127.0.0.1 port=%d user=bob password='%s' dbname=db sslmode=disable", port, secret), false, fmt.Sprintf("127.0.0.1:%d", port)},
		{"malformed port", "postgres://bob:" + secret + "@127.0.0.1:notaport/db", true, "postgres://"},
		{"malformed url", "postgres://bob:" + secret + "@[::1/db", true, "postgres://"},
		{"malformed key=value", "host=127.0.0.1 password=" + secret + " port=x1", true, "password=xxxxx"},
		{"unknown sslmode", fmt.Sprintf("postgres://bob:%s@127.0.0.1:%d/db?sslmode=bogus", secret, port), true, fmt.Sprintf("127.0.0.1:%d", port)},
		// pgx reads no userinfo (a '/' comes before the '@'), so the password would be its database name.
		{"slash in password, parses", fmt.Sprintf("postgres://127.0.0.1:%d/%s@x/db?sslmode=disable", port, secret), false, "postgres://127.0.0.1:xxxxx@x/db"},
		{"slash in password, does not parse", "postgres://bob:x/" + secret + "@127.0.0.1:5432/db", true, "postgres://bob:xxxxx@127.0.0.1:5432/db"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := Open(ctx, tt.url)
			if err == nil {
				// Open dials nothing: the first connection is where an unreachable server
				// shows, with the same redaction.
				err = s.Ping(ctx)
				s.Close()
				if err == nil {
					t.Fatal("Open and Ping succeeded")
				}
			}
			msg := err.Error()
			if strings.Contains(msg, secret) {
				t.Fatalf("error shows the password: %s", msg)
			}
			if !strings.Contains(msg, tt.shows) {
				t.Fatalf("error %q does not show %q", msg, tt.shows)
			}
			if tt.invalid != errors.Is(err, regions.ErrInvalid) {
				t.Fatalf("errors.Is(ErrInvalid) = %v, want %v: %s", !tt.invalid, tt.invalid, msg)
			}
			if r := RedactURL(tt.url); strings.Contains(r, secret) {
				t.Fatalf("RedactURL shows the password: %s", r)
			}
		})
	}
}

func TestStoreRegions(t *testing.T) {
	t.Parallel()
	ctx := WithAudit(context.Background(), "alice", "new datacenter")
	s, _ := newStore(t)
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddRegion(ctx, "us-east"); !errors.Is(err, ErrExists) {
		t.Fatalf("adding a region twice: %v, want ErrExists", err)
	}
	if err := s.AddRegion(ctx, "us east"); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("adding a bad region: %v, want ErrInvalid", err)
	}
	got, err := s.Regions(ctx)
	if err != nil || strings.Join(got, ",") != "eu-west,us-east" {
		t.Fatalf("Regions = %v, %v", got, err)
	}
	if n := count(t, s, `SELECT count(*) FROM audit_log WHERE object = 'region' AND actor = 'alice' AND reason = 'new datacenter'`); n != 2 {
		t.Fatalf("%d audit rows for two added regions", n)
	}

	if err := s.RemoveRegion(ctx, "ap-south", RefuseInUse); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removing an unknown region: %v, want ErrNotFound", err)
	}
	if err := s.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.6, "eu-west": 0.4}, "alice", "test", 0); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveRegion(ctx, "eu-west", RefuseInUse); !errors.Is(err, ErrRegionInUse) {
		t.Fatalf("removing a region with shares: %v, want ErrRegionInUse", err)
	}
	if got, _ := s.Regions(ctx); len(got) != 2 {
		t.Fatalf("refused removal removed something: %v", got)
	}
	if err := s.RemoveRegion(ctx, "eu-west", DropShares); err != nil {
		t.Fatalf("forced removal: %v", err)
	}
	if got, _ := s.Regions(ctx); strings.Join(got, ",") != "us-east" {
		t.Fatalf("after forced removal: %v", got)
	}
	if n := count(t, s, `SELECT count(*) FROM region_share WHERE region = 'eu-west'`); n != 0 {
		t.Fatalf("%d shares of the removed region remain", n)
	}
	if n := count(t, s, `SELECT count(*) FROM region_share_history WHERE region = 'eu-west' AND new_share IS NULL AND actor = 'alice'`); n != 1 {
		t.Fatalf("%d history rows for the forced deletion of eu-west's share", n)
	}
}

func TestStoreKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)

	secret, k, err := s.CreateKey(ctx, "shop-a", "ci pipeline")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(secret, KeyPrefix))
	if !strings.HasPrefix(secret, KeyPrefix) || err != nil || len(raw) != 32 {
		t.Fatalf("secret %q: want %s + base64url of 32 bytes (%v)", secret, KeyPrefix, err)
	}
	if k.ID == 0 || k.Tenant != "shop-a" || k.Label != "ci pipeline" || k.Hash != regions.HashKey(secret) || k.CreatedAt.IsZero() {
		t.Fatalf("returned key %+v", k)
	}
	if n := count(t, s, `SELECT count(*) FROM api_key WHERE key_hash = $1`, k.Hash[:]); n != 1 {
		t.Fatalf("stored hash rows: %d", n)
	}
	if n := count(t, s, `SELECT count(*) FROM api_key WHERE position($1::bytea IN key_hash) > 0 OR label LIKE '%' || $2 || '%'`, []byte(secret), secret); n != 0 {
		t.Fatal("the secret is stored")
	}
	secret2, _, err := s.CreateKey(ctx, "shop-b", "")
	if err != nil || secret2 == secret {
		t.Fatalf("second key: %q, %v", secret2, err)
	}

	for _, bad := range []struct{ tenant, label string }{{"*", ""}, {"", ""}, {"a b", ""}, {"shop-a", strings.Repeat("x", 201)}, {"shop-a", "a\nb"}, {"shop-a", "\xff"}} {
		if _, _, err := s.CreateKey(ctx, bad.tenant, bad.label); !errors.Is(err, regions.ErrInvalid) {
			t.Errorf("CreateKey(%q, %q) = %v, want ErrInvalid", bad.tenant, bad.label, err)
		}
	}
	if n := count(t, s, `SELECT count(*) FROM api_key`); n != 2 {
		t.Fatalf("%d keys after invalid creates, want 2", n)
	}

	all, err := s.Keys(ctx, "")
	if err != nil || len(all) != 2 || all[0].ID != k.ID || all[0].Hash != k.Hash {
		t.Fatalf("Keys(all) = %+v, %v", all, err)
	}
	if mine, _ := s.Keys(ctx, "shop-b"); len(mine) != 1 || mine[0].Tenant != "shop-b" {
		t.Fatalf("Keys(shop-b) = %+v", mine)
	}
	for tenant, want := range map[string]bool{"shop-a": true, "shop-c": false} {
		if ok, err := s.TenantExists(ctx, tenant); err != nil || ok != want {
			t.Fatalf("TenantExists(%s) = %v, %v", tenant, ok, err)
		}
	}
	if err := s.SetRule(ctx, regions.Rule{Tenant: "shop-c", Route: "*", Capacity: 1, RefillPerSecond: 1}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.TenantExists(ctx, "shop-c"); !ok {
		t.Fatal("a tenant with a rule does not exist")
	}

	snap, err := s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tenant, ok := snap.Tenant(regions.HashKey(secret)); !ok || tenant != "shop-a" {
		t.Fatalf("new key does not authenticate: %q %v", tenant, ok)
	}
	if err := s.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, k.ID); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	if err := s.RevokeKey(ctx, 999999); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoking an unknown key: %v, want ErrNotFound", err)
	}
	if keys, _ := s.Keys(ctx, "shop-a"); len(keys) != 1 || keys[0].RevokedAt.IsZero() {
		t.Fatalf("revoked key listed as %+v", keys)
	}
	snap, err = s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := snap.Tenant(regions.HashKey(secret)); ok {
		t.Fatal("revoked key authenticates")
	}
	if _, ok := snap.Tenant(regions.HashKey(secret2)); !ok {
		t.Fatal("the other key stopped authenticating")
	}
}

func TestStoreRules(t *testing.T) {
	t.Parallel()
	ctx := WithAudit(context.Background(), "bob", "ticket 7")
	s, _ := newStore(t)
	rule := regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 2, RefillPerSecond: 0.5, Shadow: true}
	if err := s.SetRule(ctx, rule); err != nil {
		t.Fatal(err)
	}
	rule.Capacity, rule.Shards = 5, 4
	if err := s.SetRule(ctx, rule); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRule(ctx, regions.Rule{Tenant: "*", Route: "create-order", Capacity: 50, RefillPerSecond: 25}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Rules(ctx, "shop-a", "")
	if err != nil || len(got) != 1 {
		t.Fatalf("Rules(shop-a) = %+v, %v", got, err)
	}
	if r := got[0]; r.Capacity != 5 || r.RefillPerSecond != 0.5 || !r.Shadow || r.Shards != 4 || r.UpdatedAt.IsZero() {
		t.Fatalf("upserted rule = %+v", r)
	}
	snap, err := s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot decodes rules by hand: it must agree with Scan.
	if r := snap.Rule("shop-a", "create-order"); r.Tenant != got[0].Tenant || r.Route != got[0].Route || r.Capacity != got[0].Capacity ||
		r.RefillPerSecond != got[0].RefillPerSecond || r.Shadow != got[0].Shadow || r.Shards != got[0].Shards || !r.UpdatedAt.Equal(got[0].UpdatedAt) {
		t.Fatalf("snapshot rule %+v, stored %+v", r, got[0])
	}
	if all, _ := s.Rules(ctx, "", ""); len(all) != 3 || all[0].Tenant != "*" || all[0].Route != "*" {
		t.Fatalf("Rules() = %+v, want 3 with the default first", all)
	}
	if byRoute, _ := s.Rules(ctx, "", "create-order"); len(byRoute) != 2 {
		t.Fatalf("Rules(route create-order) = %+v", byRoute)
	}
	if wild, _ := s.Rules(ctx, "*", ""); len(wild) != 2 {
		t.Fatalf("Rules(tenant *) = %+v", wild)
	}

	bad := []regions.Rule{
		{Tenant: "shop a", Route: "*", Capacity: 1, RefillPerSecond: 1},
		{Tenant: "t", Route: "*", Capacity: 0, RefillPerSecond: 1},
		{Tenant: "t", Route: "*", Capacity: 1, RefillPerSecond: -1},
		{Tenant: "t", Route: "*", Capacity: 1, RefillPerSecond: 1, Shards: 2000},
	}
	for _, r := range bad {
		if err := s.SetRule(ctx, r); !errors.Is(err, regions.ErrInvalid) {
			t.Errorf("SetRule(%+v) = %v, want ErrInvalid", r, err)
		}
	}
	if _, err := s.Rules(ctx, "a'b", ""); !errors.Is(err, regions.ErrInvalid) {
		t.Errorf("Rules with a bad tenant filter: %v", err)
	}
	if n := count(t, s, `SELECT count(*) FROM rate_limit_rule`); n != 3 {
		t.Fatalf("%d rules after invalid writes, want 3", n)
	}

	if err := s.DeleteRule(ctx, "*", "*"); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("deleting the default rule: %v, want ErrInvalid", err)
	}
	if err := s.DeleteRule(ctx, "shop-a", "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleting a missing rule: %v, want ErrNotFound", err)
	}
	if err := s.DeleteRule(ctx, "shop-a", "create-order"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Rules(ctx, "shop-a", ""); len(got) != 0 {
		t.Fatalf("deleted rule still listed: %+v", got)
	}
	// insert, update, insert, delete: each audited with the actor and reason of ctx.
	if n := count(t, s, `SELECT count(*) FROM audit_log WHERE object = 'rate_limit_rule' AND actor = 'bob' AND reason = 'ticket 7'`); n != 4 {
		t.Fatalf("%d audit rows for 4 rule writes", n)
	}
	if n := count(t, s, `SELECT count(*) FROM audit_log WHERE object = 'rate_limit_rule' AND action = 'update' AND (old->>'capacity')::int = 2 AND (new->>'capacity')::int = 5`); n != 1 {
		t.Fatal("the update's audit row does not hold old and new values")
	}
}

func TestStoreOverrides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	shopA := regions.Scope{Tenant: "shop-a", Route: regions.Wildcard}
	bad := []struct {
		name          string
		scope         regions.Scope
		shares        map[string]float64
		actor, reason string
		ttl           time.Duration
	}{
		{"sum above one", shopA, map[string]float64{"us-east": 0.8, "eu-west": 0.3}, "op", "r", 0},
		{"missing region", shopA, map[string]float64{"us-east": 1}, "op", "r", 0},
		{"unknown region", shopA, map[string]float64{"us-east": 0.5, "eu-west": 0.3, "ap-south": 0.2}, "op", "r", 0},
		{"bad region id", shopA, map[string]float64{"us east": 1}, "op", "r", 0},
		{"negative", shopA, map[string]float64{"us-east": 1.5, "eu-west": -0.5}, "op", "r", 0},
		{"bad scope", regions.Scope{Tenant: "*", Route: "r"}, map[string]float64{"us-east": 0.5, "eu-west": 0.5}, "op", "r", 0},
		{"no reason", shopA, map[string]float64{"us-east": 0.5, "eu-west": 0.5}, "op", "", 0},
		{"no actor", shopA, map[string]float64{"us-east": 0.5, "eu-west": 0.5}, "", "r", 0},
		{"negative ttl", shopA, map[string]float64{"us-east": 0.5, "eu-west": 0.5}, "op", "r", -time.Second},
	}
	for _, tt := range bad {
		if err := s.SetOverride(ctx, tt.scope, tt.shares, tt.actor, tt.reason, tt.ttl); !errors.Is(err, regions.ErrInvalid) {
			t.Errorf("%s: SetOverride = %v, want ErrInvalid", tt.name, err)
		}
	}
	if n := count(t, s, `SELECT count(*) FROM region_share`) + count(t, s, `SELECT count(*) FROM region_share_history`); n != 0 {
		t.Fatalf("invalid overrides wrote %d rows", n)
	}

	if err := s.SetOverride(ctx, shopA, map[string]float64{"us-east": 0.7, "eu-west": 0.3}, "alice", "failover drill", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.5, "eu-west": 0.5}, "alice", "even split", 0); err != nil {
		t.Fatal(err)
	}
	shares, err := s.Shares(ctx)
	if err != nil || len(shares) != 4 {
		t.Fatalf("Shares = %+v, %v", shares, err)
	}
	// Sorted by scope ("*" < "shop-a"), region, source.
	if sh := shares[3]; sh.Scope != shopA || sh.Region != "us-east" || sh.Share != 0.7 || sh.Source != regions.SourceOverride || sh.Reason != "failover drill" {
		t.Fatalf("shares[3] = %+v", sh)
	}
	if exp := shares[3].ExpiresAt.Sub(shares[3].UpdatedAt); exp < 59*time.Minute || exp > 61*time.Minute {
		t.Fatalf("override expires %v after it was set, want 1h", exp)
	}
	if !shares[0].ExpiresAt.IsZero() {
		t.Fatalf("ttl 0 override expires at %v", shares[0].ExpiresAt)
	}

	snap, err := s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	now := snap.LoadedAt()
	if v, src := snap.Share("eu-west", "shop-a", "create-order"); v != 0.3 || src != regions.SourceOverride {
		t.Fatalf("EffectiveShare(eu-west, shop-a) = %v %s", v, src)
	}
	if v, _ := snap.Share("eu-west", "shop-b", "x"); v != 0.5 {
		t.Fatalf("EffectiveShare(eu-west, shop-b) = %v", v)
	}
	// Expiry is the database's: a reader whose clock is 2 h ahead still gets the
	// override; the snapshot says when to reload instead.
	if v, _ := snap.Share("eu-west", "shop-a", "x"); v != 0.3 {
		t.Fatalf("EffectiveShare(eu-west, shop-a) by a clock 2 h ahead = %v, want the override's 0.3", v)
	}
	if d := snap.NextExpiry().Sub(now); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("NextExpiry %v after the load, want the override's 1 h", d)
	}

	// Replace, then clear.
	if err := s.SetOverride(ctx, shopA, map[string]float64{"us-east": 0.9, "eu-west": 0.1}, "carol", "more", 0); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearOverride(ctx, shopA, "dave", "drill over"); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearOverride(ctx, shopA, "dave", "again"); err != nil {
		t.Fatalf("clearing nothing: %v", err)
	}
	if err := s.ClearOverride(ctx, shopA, "dave", ""); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("clearing without a reason: %v", err)
	}
	if n := count(t, s, `SELECT count(*) FROM region_share WHERE scope = 'shop-a'`); n != 0 {
		t.Fatalf("%d shop-a shares after clear", n)
	}

	hist, err := s.History(ctx, HistoryFilter{Tenant: "shop-a"})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range hist {
		lines = append(lines, fmt.Sprintf("%s %s %s %s %s %s", e.Scope, e.Region, e.Source, fptr(e.Old), fptr(e.New), e.Actor+":"+e.Reason))
	}
	want := []string{ // newest first; within one transaction, by id descending
		"shop-a us-east override 0.9 - dave:drill over",
		"shop-a eu-west override 0.1 - dave:drill over",
		"shop-a us-east override 0.7 0.9 carol:more",
		"shop-a eu-west override 0.3 0.1 carol:more",
		"shop-a us-east override - 0.7 alice:failover drill",
		"shop-a eu-west override - 0.3 alice:failover drill",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("History(shop-a):\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if h, _ := s.History(ctx, HistoryFilter{Scope: &regions.GlobalScope}); len(h) != 2 {
		t.Fatalf("History(*) = %d entries, want 2", len(h))
	}
	if h, _ := s.History(ctx, HistoryFilter{Limit: 3}); len(h) != 3 || h[0].ID < h[2].ID {
		t.Fatalf("History(limit 3) = %+v", h)
	}
	if h, _ := s.History(ctx, HistoryFilter{Since: time.Now().Add(time.Hour)}); len(h) != 0 {
		t.Fatalf("History(since the future) = %d entries", len(h))
	}
	if _, err := s.History(ctx, HistoryFilter{Tenant: "a%"}); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("History with a bad tenant: %v", err)
	}
}

func TestStoreRebalancerShares(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	inputs := map[string]any{"demand_rps": map[string]float64{"us-east": 700, "eu-west": 300}}
	changes := []ShareChange{
		{Scope: regions.GlobalScope, Region: "us-east", Old: 0.5, New: 0.7, Reason: "waterfill"},
		{Scope: regions.GlobalScope, Region: "eu-west", Old: 0.5, New: 0.3, Reason: "waterfill"},
		{Scope: regions.Scope{Tenant: "shop-a", Route: "create-order"}, Region: "eu-west", New: 0.4, Inputs: map[string]string{"status": "UNKNOWN"}},
	}
	if err := s.WriteRebalancerShares(ctx, changes, inputs, "rebalancer"); err != nil {
		t.Fatal(err)
	}
	// A write that changes nothing leaves no history; one bad change rolls the call back.
	if err := s.WriteRebalancerShares(ctx, changes[:1], inputs, "rebalancer"); err != nil {
		t.Fatal(err)
	}
	badCall := []ShareChange{{Scope: regions.GlobalScope, Region: "us-east", New: 0.1}, {Scope: regions.GlobalScope, Region: "ap-south", New: 0.9}}
	if err := s.WriteRebalancerShares(ctx, badCall, nil, "rebalancer"); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("share of an unknown region: %v, want ErrInvalid", err)
	}
	for _, c := range []ShareChange{{Scope: regions.GlobalScope, Region: "us-east", New: 1.2}, {Scope: regions.Scope{Tenant: "", Route: ""}, Region: "us-east", New: 0.2}} {
		if err := s.WriteRebalancerShares(ctx, []ShareChange{c}, nil, "rebalancer"); !errors.Is(err, regions.ErrInvalid) {
			t.Fatalf("WriteRebalancerShares(%+v) = %v, want ErrInvalid", c, err)
		}
	}
	if err := s.WriteRebalancerShares(ctx, changes, nil, ""); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("no actor: %v", err)
	}

	shares, err := s.Shares(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sh := range shares {
		if sh.Source != regions.SourceRebalancer || !sh.ExpiresAt.IsZero() {
			t.Fatalf("share %+v", sh)
		}
		got[sh.Scope.String()+"@"+sh.Region] = sh.Share
	}
	if len(got) != 3 || got["*@us-east"] != 0.7 || got["*@eu-west"] != 0.3 || got["shop-a/create-order@eu-west"] != 0.4 {
		t.Fatalf("stored shares %v (the failed call must have written nothing)", got)
	}

	hist, err := s.History(ctx, HistoryFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 3 {
		t.Fatalf("%d history rows, want 3: %+v", len(hist), hist)
	}
	for _, e := range hist {
		if e.Actor != "rebalancer" || e.Old != nil || e.New == nil {
			t.Fatalf("history entry %+v", e)
		}
		var in map[string]any
		if err := json.Unmarshal(e.Inputs, &in); err != nil {
			t.Fatalf("inputs %s: %v", e.Inputs, err)
		}
		switch e.Scope {
		case regions.GlobalScope:
			if e.Reason != "waterfill" || in["demand_rps"] == nil {
				t.Fatalf("entry %+v inputs %s", e, e.Inputs)
			}
		default:
			if in["status"] != "UNKNOWN" {
				t.Fatalf("per-change inputs lost: %s", e.Inputs)
			}
		}
	}
	if h, _ := s.History(ctx, HistoryFilter{Tenant: "shop-a"}); len(h) != 1 || h[0].Scope.Route != "create-order" {
		t.Fatalf("History(tenant shop-a) = %+v", h)
	}
}

func TestStoreInstances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	for _, id := range []string{"gw-1", "gw-2"} {
		if err := s.Heartbeat(ctx, id, "us-east"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Heartbeat(ctx, "gw-3", "eu-west"); err != nil {
		t.Fatal(err)
	}
	if err := s.Heartbeat(ctx, "gw:1", "us-east"); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("bad instance id: %v", err)
	}
	if err := s.Heartbeat(ctx, "gw-1", "us east"); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("bad region: %v", err)
	}
	exec(t, s, `UPDATE gateway_instance SET last_seen = now() - interval '1 hour' WHERE id = 'gw-2'`)
	in, err := s.Instances(ctx)
	if err != nil || len(in) != 3 || in[0].ID != "gw-3" || in[1].ID != "gw-1" || in[1].LastSeen.IsZero() {
		t.Fatalf("Instances = %+v, %v", in, err)
	}
	snap, err := s.LoadSnapshot(ctx, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n := snap.LiveInstances("us-east"); n != 1 {
		t.Fatalf("live us-east instances %d, want 1 (gw-2 is stale)", n)
	}
	if err := s.Heartbeat(ctx, "gw-2", "us-east"); err != nil {
		t.Fatal(err)
	}
	if snap, _ = s.LoadSnapshot(ctx, 15*time.Second); snap.LiveInstances("us-east") != 2 {
		t.Fatalf("after a heartbeat: %d live", snap.LiveInstances("us-east"))
	}
	if err := s.RemoveInstance(ctx, "gw-2"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveInstance(ctx, "gw-2"); err != nil {
		t.Fatalf("removing twice: %v", err)
	}
	if in, _ := s.Instances(ctx); len(in) != 2 {
		t.Fatalf("after removal: %+v", in)
	}
}

// TestLoadSnapshotLarge loads 100k rules and 100k keys and reports how long it takes.
func TestLoadSnapshotLarge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	const rules, keys = 100_000, 100_000
	seed(t, s, rules, keys)
	var best time.Duration
	for i := range 3 {
		start := time.Now()
		snap, err := s.LoadSnapshot(ctx, time.Minute)
		d := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if snap.RuleCount() != rules+1 {
			t.Fatalf("%d rules loaded, want %d", snap.RuleCount(), rules+1)
		}
		if tenant, ok := snap.Tenant(regions.HashKey("key-77")); !ok || tenant != "t77" {
			t.Fatalf("key-77 -> %q %v", tenant, ok)
		}
		if i == 0 || d < best {
			best = d
		}
	}
	t.Logf("LoadSnapshot of %d rules + %d keys: best of 3 %v", rules, keys, best)
	if best > 10*time.Second {
		t.Fatalf("LoadSnapshot took %v", best)
	}
}

// BenchmarkLoadSnapshot measures a reload at the article's scale: 100k rules, 1M keys.
// Run with: go test -run XXX -bench LoadSnapshot -benchtime 5x ./regions/
func BenchmarkLoadSnapshot(b *testing.B) {
	ctx := context.Background()
	url := testenv.PostgresDB(b)
	s, err := Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	seed(b, s, 100_000, 1_000_000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.LoadSnapshot(ctx, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

// seed bulk-inserts rules t0..t(n-1) with route "*" and keys "key-i" of tenant t(i mod n),
// bypassing the audit triggers (session_replication_role) to keep the test quick.
func seed(t testing.TB, s *Store, rules, keys int) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		`SET LOCAL session_replication_role = replica`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second)
			SELECT 't' || i, '*', 10 + i % 100, 1 + i % 7 FROM generate_series(0, $1 - 1) i`,
		`INSERT INTO api_key (key_hash, tenant_id, label)
			SELECT sha256(convert_to('key-' || i, 'UTF8')), 't' || (i % $1), 'bulk' FROM generate_series(0, $2 - 1) i`,
	} {
		var args []any
		switch strings.Count(q, "$") {
		case 1:
			args = []any{rules}
		case 2:
			args = []any{rules, keys}
		}
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			t.Fatalf("seed: %s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func fptr(f *float64) string {
	if f == nil {
		return "-"
	}
	return fmt.Sprint(*f)
}

// TestStoreRegionChangesKeepSharesSummingToOne: adding a region under existing shares gives
// it 0 under an override and the equal split of the rebalancer's rows, removing one scales the rest back up to 1, so no scope ever enforces
// more (or less) than its global limit across the regions.
func TestStoreRegionChangesKeepSharesSummingToOne(t *testing.T) {
	t.Parallel()
	ctx := WithAudit(context.Background(), "alice", "capacity")
	s, _ := newStore(t)
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	tenant := regions.Scope{Tenant: "shop-a", Route: regions.Wildcard}
	if err := s.SetOverride(ctx, tenant, map[string]float64{"us-east": 0.6, "eu-west": 0.4}, "alice", "pin", 0); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteRebalancerShares(ctx, []ShareChange{
		{Scope: regions.GlobalScope, Region: "us-east", New: 0.7},
		{Scope: regions.GlobalScope, Region: "eu-west", New: 0.3},
	}, nil, "rebalancer"); err != nil {
		t.Fatal(err)
	}
	sums := func() map[string]float64 {
		t.Helper()
		shares, err := s.Shares(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, sh := range shares {
			out[sh.Scope.String()+"/"+string(sh.Source)] += sh.Share
		}
		return out
	}
	check := func(when string, wantRows int) {
		t.Helper()
		got := sums()
		if len(got) != 2 {
			t.Fatalf("%s: scopes %v, want the override and the rebalancer's *", when, got)
		}
		for k, v := range got {
			if v < 1-1e-9 || v > 1+1e-9 {
				t.Errorf("%s: %s sums to %v, want 1", when, k, v)
			}
		}
		if n := count(t, s, `SELECT count(*) FROM region_share`); n != wantRows {
			t.Errorf("%s: %d share rows, want %d", when, n, wantRows)
		}
	}
	check("before", 4)

	if err := s.AddRegion(ctx, "ap-south"); err != nil {
		t.Fatal(err)
	}
	check("after adding ap-south", 6)
	snap, err := s.LoadSnapshot(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got, src := snap.Share("ap-south", "shop-a", "x"); got != 0 || src != regions.SourceOverride {
		t.Errorf("ap-south share under shop-a's override = %v (%s), want 0 (override)", got, src)
	}
	// The rebalancer's rows: the new region starts at the floor, the others keep their
	// proportions in what is left.
	for r, want := range map[string]float64{"ap-south": 0.05, "us-east": 0.7 * 0.95, "eu-west": 0.3 * 0.95} {
		if sh, ok := snap.ScopeRow(r, regions.GlobalScope); !ok || math.Abs(sh.Share-want) > 1e-12 {
			t.Errorf("%s rebalancer share of * after adding ap-south = %v, want %v", r, sh.Share, want)
		}
	}

	if err := s.RemoveRegion(ctx, "us-east", DropShares); err != nil {
		t.Fatal(err)
	}
	check("after removing us-east", 4)
	snap, err = s.LoadSnapshot(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// eu-west had 0.4 of shop-a's override next to ap-south's 0: it now holds all of it.
	if got, _ := snap.Share("eu-west", "shop-a", "x"); got < 1-1e-9 {
		t.Errorf("eu-west share of shop-a after us-east left = %v, want 1", got)
	}
	if n := count(t, s, `SELECT count(*) FROM region_share_history WHERE region = 'eu-west' AND actor = 'alice'`); n < 2 {
		t.Errorf("%d history rows for eu-west's renormalised shares, want one per scope", n)
	}
}
