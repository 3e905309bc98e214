package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/regions"
)

// marksOf maps "region tenant route" of every raise marker to its ratio.
func marksOf(t *testing.T, s *Store) map[string]float64 {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(), `SELECT region, tenant, route, ratio FROM limit_raise`)
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
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func planRule(plan, route string, capacity int64, refill float64) regions.Rule {
	return regions.Rule{Plan: plan, Tenant: regions.Wildcard, Route: route, Capacity: capacity, RefillPerSecond: refill, Shards: 1}
}

// TestPlansStore: plans are created by their first rule, listed with their rules and
// tenant counts; every write is audited; the refusals are worded (unknown plan, a plan
// in use, nothing to delete, bad ids).
func TestPlansStore(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "alice", "plans")
	if err := s.SetPlanRule(ctx, planRule("pro", "*", 200, 100)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPlanRule(ctx, planRule("pro", "search", 50, 5)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPlanRule(ctx, planRule("free", "*", 10, 1)); err != nil {
		t.Fatal(err)
	}
	ps, err := s.Plans(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Name != "free" || ps[1].Name != "pro" || len(ps[1].Rules) != 2 ||
		ps[1].Rules[0].Route != "*" || ps[1].Rules[1].Route != "search" || ps[1].Rules[1].Capacity != 50 ||
		ps[1].Rules[0].Plan != "pro" || ps[1].Rules[0].Tenant != "*" {
		t.Fatalf("plans %+v", ps)
	}
	for i := range 3 {
		if err := s.AssignPlan(ctx, fmt.Sprintf("t%d", i), "pro"); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.PlanTenants(ctx, "pro"); err != nil || n != 3 {
		t.Fatalf("PlanTenants(pro) = %d, %v; want 3", n, err)
	}
	if p, err := s.TenantPlan(ctx, "t1"); err != nil || p != "pro" {
		t.Fatalf("TenantPlan(t1) = %q, %v", p, err)
	}
	if p, err := s.TenantPlan(ctx, "nobody"); err != nil || p != "" {
		t.Fatalf("TenantPlan(nobody) = %q, %v; want none", p, err)
	}
	if err := s.AssignPlan(ctx, "t0", "free"); err != nil {
		t.Fatal(err)
	}

	err = s.AssignPlan(ctx, "t9", "gold")
	if !errors.Is(err, ErrNotFound) || !contains(err, "plan gold does not exist") {
		t.Errorf("assign to an unknown plan: %v", err)
	}
	err = s.DeletePlan(ctx, "pro")
	if !errors.Is(err, ErrPlanInUse) || !contains(err, "2 tenants are assigned") {
		t.Errorf("delete a plan in use: %v", err)
	}
	if err := s.DeletePlanRule(ctx, "pro", "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete a missing plan rule: %v", err)
	}
	if err := s.DeletePlan(ctx, "gold"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete a missing plan: %v", err)
	}
	if err := s.UnassignPlan(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unassign a tenant without a plan: %v", err)
	}
	for _, bad := range []error{
		s.SetPlanRule(ctx, planRule("bad name", "*", 1, 1)),
		s.SetPlanRule(ctx, planRule("pro", "*", 0, 1)),
		s.SetPlanRule(ctx, planRule("", "*", 1, 1)),
		s.AssignPlan(ctx, "*", "pro"),
		s.AssignPlan(ctx, "t1", "bad/plan"),
	} {
		if !errors.Is(bad, regions.ErrInvalid) {
			t.Errorf("bad input: %v, want ErrInvalid", bad)
		}
	}

	// Unassigned, the plan can go, its rules with it.
	for _, tn := range []string{"t1", "t2"} {
		if err := s.UnassignPlan(ctx, tn); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeletePlan(ctx, "pro"); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s, `SELECT count(*) FROM plan_rule WHERE plan = 'pro'`); n != 0 {
		t.Errorf("%d rules of a deleted plan left", n)
	}
	want := map[string]int{"plan insert": 2, "plan_rule insert": 3, "tenant_plan insert": 3, "tenant_plan update": 1,
		"tenant_plan delete": 2, "plan delete": 1, "plan_rule delete": 2}
	for k, n := range want {
		var object, action string
		fmt.Sscan(k, &object, &action)
		if got := count(t, s, `SELECT count(*) FROM audit_log WHERE object = $1 AND action = $2 AND on_behalf_of = 'alice' AND reason = 'plans'`, object, action); got != n {
			t.Errorf("audit rows %s: %d, want %d", k, got, n)
		}
	}
}

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }

// TestPlanRaiseMarkers: every change through a plan that may raise a tenant's capacity
// is marked for each tenant it reaches, with the old capacity over the new as the
// gateways resolve them: a plan's rule raised, a tenant assigned a bigger plan, a
// tenant's own rule deleted so a bigger plan rule applies. A tenant whose own rule wins
// is not marked; a lowering marks nothing.
func TestPlanRaiseMarkers(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "test", "plan raises")
	clear := func() { exec(t, s, `DELETE FROM limit_raise`) }
	near := func(got, want float64) bool { return got > want-1e-6 && got < want+1e-6 }
	// The default rule is 20; route r has a rule of 5 for every tenant.
	if err := s.SetRule(ctx, regions.Rule{Tenant: "*", Route: "r", Capacity: 5, RefillPerSecond: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPlanRule(ctx, planRule("pro", "*", 100, 10)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPlanRule(ctx, planRule("free", "*", 10, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRule(ctx, regions.Rule{Tenant: "own", Route: "*", Capacity: 7, RefillPerSecond: 1}); err != nil {
		t.Fatal(err)
	}
	clear()

	// Assigned a plan: from the defaults (20 and, for r, 5) to the plan's 100.
	if err := s.AssignPlan(ctx, "a", "pro"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 2 || !near(m["* a *"], 0.2) || !near(m["* a r"], 0.05) {
		t.Errorf("tenant a assigned pro: %v, want {* a *} 0.2 and {* a r} 0.05", m)
	}
	if err := s.AssignPlan(ctx, "own", "pro"); err != nil {
		t.Fatal(err)
	}
	if err := s.AssignPlan(ctx, "b", "free"); err != nil {
		t.Fatal(err)
	}
	clear()

	// The plan's rule raised: each of its tenants, not the tenant whose own rule wins,
	// not the other plan's.
	if err := s.SetPlanRule(ctx, planRule("pro", "*", 400, 10)); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 2 || !near(m["* a *"], 0.25) || !near(m["* a r"], 0.25) {
		t.Errorf("pro raised 100 -> 400: %v, want {* a *} and {* a r} 0.25 only", m)
	}
	clear()
	// A plan rule for one route added above the plan's *: that route of each tenant.
	if err := s.SetPlanRule(ctx, planRule("pro", "r", 800, 10)); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 1 || !near(m["* a r"], 0.5) {
		t.Errorf("pro/r of 800 added: %v, want {* a r} 0.5", m)
	}
	clear()

	// Moved to a bigger plan: free 10 -> pro 400 (and r 800).
	if err := s.AssignPlan(ctx, "b", "pro"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 2 || !near(m["* b *"], 10.0/400) || !near(m["* b r"], 10.0/800) {
		t.Errorf("b moved free -> pro: %v", m)
	}
	clear()

	// The tenant's own rule deleted: pro's 400 (and 800 for r) apply instead of 7.
	if err := s.DeleteRule(ctx, "own", "*"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 2 || !near(m["* own *"], 7.0/400) || !near(m["* own r"], 7.0/800) {
		t.Errorf("own's rule deleted under pro: %v", m)
	}
	clear()

	// Lowerings mark nothing: a plan rule lowered, a tenant moved to a smaller plan.
	if err := s.SetPlanRule(ctx, planRule("pro", "*", 300, 10)); err != nil {
		t.Fatal(err)
	}
	if err := s.AssignPlan(ctx, "b", "free"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 0 {
		t.Errorf("lowerings marked %v", m)
	}
	// Unassigned from a plan smaller than the defaults: free's 10 -> the default 20 is a
	// raise (route r: free's 10 -> the 5 of */r is not).
	if err := s.UnassignPlan(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 1 || !near(m["* b *"], 0.5) {
		t.Errorf("b unassigned from free (10) back to the defaults (20, r 5): %v, want {* b *} 0.5", m)
	}
	// A plan's rule deleted so the plan's * applies: search 5 -> 300 for each tenant.
	if err := s.SetPlanRule(ctx, planRule("pro", "search", 5, 1)); err != nil {
		t.Fatal(err)
	}
	clear()
	if err := s.DeletePlanRule(ctx, "pro", "search"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 2 || !near(m["* a search"], 5.0/300) || !near(m["* own search"], 5.0/300) {
		t.Errorf("pro/search (5) deleted under pro/* (300): %v, want {* a search} and {* own search} 5/300", m)
	}
}

// TestPlanThousandTenants (issue 24): 1,000 tenants on pro; one change of pro's rule
// changes what every one of them resolves to, in one transaction and one audit row (one
// row of plan_rule: the tenants resolve through it), marked as a raise for each of them
// in that transaction; a tenant's own rule wins over the plan's.
func TestPlanThousandTenants(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "alice", "pro for everyone")
	if err := s.SetPlanRule(ctx, planRule("pro", "*", 200, 100)); err != nil {
		t.Fatal(err)
	}
	exec(t, s, `INSERT INTO tenant_plan (tenant_id, plan) SELECT 't' || i, 'pro' FROM generate_series(0, 999) i`)
	if err := s.SetRule(ctx, regions.Rule{Tenant: "t7", Route: "*", Capacity: 5, RefillPerSecond: 1}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PlanTenants(ctx, "pro"); err != nil || n != 1000 {
		t.Fatalf("PlanTenants = %d, %v", n, err)
	}
	check := func(capacity int64) {
		t.Helper()
		snap, err := s.Load(ctx, LoadOptions{WithoutKeys: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 1000 {
			tenant := fmt.Sprintf("t%d", i)
			r := snap.Rule(tenant, "checkout")
			want, plan := capacity, "pro"
			if tenant == "t7" {
				want, plan = 5, "" // its own rule wins
			}
			if r.Capacity != want || r.Plan != plan {
				t.Fatalf("Rule(%s) = capacity %d plan %q, want %d %q", tenant, r.Capacity, r.Plan, want, plan)
			}
		}
		if r := snap.Rule("other", "checkout"); r.Capacity != 20 || r.Plan != "" {
			t.Fatalf("a tenant on no plan: %+v, want the default rule", r)
		}
	}
	check(200)
	exec(t, s, `DELETE FROM limit_raise`)
	audits := count(t, s, `SELECT count(*) FROM audit_log`)

	if err := s.SetPlanRule(WithAudit(context.Background(), "alice", "pro doubles"), planRule("pro", "*", 400, 200)); err != nil {
		t.Fatal(err)
	}
	check(400)
	if n := count(t, s, `SELECT count(*) FROM audit_log`) - audits; n != 1 {
		t.Errorf("%d audit rows for one plan change, want 1", n)
	}
	if n := count(t, s, `SELECT count(*) FROM audit_log WHERE object = 'plan_rule' AND action = 'update' AND reason = 'pro doubles'
		AND (old->>'capacity')::int = 200 AND (new->>'capacity')::int = 400`); n != 1 {
		t.Errorf("the plan change's audit row: %d found", n)
	}
	if n := count(t, s, `SELECT count(*) FROM limit_raise WHERE route = '*' AND abs(ratio - 0.5) < 1e-9`); n != 999 {
		t.Errorf("%d tenants marked with ratio 0.5, want 999 (every tenant of pro but t7)", n)
	}
	if n := count(t, s, `SELECT count(DISTINCT xid) FROM limit_raise`); n != 1 {
		t.Errorf("raise markers from %d transactions, want 1", n)
	}
	if n := count(t, s, `SELECT count(*) FROM limit_raise WHERE tenant = 't7'`); n != 0 {
		t.Errorf("t7, whose own rule wins, marked %d times", n)
	}
}

// TestPlanShardsRaiseMarkers (B2): a change that leaves the capacity as it was but gives
// the rule that applies more shards is marked (1 - 1e-9 over 1, so new shards start from
// their refill): a tenant moved to a plan of more shards, its own rule deleted so a plan
// rule of more shards applies, its own rule of more shards added over its plan's, a plan
// rule of more shards added over the plan's *. Fewer shards mark nothing.
func TestPlanShardsRaiseMarkers(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "test", "plan shards")
	clear := func() { exec(t, s, `DELETE FROM limit_raise`) }
	shardMark := func(m map[string]float64, key string) bool {
		r, ok := m[key]
		return ok && r > 1-1e-6 && r < 1
	}
	sharded := func(plan, route string, shards int) regions.Rule {
		r := planRule(plan, route, 40, 20)
		r.Shards = shards
		return r
	}
	for _, r := range []regions.Rule{sharded("f1", "*", 1), sharded("f8", "*", 8)} {
		if err := s.SetPlanRule(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AssignPlan(ctx, "sh3", "f1"); err != nil {
		t.Fatal(err)
	}
	clear()

	if err := s.AssignPlan(ctx, "sh3", "f8"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); !shardMark(m, "* sh3 *") {
		t.Errorf("sh3 moved f1 -> f8 (same capacity, 8 shards): %v, want {* sh3 *} 1-1e-9", m)
	}
	clear()
	if err := s.AssignPlan(ctx, "sh3", "f1"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); len(m) != 0 {
		t.Errorf("sh3 moved f8 -> f1 (fewer shards): %v, want none", m)
	}

	// Its own 1-shard rule deleted so f8's 8 shards apply.
	if err := s.AssignPlan(ctx, "own", "f8"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRule(ctx, regions.Rule{Tenant: "own", Route: "*", Capacity: 40, RefillPerSecond: 20, Shards: 1}); err != nil {
		t.Fatal(err)
	}
	clear()
	if err := s.DeleteRule(ctx, "own", "*"); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); !shardMark(m, "* own *") {
		t.Errorf("own's 1-shard rule deleted under f8: %v, want {* own *} 1-1e-9", m)
	}
	clear()

	// Its own rule of more shards added over its plan's (f1, 1 shard).
	if err := s.AssignPlan(ctx, "own2", "f1"); err != nil {
		t.Fatal(err)
	}
	clear()
	if err := s.SetRule(ctx, regions.Rule{Tenant: "own2", Route: "*", Capacity: 40, RefillPerSecond: 20, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); !shardMark(m, "* own2 *") {
		t.Errorf("own2's 4-shard rule added over f1: %v, want {* own2 *} 1-1e-9", m)
	}
	clear()

	// A plan rule for one route with more shards than the plan's *.
	if err := s.SetPlanRule(ctx, sharded("f1", "orders", 2)); err != nil {
		t.Fatal(err)
	}
	if m := marksOf(t, s); !shardMark(m, "* sh3 orders") || len(m) != 1 {
		t.Errorf("f1/orders of 2 shards added over f1/*: %v, want {* sh3 orders} 1-1e-9 only", m)
	}
}

// TestPlanWritersSerialised (B3): writers of the rules, plan rules and plan assignments
// queue on one advisory lock, so a statement's raise markers are computed against what
// the writer before it committed: a tenant assigned pro while pro's * is being raised
// 50 -> 500 waits, and is marked against 500 (20/500), not the 50 it would have read.
func TestPlanWritersSerialised(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "test", "serialised")
	if err := s.SetPlanRule(ctx, planRule("pro", "*", 50, 10)); err != nil {
		t.Fatal(err)
	}
	exec(t, s, `DELETE FROM limit_raise`)

	tx, err := s.Pool().Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(context.Background(), `UPDATE plan_rule SET capacity = 500 WHERE plan = 'pro' AND route_id = '*'`); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var insertErr error
	go func() {
		defer close(done)
		_, insertErr = s.Pool().Exec(context.Background(), `INSERT INTO tenant_plan (tenant_id, plan) VALUES ('newt2', 'pro')`)
	}()
	waitBlockedOrDone(t, s, done)
	select {
	case <-done:
		t.Error("the assignment did not wait for the plan rule's writer")
	default:
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-done
	if insertErr != nil {
		t.Fatal(insertErr)
	}
	if m := marksOf(t, s); len(m) != 1 || m["* newt2 *"] > 20.0/500+1e-6 {
		t.Errorf("newt2 assigned pro while pro/* went 50 -> 500: %v, want {* newt2 *} 0.04", m)
	}
}
