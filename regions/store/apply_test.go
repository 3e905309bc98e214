package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

func ptr[T any](v T) *T { return &v }

// TestApply: a plan is exactly what Apply writes, in one transaction with one audit row per
// audited change; applying the same configuration again changes nothing; a change that
// fails midway leaves the database as it was.
func TestApply(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	expires := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	keyA := regions.HashKey("qp_secret-a")
	want := Config{
		Regions: ptr([]string{"us-east", "eu-west"}),
		Rules: ptr([]regions.Rule{
			{Tenant: "*", Route: "*", Capacity: 50, RefillPerSecond: 5},
			{Tenant: "shop-a", Route: "search", Capacity: 10, RefillPerSecond: 0.01, Shadow: true, Shards: 4},
		}),
		Overrides: ptr([]Override{{Scope: regions.Scope{Tenant: "shop-a"}, Shares: map[string]float64{"us-east": 0.75, "eu-west": 0.25}, ExpiresAt: expires, Reason: "sale"}}),
		Keys:      ptr([]KeySpec{{Hash: keyA, Tenant: "shop-a", Label: "ci"}}),
	}
	auditBefore := count(t, s, `SELECT count(*) FROM audit_log`)
	plan, err := s.Plan(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	// 2 regions added, */* changed, 1 rule added, 1 override, 1 key.
	if len(plan) != 6 {
		t.Fatalf("plan has %d changes, want 6: %+v", len(plan), plan)
	}
	if count(t, s, `SELECT count(*) FROM region`) != 0 {
		t.Fatal("Plan wrote")
	}
	applied, err := s.Apply(ctx, want, "alice", "limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != len(plan) {
		t.Errorf("applied %d changes, planned %d", len(applied), len(plan))
	}
	// Audited objects: 2 regions, 2 rules, 1 key.
	if got := count(t, s, `SELECT count(*) FROM audit_log`) - auditBefore; got != 5 {
		t.Errorf("%d audit rows, want 5 (one per region, rule and key change)", got)
	}
	if got := count(t, s, `SELECT count(*) FROM audit_log WHERE actor = 'alice' AND reason = 'limits.yaml'`); got != 5 {
		t.Errorf("%d audit rows name alice and the reason, want 5", got)
	}
	if got := count(t, s, `SELECT count(*) FROM region_share_history WHERE actor = 'alice' AND scope = 'shop-a'`); got != 2 {
		t.Errorf("%d share history rows for the override, want 2 (one per region)", got)
	}
	again, err := s.Plan(ctx, want)
	if err != nil || len(again) != 0 {
		t.Fatalf("plan after apply: %+v, %v; want no change", again, err)
	}
	exp, err := s.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s.Plan(ctx, exp); err != nil || len(p) != 0 {
		t.Fatalf("plan of the export: %+v, %v; want no change", p, err)
	}

	// A file that removes a region the rebalancer still has shares in fails as a whole: the
	// rule change before it is not written either.
	exec(t, s, `INSERT INTO region_share (scope, region, share, source) VALUES ('*', 'us-east', 0.5, 'rebalancer'), ('*', 'eu-west', 0.5, 'rebalancer')`)
	bad := Config{
		Regions:   ptr([]string{"eu-west"}),
		Rules:     ptr([]regions.Rule{{Tenant: "*", Route: "*", Capacity: 1, RefillPerSecond: 1}}),
		Overrides: ptr([]Override{{Scope: regions.Scope{Tenant: "shop-a"}, Shares: map[string]float64{"eu-west": 1}, ExpiresAt: expires, Reason: "sale"}}),
		Prune:     Prune{Regions: true},
	}
	auditBefore = count(t, s, `SELECT count(*) FROM audit_log`)
	if _, err := s.Apply(ctx, bad, "alice", "bad"); !errors.Is(err, ErrRegionInUse) {
		t.Fatalf("apply removing a region in use: %v, want ErrRegionInUse", err)
	}
	if got := count(t, s, `SELECT count(*) FROM audit_log`); got != auditBefore {
		t.Errorf("a failed apply left %d audit rows", got-auditBefore)
	}
	if got := count(t, s, `SELECT capacity FROM rate_limit_rule WHERE tenant_id = '*'`); got != 50 {
		t.Errorf("a failed apply changed the default rule: capacity %d", got)
	}

	// Without Prune nothing is deleted; an empty section never prunes.
	keyB := regions.HashKey("qp_secret-b")
	rotate := Config{Keys: ptr([]KeySpec{{Hash: keyB, Tenant: "shop-a"}})}
	if p, err := s.Plan(ctx, rotate); err != nil || len(p) != 1 || p[0].Action != ActionAdd {
		t.Errorf("plan of another key without Prune: %+v, %v; want one add, no revocation", p, err)
	}
	if _, err := s.Plan(ctx, Config{Keys: ptr([]KeySpec{}), Prune: Prune{Keys: true}}); !errors.Is(err, regions.ErrInvalid) {
		t.Errorf("pruning by an empty keys section: %v, want ErrInvalid", err)
	}
	if _, err := s.Plan(ctx, Config{Prune: Prune{Rules: true}}); !errors.Is(err, regions.ErrInvalid) {
		t.Errorf("pruning by an absent rules section: %v, want ErrInvalid", err)
	}
	// Sections not in the file are left alone; keys are revoked, never deleted.
	rotate.Prune.Keys = true
	if _, err := s.Apply(ctx, rotate, "alice", "rotate"); err != nil {
		t.Fatal(err)
	}
	if got := count(t, s, `SELECT count(*) FROM api_key WHERE revoked_at IS NOT NULL`); got != 1 {
		t.Errorf("%d revoked keys, want 1", got)
	}
	if got := count(t, s, `SELECT count(*) FROM rate_limit_rule`); got != 2 {
		t.Errorf("a keys-only file changed the rules: %d rules", got)
	}
	// A revoked key cannot come back.
	if _, err := s.Apply(ctx, want, "alice", "again"); !errors.Is(err, regions.ErrInvalid) {
		t.Errorf("re-importing a revoked key: %v, want ErrInvalid", err)
	}
}

func TestConfigNormalize(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
	}{
		{"no default rule", Config{Rules: ptr([]regions.Rule{{Tenant: "a", Route: "*", Capacity: 1, RefillPerSecond: 1}})}},
		{"rule twice", Config{Rules: ptr([]regions.Rule{{Tenant: "*", Route: "*", Capacity: 1, RefillPerSecond: 1}, {Tenant: "*", Route: "*", Capacity: 2, RefillPerSecond: 1}})}},
		{"region twice", Config{Regions: ptr([]string{"a", "a"})}},
		{"bad region", Config{Regions: ptr([]string{"a b"})}},
		{"shares not summing to 1", Config{Regions: ptr([]string{"a", "b"}), Overrides: ptr([]Override{{Scope: regions.GlobalScope, Shares: map[string]float64{"a": 0.5, "b": 0.6}, Reason: "x"}})}},
		{"override without reason", Config{Regions: ptr([]string{"a"}), Overrides: ptr([]Override{{Scope: regions.GlobalScope, Shares: map[string]float64{"a": 1}}})}},
		{"zero refill", Config{Rules: ptr([]regions.Rule{{Tenant: "*", Route: "*", Capacity: 1}})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Normalize(); !errors.Is(err, regions.ErrInvalid) {
				t.Errorf("Normalize = %v, want ErrInvalid", err)
			}
		})
	}
}

