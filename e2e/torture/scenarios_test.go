package torture

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/e2e/stack"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// scenario is a fixed, targeted run: one of the issue-14 reproductions end to end.
type scenario struct {
	name string
	run  func(t *testing.T, ctx context.Context, env *Env) row
}

var scenarios = []scenario{
	{"steady", steadyScenario},
	{"stall-3s", stallScenario},
	{"reshard-1-4-8", reshardScenario},
	{"raise-after-ttl", raiseScenario},
	{"cost-5-stall", costScenario},
}

// scenarioRun is the part every scenario shares: observe, load, act, stop, check.
func scenarioRun(t *testing.T, ctx context.Context, env *Env, name string, plan tenantPlan, gateways []string, act func(id string, load *Load)) (row, *Recorder, string, time.Time, time.Time) {
	t.Helper()
	plan.pinned = true
	su := addTenants(t, ctx, env, []tenantPlan{plan}, gateways)
	id := su.ids[0]
	rec := NewRecorder()
	obs := su.obs
	before := fleetScrape(ctx, env)
	load, err := StartLoad(ctx, rec, env.Targets(), su.flows, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	act(id, load)
	load.Stop()
	end := time.Now()
	states := obs.Stop(ctx)
	res := Check(Input{Lag: Lag, States: states, Admitted: rec.Admitted(), Instances: env.instances()})
	r := report(t, "scenario "+name, nil, rec.Summary(), res, states, rec)
	fleetCounters(t, ctx, env, before, &r)
	r.events = name
	return r, rec, id, start, end
}

// stallScenario is issue 14 item 1: capacity 20 (40 over two regions at 50/50), refill
// 0.01/s, about 50 requests/s on one gateway, its Redis stopped (SIGSTOP) for 3 s: at
// most 21 admitted, with the default Redis timeout and breaker. The stall begins 200 ms
// into the load, while the bucket still holds tokens.
func stallScenario(t *testing.T, ctx context.Context, env *Env) row {
	g := env.GatewaysOf(env.Regions[0])[0]
	r, rec, id, _, _ := scenarioRun(t, ctx, env, "stall-3s", tenantPlan{prefix: "stall", capacity: 40, refill: 0.02, rate: 50}, []string{g.ID}, func(string, *Load) {
		// The stall comes while the bucket still holds tokens (about 10 decided):
		// what the fallback admits meanwhile must be charged back, not handed out again.
		hold(ctx, 200*time.Millisecond)
		if err := env.Redis[g.Region].Pause(); err != nil {
			t.Error(err)
		}
		hold(ctx, 3*time.Second)
		if err := env.Redis[g.Region].Resume(); err != nil {
			t.Error(err)
		}
		hold(ctx, 4*time.Second)
	})
	if n := rec.Total(id, time.Time{}); n > 21 {
		t.Errorf("a 3 s Redis stall: %d admitted, want at most 21 (capacity 20, refill 0.01/s)", n)
	} else {
		t.Logf("a 3 s Redis stall: %d admitted (at most 21)", n)
	}
	// Issue 14 item 6: every token the fallback admitted during the stall was charged
	// once Redis answered, and counted as repaid (or written off): none was dropped
	// silently. The refill of the fallback bucket during the stall (0.005/s) voids less
	// than one token of debt.
	if d := r.debts; d.owed < 1 || d.settled() < d.owed-1 {
		t.Errorf("after the stall: the fallback admitted %.0f tokens, %.0f repaid, %.0f written off, %.0f dropped; want some admitted and all but < 1 of them settled",
			d.owed, d.repaid, d.writtenOff, d.dropped)
	}
	return r
}

// costScenario is issue 14 item 4's cost case: capacity 16 / 4 per s pinned 50/50 (a
// region holds 8 tokens and refills 2/s; each of its 2 fallback buckets holds 4 and
// refills 1/s), requests of cost 5 (the stack's /bulk route) at 4 per s on both gateways
// of one region. The load pauses for 4 s (every bucket refills to full), the region's
// Redis is stopped, and the load resumes for the 3 s of the stall: no fallback bucket can
// hold a cost-5 request, so the fallbacks admit none and count the refusals. A fallback
// that clipped the cost to its bucket admitted one a gateway at once, for 4 tokens.
func costScenario(t *testing.T, ctx context.Context, env *Env) row {
	region := env.Regions[0]
	var ids []string
	for _, g := range env.GatewaysOf(region) {
		ids = append(ids, g.ID)
	}
	before := fleetScrape(ctx, env)
	r, _, _, _, _ := scenarioRun(t, ctx, env, "cost-5-stall", tenantPlan{prefix: "cost", capacity: 16, refill: 4, rate: 4, bulk: true}, ids, func(_ string, load *Load) {
		hold(ctx, 2*time.Second)
		for _, id := range ids {
			if err := load.Drain(id, 15*time.Second); err != nil {
				t.Error(err)
			}
		}
		hold(ctx, 4*time.Second)
		if err := env.Redis[region].Pause(); err != nil {
			t.Error(err)
		}
		for _, id := range ids {
			load.Route(id)
		}
		hold(ctx, 3*time.Second)
		if err := env.Redis[region].Resume(); err != nil {
			t.Error(err)
		}
		hold(ctx, 2*time.Second)
	})
	rejected := fleetDelta(before, fleetScrape(ctx, env), "ratelimit_fallback_cost_rejections_total")
	if r.fallback > 0 || rejected == 0 {
		t.Errorf("cost-5 requests through a 3 s stall, fallback buckets of 4: %.0f admitted by the fallback (want 0), %.0f fallback cost rejections (want some)", r.fallback, rejected)
	} else {
		t.Logf("cost-5 requests through a 3 s stall, fallback buckets of 4: none admitted by the fallback, %.0f refused by it", rejected)
	}
	return r
}

// reshardScenario is issue 14 item 2: capacity 100, refill 0.01/s, the rule's shards
// set 1 -> 4 -> 8 while the tenant is at its limit: at most C + R·t + 1.
func reshardScenario(t *testing.T, ctx context.Context, env *Env) row {
	setShards := func(id string, n int) {
		if err := env.Store.SetRule(store.WithAudit(ctx, "torture", "reshard"), regions.Rule{Tenant: id, Route: stack.Route, Capacity: 100, RefillPerSecond: 0.01, Shards: n}); err != nil {
			t.Error(err)
		}
	}
	r, rec, id, began, end := scenarioRun(t, ctx, env, "reshard-1-4-8", tenantPlan{prefix: "reshard", capacity: 100, refill: 0.01, rate: 10}, nil, func(id string, _ *Load) {
		hold(ctx, 4*time.Second)
		setShards(id, 4)
		hold(ctx, 5*time.Second)
		setShards(id, 8)
		hold(ctx, 5*time.Second)
	})
	bound := 100 + 0.01*end.Sub(began).Seconds() + 1
	if n := rec.Total(id, time.Time{}); float64(n) > bound {
		t.Errorf("shards 1 -> 4 -> 8 at the limit: %d admitted, want at most C + R·t + 1 = %.2f", n, bound)
	} else {
		t.Logf("shards 1 -> 4 -> 8 at the limit: %d admitted (at most %.2f)", n, bound)
	}
	return r
}

// raiseScenario is issue 14 item 3: rule 2 tokens / 1 per s, drained, then after the
// old key's TTL (2 x the time to fill, 4 s at the regional 1 token / 0.5 per s) raised
// to capacity 1000: at most the old bucket (2) plus the refill since the change.
func raiseScenario(t *testing.T, ctx context.Context, env *Env) row {
	var changed time.Time
	r, rec, id, _, end := scenarioRun(t, ctx, env, "raise-after-ttl", tenantPlan{prefix: "raise", capacity: 2, refill: 1, rate: 5}, nil, func(id string, load *Load) {
		hold(ctx, 3*time.Second) // drained
		for _, g := range env.Gateways {
			if err := load.Drain(g.ID, 15*time.Second); err != nil {
				t.Error(err)
			}
		}
		hold(ctx, 8*time.Second) // idle past the old key's TTL
		changed = time.Now()
		if err := env.Store.SetRule(store.WithAudit(ctx, "torture", "raise"), regions.Rule{Tenant: id, Route: stack.Route, Capacity: 1000, RefillPerSecond: 1, Shards: 1}); err != nil {
			t.Error(err)
		}
		for _, g := range env.Gateways {
			load.Route(g.ID)
		}
		hold(ctx, 5*time.Second)
	})
	bound := 2 + 1*end.Sub(changed).Seconds()
	if n := rec.Total(id, changed); float64(n) > bound {
		t.Errorf("capacity raised 2 -> 1000 after the key expired: %d admitted since the change, want at most the old bucket + refill = %.2f", n, bound)
	} else {
		t.Logf("capacity raised 2 -> 1000 after the key expired: %d admitted since the change (at most %.2f)", n, bound)
	}
	return r
}
