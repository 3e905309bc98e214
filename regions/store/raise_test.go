package store

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// TestRaiseMarkers: the database marks every change that may raise a tenant's regional
// capacity, whoever makes it (the store or plain SQL), and every gateway's snapshot
// reads the marks: a rule added, raised, more shards or removed (every region), a share
// added, raised or removed (its region), a region removed (every tenant), each with the
// old capacity over the new as the gateways resolve them, precedence included; an
// override's expiry dates from the expiry, before and after its cleanup. A lowering
// marks nothing.
func TestRaiseMarkers(t *testing.T) {
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "test", "raise markers")
	for _, r := range []string{"us-east", "eu-west", "ap-south"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// marks maps "region tenant route" to the ratio.
	marks := func() map[string]float64 {
		t.Helper()
		rows, err := s.Pool().Query(ctx, `SELECT region, tenant, route, ratio FROM limit_raise`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]float64{}
		for rows.Next() {
			var region, tenant, route string
			var ratio float64
			if err := rows.Scan(&region, &tenant, &route, &ratio); err != nil {
				t.Fatal(err)
			}
			out[region+" "+tenant+" "+route] = ratio
		}
		return out
	}
	clear := func() { exec(t, s, `DELETE FROM limit_raise`) }
	age := func() { exec(t, s, `UPDATE limit_raise SET raised_at = now() - interval '2 hours'`) }
	rule := func(tenant string, c int64, shards int) regions.Rule {
		return regions.Rule{Tenant: tenant, Route: "r", Capacity: c, RefillPerSecond: 1, Shards: shards}
	}
	clear()

	near := func(got, want float64) bool { return got > want-1e-6 && got < want+1e-6 }
	if err := s.SetRule(ctx, rule("nokey", 40, 1)); err != nil {
		t.Fatal(err)
	}
	if m := marks(); len(m) != 1 || !near(m["* nokey r"], 0.5) {
		t.Errorf("a rule for a tenant without keys (rls_trust_tenant gives it buckets): %v, want {*, nokey} ratio 0.5", m)
	}
	clear()
	if err := s.SetRule(ctx, rule("a", 40, 1)); err != nil {
		t.Fatal(err)
	}
	if m := marks(); len(m) != 1 || !near(m["* a r"], 0.5) {
		t.Errorf("a rule of 40 added for tenant a under the default of 20: %v, want {*, a} ratio 0.5", m)
	}
	age() // an hour later a raise no longer compounds with the one before
	if err := s.SetRule(ctx, rule("a", 80, 1)); err != nil {
		t.Fatal(err)
	}
	if r := marks()["* a r"]; !near(r, 0.5) {
		t.Errorf("capacity 40 -> 80: ratio %v, want 0.5", r)
	}
	if err := s.SetRule(ctx, rule("a", 160, 1)); err != nil {
		t.Fatal(err)
	}
	if r := marks()["* a r"]; !near(r, 0.25) {
		t.Errorf("80 -> 160 within the hour: ratio %v, want 0.25 (0.5 x 0.5: the first ramp is not over)", r)
	}
	clear()
	if err := s.SetRule(ctx, rule("a", 10, 1)); err != nil {
		t.Fatal(err)
	}
	if m := marks(); len(m) != 0 {
		t.Errorf("a lowering marked %v, want nothing", m)
	}
	if err := s.SetRule(ctx, rule("a", 10, 4)); err != nil {
		t.Fatal(err)
	}
	if r, ok := marks()["* a r"]; !ok || !near(r, 1) {
		t.Errorf("more shards: %v (marked %v), want ratio 1 (the capacity did not change)", r, ok)
	}
	clear()
	// Three regions, no shares: each holds a third.
	if err := s.SetOverride(ctx, regions.Scope{Tenant: "a", Route: regions.Wildcard}, map[string]float64{"us-east": 0.2, "eu-west": 0.4, "ap-south": 0.4}, "test", "a test", 0); err != nil {
		t.Fatal(err)
	}
	if m := marks(); len(m) != 2 || !near(m["eu-west a *"], 0.8333333) || !near(m["ap-south a *"], 0.8333333) {
		t.Errorf("shares set from the equal third: %v, want eu-west and ap-south marked for a, ratio (1/3)/0.4", m)
	}
	clear()
	age()
	if err := s.SetOverride(ctx, regions.Scope{Tenant: "a", Route: regions.Wildcard}, map[string]float64{"us-east": 0.4, "eu-west": 0.2, "ap-south": 0.4}, "test", "a test", 0); err != nil {
		t.Fatal(err)
	}
	if m := marks(); len(m) != 1 || !near(m["us-east a *"], 0.5) {
		t.Errorf("us-east 0.2 -> 0.4, eu-west lowered: %v, want only us-east marked, ratio 0.5", m)
	}
	clear()
	exec(t, s, `DELETE FROM rate_limit_rule WHERE tenant_id = 'a'`) // plain SQL too
	if m := marks(); len(m) != 1 || !near(m["* a r"], 0.5) {
		t.Errorf("a's rule of 10 deleted with plain SQL (the default of 20 applies): %v, want {*, a} ratio 0.5", m)
	}
	clear()
	if err := s.RemoveRegion(ctx, "ap-south", DropShares); err != nil {
		t.Fatal(err)
	}
	// us-east 0.4 and eu-west 0.2 renormalise to 2/3 and 1/3; the equal split of every
	// other tenant grows from 1/3 to 1/2.
	if m := marks(); !near(m["* * *"], 2.0/3) || !near(m["us-east a *"], 0.6) || !near(m["eu-west a *"], 0.6) {
		t.Errorf("a region removed: %v, want {*, *} ratio 2/3 and us-east, eu-west of a 0.6", m)
	}

	// Precedence: a tenant's rule of every route wins over a route's rule for every
	// tenant, so adding one changes that route's capacity from the route's rule.
	clear()
	if err := s.SetRule(ctx, regions.Rule{Tenant: regions.Wildcard, Route: "x", Capacity: 10, RefillPerSecond: 1, Shards: 1}); err != nil {
		t.Fatal(err)
	}
	if m := marks(); len(m) != 0 {
		t.Errorf("a route's rule of 10 under the default of 20: %v, want nothing", m)
	}
	if err := s.SetRule(ctx, regions.Rule{Tenant: "c", Route: regions.Wildcard, Capacity: 100, RefillPerSecond: 1, Shards: 1}); err != nil {
		t.Fatal(err)
	}
	if m := marks(); len(m) != 2 || !near(m["* c *"], 0.2) || !near(m["* c x"], 0.1) {
		t.Errorf("c's rule of 100 for every route: %v, want {* c *} 20/100 and {* c x} 10/100", m)
	}
	clear()
	exec(t, s, `DELETE FROM rate_limit_rule WHERE tenant_id = 'c'`)
	if m := marks(); len(m) != 0 {
		t.Errorf("c's rule of 100 removed (back to 20, and 10 for x): %v, want nothing", m)
	}
	// An override of a tenant wins over the rebalancer's share of one of its routes.
	exec(t, s, `INSERT INTO region_share (scope, region, share, source) VALUES ('d/x', 'us-east', 0.1, 'rebalancer')`)
	clear()
	if err := s.SetOverride(ctx, regions.Scope{Tenant: "d", Route: regions.Wildcard}, map[string]float64{"us-east": 0.5, "eu-west": 0.5}, "test", "a test", 0); err != nil {
		t.Fatal(err)
	}
	if m := marks(); len(m) != 1 || !near(m["us-east d x"], 0.2) {
		t.Errorf("d's override of the even 0.5 over the rebalancer's 0.1 for d/x: %v, want only {us-east d x} 0.1/0.5", m)
	}

	snap, err := s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ago, ratio, ok := snap.Raise("us-east", "d", "x", 0); !ok || !near(ratio, 0.2) || ago > time.Minute {
		t.Errorf("snapshot Raise(us-east, d, x) = %v, %v, %v; want d/x's 0.2, just now", ago, ratio, ok)
	}
	if _, _, ok := snap.Raise("us-east", "d", "y", 0); ok {
		t.Error("snapshot Raise(us-east, d, y): a raise, want none (only d/x's share rose)")
	}

	// An override that expired a minute ago and is not deleted yet: the gateways stopped
	// applying it then, so the raise to the even 0.5 dates from then; so does the mark
	// its deletion writes.
	clear()
	exec(t, s, `INSERT INTO region_share (scope, region, share, source, expires_at) VALUES ('e', 'us-east', 0.2, 'override', now() - interval '1 minute')`)
	if m := marks(); len(m) != 0 {
		t.Errorf("an override inserted already expired: %v, want nothing", m)
	}
	snap, err = s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ago, ratio, ok := snap.Raise("us-east", "e", "r", 0); !ok || !near(ratio, 0.4) || ago < 59*time.Second || ago > 2*time.Minute {
		t.Errorf("snapshot Raise(us-east, e, r) after e's override of 0.2 expired = %v, %v, %v; want 0.2/0.5 a minute ago", ago, ratio, ok)
	}
	exec(t, s, `DELETE FROM region_share WHERE scope = 'e'`)
	var markedAgo time.Duration
	if err := s.Pool().QueryRow(ctx, `SELECT extract(epoch FROM now() - raised_at)::float8 * interval '1 second' FROM limit_raise WHERE region = 'us-east' AND tenant = 'e' AND route = '*'`).Scan(&markedAgo); err != nil {
		t.Fatalf("the expired override's deletion marked nothing: %v", err)
	}
	if markedAgo < 59*time.Second || markedAgo > 2*time.Minute {
		t.Errorf("the expired override's deletion marked the raise %v ago, want at its expiry a minute ago", markedAgo)
	}
}