// TestApplyExpiredOverrides: an expired override (its rows wait for the rebalancer to
// delete them) is over for the configuration too: Export leaves it out, a plan does not
// delete it, it does not block removing a region it names; and a desired override whose
// expiry has passed is refused, naming it.
func TestApplyExpiredOverrides(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "alice", "test")
	in := time.Now().Add(time.Hour).UTC()
	cfg := Config{
		Regions: ptr([]string{"a", "b", "c"}),
		Rules:   ptr([]regions.Rule{defaultRule()}),
		Overrides: ptr([]Override{
			{Scope: regions.Scope{Tenant: "shop-a"}, Shares: map[string]float64{"a": 0.5, "b": 0.25, "c": 0.25}, ExpiresAt: in, Reason: "sale"},
			{Scope: regions.Scope{Tenant: "shop-b"}, Shares: map[string]float64{"a": 0.5, "b": 0.5, "c": 0}, Reason: "kept"},
		}),
	}
	if _, err := s.Apply(ctx, cfg, "alice", "setup"); err != nil {
		t.Fatal(err)
	}
	exec(t, s, `UPDATE region_share SET expires_at = now() - interval '1 minute' WHERE scope = 'shop-a' AND source = 'override'`)

	exp, err := s.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(*exp.Overrides) != 1 || (*exp.Overrides)[0].Scope.String() != "shop-b" {
		t.Errorf("export lists overrides %+v, want shop-b's only (shop-a's expired)", *exp.Overrides)
	}
	// The file without shop-a's override: nothing to do.
	without := Config{Overrides: ptr([]Override{(*cfg.Overrides)[1]}), Prune: Prune{Overrides: true}}
	if p, err := s.Plan(ctx, without); err != nil || len(p) != 0 {
		t.Errorf("plan without the expired override: %+v, %v; want no change", p, err)
	}
	// Removing region c, named by the expired override only (shop-b's is rewritten).
	shrink := Config{
		Regions:   ptr([]string{"a", "b"}),
		Overrides: ptr([]Override{{Scope: regions.Scope{Tenant: "shop-b"}, Shares: map[string]float64{"a": 0.5, "b": 0.5}, Reason: "kept"}}),
		Prune:     Prune{Regions: true},
	}
	if _, err := s.Apply(ctx, shrink, "alice", "shrink"); err != nil {
		t.Fatalf("apply removing a region only an expired override names: %v", err)
	}
	if err := s.RemoveRegion(ctx, "b", RefuseInUse); !errors.Is(err, ErrRegionInUse) {
		t.Errorf("remove b, in shop-b's override: %v, want ErrRegionInUse", err)
	}
	exec(t, s, `UPDATE region_share SET expires_at = now() - interval '1 minute' WHERE scope = 'shop-b' AND source = 'override'`)
	if err := s.RemoveRegion(ctx, "b", RefuseInUse); err != nil {
		t.Errorf("remove b, named by expired overrides only: %v", err)
	}
	if n := count(t, s, `SELECT count(*) FROM region_share WHERE region IN ('b', 'c')`); n != 0 {
		t.Errorf("%d share rows still name the removed regions", n)
	}

	// A desired override already expired is refused, by name, and nothing is written.
	past := Config{Overrides: ptr([]Override{{Scope: regions.Scope{Tenant: "shop-c"}, Shares: map[string]float64{"a": 1}, ExpiresAt: time.Now().Add(-time.Hour), Reason: "late"}})}
	for name, f := range map[string]func() error{
		"plan":  func() error { _, err := s.Plan(ctx, past); return err },
		"apply": func() error { _, err := s.Apply(ctx, past, "alice", "late"); return err },
	} {
		if err := f(); !errors.Is(err, regions.ErrInvalid) || !strings.Contains(err.Error(), "override shop-c") || !strings.Contains(err.Error(), "in the past") {
			t.Errorf("%s of an override expired already: %v, want ErrInvalid naming shop-c", name, err)
		}
	}
	if n := count(t, s, `SELECT count(*) FROM region_share WHERE scope = 'shop-c'`); n != 0 {
		t.Errorf("the refused override wrote %d rows", n)
	}
}

// TestApplyState: a plan is pinned to the state it was made against: ApplyState writes it
// while the managed sections are unchanged, and refuses, writing nothing, once another
// writer changed them; a change to a section the plan does not manage does not count.
func TestApplyState(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "alice", "test")
	want := Config{Rules: ptr([]regions.Rule{defaultRule(), {Tenant: "a", Route: "r", Capacity: 5, RefillPerSecond: 1}}), Prune: Prune{Rules: true}}
	changes, state, err := s.PlanState(ctx, want)
	if err != nil || len(changes) != 1 || state == "" {
		t.Fatalf("PlanState: %+v, %q, %v", changes, state, err)
	}
	// Another section changes: the plan still holds.
	if err := s.AddRegion(ctx, "us-east"); err != nil {
		t.Fatal(err)
	}
	if _, again, _ := s.PlanState(ctx, want); again != state {
		t.Errorf("a region added changed the state of a rules-only plan")
	}
	// The rules change: refused, nothing written.
	if err := s.SetRule(ctx, regions.Rule{Tenant: "b", Route: "r", Capacity: 1, RefillPerSecond: 1, Shards: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyState(ctx, want, state, "alice", "pinned"); !errors.Is(err, ErrStateChanged) {
		t.Fatalf("ApplyState after a rule changed: %v, want ErrStateChanged", err)
	}
	if n := count(t, s, `SELECT count(*) FROM rate_limit_rule WHERE tenant_id = 'a'`); n != 0 {
		t.Errorf("a refused ApplyState wrote %d rules", n)
	}
	_, state, err = s.PlanState(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.ApplyState(ctx, want, state, "alice", "pinned"); err != nil || len(got) != 2 {
		t.Errorf("ApplyState of a fresh plan: %d changes, %v; want 2 (a added, b deleted)", len(got), err)
	}
}

// TestApplyPlans: the plans and tenant_plans sections add, change and (a listed plan's
// rules left out, or with --prune) delete, in dependency order; Export returns what was
// applied, and applying it again plans nothing; assigning a plan that will not exist is
// refused, naming it.
func TestApplyPlans(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	want := Config{
		Plans: ptr([]regions.Plan{
			{Name: "pro", Rules: []regions.Rule{{Route: "*", Capacity: 200, RefillPerSecond: 100}, {Route: "search", Capacity: 20, RefillPerSecond: 1}}},
			{Name: "free", Rules: []regions.Rule{{Route: "*", Capacity: 10, RefillPerSecond: 1}}},
		}),
		TenantPlans: ptr([]regions.TenantPlan{{Tenant: "acme", Plan: "pro"}, {Tenant: "bob", Plan: "free"}}),
	}
	changes, err := s.Apply(ctx, want, "alice", "plans.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, string(c.Action)+" "+c.Object+" "+c.ID)
	}
	if w := "add plan free,add plan pro,add plan_rule free/*,add plan_rule pro/*,add plan_rule pro/search,add tenant_plan acme,add tenant_plan bob"; strings.Join(got, ",") != w {
		t.Errorf("applied %s\nwant    %s", strings.Join(got, ","), w)
	}
	exp, err := s.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ps := *exp.Plans; len(ps) != 2 || ps[1].Name != "pro" || len(ps[1].Rules) != 2 || ps[1].Rules[1].Capacity != 20 || len(*exp.TenantPlans) != 2 {
		t.Fatalf("export %+v %+v", *exp.Plans, *exp.TenantPlans)
	}
	if again, err := s.Plan(ctx, exp); err != nil || len(again) != 0 {
		t.Fatalf("plan of the export: %+v, %v; want no change", again, err)
	}

	// pro listed without its search rule and with * raised; bob moved; free pruned.
	next := Config{
		Plans:       ptr([]regions.Plan{{Name: "pro", Rules: []regions.Rule{{Route: "*", Capacity: 400, RefillPerSecond: 100}}}}),
		TenantPlans: ptr([]regions.TenantPlan{{Tenant: "acme", Plan: "pro"}, {Tenant: "bob", Plan: "pro"}}),
		Prune:       Prune{Plans: true},
	}
	changes, err = s.Apply(ctx, next, "alice", "plans.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, c := range changes {
		got = append(got, string(c.Action)+" "+c.Object+" "+c.ID)
	}
	if w := "change plan_rule pro/*,delete plan_rule pro/search,change tenant_plan bob,delete plan free"; strings.Join(got, ",") != w {
		t.Errorf("applied %s\nwant    %s", strings.Join(got, ","), w)
	}
	if n := count(t, s, `SELECT count(*) FROM plan`); n != 1 {
		t.Errorf("%d plans left, want 1", n)
	}

	// Refusals: an unknown plan; a plan pruned while a tenant stays on it.
	_, err = s.Plan(ctx, Config{TenantPlans: ptr([]regions.TenantPlan{{Tenant: "carol", Plan: "gold"}})})
	if !errors.Is(err, regions.ErrInvalid) || !strings.Contains(err.Error(), "tenant_plans carol: plan gold does not exist") {
		t.Errorf("unknown plan: %v", err)
	}
	_, err = s.Plan(ctx, Config{Plans: ptr([]regions.Plan{{Name: "other"}}), Prune: Prune{Plans: true}})
	if !errors.Is(err, regions.ErrInvalid) || !strings.Contains(err.Error(), "plan pro: removed, but tenant acme is assigned to it") {
		t.Errorf("plan in use pruned: %v", err)
	}
}
