package torture

import (
	"context"
	"strings"
	"sync"
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
	{"fleet-stall", fleetScenario},
	{"delete-stall", deleteScenario},
	{"bands-roll-stall", bandsScenario},
	{"quota-swing", quotaSwingScenario},
}

// scenarioRun is the part every scenario shares: observe, load, act, stop, check. Each
// plan is pinned 50/50 and loaded on gateways (all when empty), or on the gateways of
// its region. act gets the tenants' ids, the load and do, which runs an event now
// (Executor.Do: logged, and an event not carried out fails the scenario).
func scenarioRun(t *testing.T, ctx context.Context, env *Env, name string, plans []tenantPlan, gateways []string, act func(ids []string, load *Load, do func(Event))) (row, *Recorder, []string, time.Time, time.Time) {
	t.Helper()
	for i := range plans {
		plans[i].pinned = !plans[i].unpinned
	}
	su := addTenants(t, ctx, env, plans, gateways)
	rec := NewRecorder()
	obs := su.obs
	before := fleetScrape(ctx, env)
	load, err := StartLoad(ctx, rec, env.Targets(), su.flows, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	x := NewExecutor(env, load, su.rules)
	start := time.Now()
	act(su.ids, load, func(e Event) { x.Do(ctx, start, e) })
	for _, r := range env.Regions { // a scale-out an act left behind
		if err := x.scaleIn(ctx, r); err != nil {
			t.Errorf("scale %s in after the scenario: %v", r, err)
		}
	}
	load.Stop()
	end := time.Now()
	states := obs.Stop(ctx)
	res := check(t, env, states, rec, x)
	r := report(t, env, "scenario "+name, x, rec.Summary(), res, states, rec)
	fleetCounters(t, ctx, env, before, &r)
	if log := x.Log(); len(log) > 0 {
		t.Logf("what ran:\n  %s", strings.Join(log, "\n  "))
	}
	r.events = name
	return r, rec, su.ids, start, end
}

// stallScenario is issue 14 item 1: capacity 20 (40 over two regions at 50/50), refill
// 0.01/s, about 50 requests/s on one gateway, its Redis stopped (SIGSTOP) for 3 s: at
// most 21 admitted, with the default Redis timeout and breaker. The stall begins 200 ms
// into the load, while the bucket still holds tokens.
func stallScenario(t *testing.T, ctx context.Context, env *Env) row {
	g := env.LiveOf(env.Regions[0])[0]
	r, rec, ids, _, _ := scenarioRun(t, ctx, env, "stall-3s", []tenantPlan{{prefix: "stall", capacity: 40, refill: 0.02, rate: 50}}, []string{g.ID}, func([]string, *Load, func(Event)) {
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
	if n := rec.Total(ids[0], time.Time{}); n > 21 {
		t.Errorf("a 3 s Redis stall: %d admitted, want at most 21 (capacity 20, refill 0.01/s)", n)
	} else {
		t.Logf("a 3 s Redis stall: %d admitted (at most 21)", n)
	}
	// Issue 14 item 6: every token the fallback admitted during the stall was charged
	// once Redis answered, and counted as repaid (or written off): none was lost. At
	// 0.01/s a fallback bucket, which starts empty, earns nothing in 3 s, so it may
	// admit nothing at all; what it did admit must be settled.
	if d := r.debts; d.settled() < d.owed-1 || d.lost > 0 {
		t.Errorf("after the stall: the fallback admitted %.0f tokens, %.0f repaid, %.0f written off, %.0f lost; want all but < 1 of them charged",
			d.owed, d.repaid, d.writtenOff, d.lost)
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
	for _, g := range env.LiveOf(region) {
		ids = append(ids, g.ID)
	}
	before := fleetScrape(ctx, env)
	r, _, _, _, _ := scenarioRun(t, ctx, env, "cost-5-stall", []tenantPlan{{prefix: "cost", capacity: 16, refill: 4, rate: 4, bulk: true}}, ids, func(_ []string, load *Load, _ func(Event)) {
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
	r, rec, ids, began, end := scenarioRun(t, ctx, env, "reshard-1-4-8", []tenantPlan{{prefix: "reshard", capacity: 100, refill: 0.01, rate: 10}}, nil, func(ids []string, _ *Load, _ func(Event)) {
		id := ids[0]
		hold(ctx, 4*time.Second)
		setShards(id, 4)
		hold(ctx, 5*time.Second)
		setShards(id, 8)
		hold(ctx, 5*time.Second)
	})
	bound := 100 + 0.01*end.Sub(began).Seconds() + 1
	if n := rec.Total(ids[0], time.Time{}); float64(n) > bound {
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
	r, rec, ids, _, end := scenarioRun(t, ctx, env, "raise-after-ttl", []tenantPlan{{prefix: "raise", capacity: 2, refill: 1, rate: 5}}, nil, func(ids []string, load *Load, _ func(Event)) {
		id := ids[0]
		hold(ctx, 3*time.Second) // drained
		for _, g := range env.Live() {
			if err := load.Drain(g.ID, 15*time.Second); err != nil {
				t.Error(err)
			}
		}
		hold(ctx, 8*time.Second) // idle past the old key's TTL
		changed = time.Now()
		if err := env.Store.SetRule(store.WithAudit(ctx, "torture", "raise"), regions.Rule{Tenant: id, Route: stack.Route, Capacity: 1000, RefillPerSecond: 1, Shards: 1}); err != nil {
			t.Error(err)
		}
		for _, g := range env.Live() {
			load.Route(g.ID)
		}
		hold(ctx, 5*time.Second)
	})
	bound := 2 + 1*end.Sub(changed).Seconds()
	if n := rec.Total(ids[0], changed); float64(n) > bound {
		t.Errorf("capacity raised 2 -> 1000 after the key expired: %d admitted since the change, want at most the old bucket + refill = %.2f", n, bound)
	} else {
		t.Logf("capacity raised 2 -> 1000 after the key expired: %d admitted since the change (at most %.2f)", n, bound)
	}
	return r
}

// fleetScenario is issue 21's operator during an outage, in both regions at once, each
// with a tenant of capacity 40 / 0.02 per s pinned 50/50 (20 / 0.01 per s a region) at
// its limit: in us-east the Redis is stopped (SIGSTOP) for 8 s while every gateway of
// the region is restarted one after the other, twice round (kubectl rollout restart
// during an incident), in eu-west while the region scales out from 2 gateways to 5, and
// back to 2 right after. Before issue 21 each new process started its fallback bucket
// full at C/N and the debts of the old ones were gone: 61-62 admitted for the rolling
// restart, 30-31 for the scale-out, where the bound is about 20.
func fleetScenario(t *testing.T, ctx context.Context, env *Env) row {
	east, west := env.Regions[0], env.Regions[1]
	plans := []tenantPlan{
		{prefix: "roll", capacity: 40, refill: 0.02, rate: 10, region: east},
		{prefix: "scale", capacity: 40, refill: 0.02, rate: 10, region: west},
	}
	r, rec, ids, _, _ := scenarioRun(t, ctx, env, "fleet-stall", plans, nil, func(ids []string, load *Load, do func(Event)) {
		hold(ctx, 2*time.Second) // both at their limit
		var wg sync.WaitGroup
		for _, region := range []string{east, west} {
			wg.Go(func() { do(Event{Kind: RedisStall, Region: region, Hold: 8 * time.Second}) })
		}
		hold(ctx, 500*time.Millisecond)
		wg.Go(func() { do(Event{Kind: RollingRestart, Region: east}) })
		do(Event{Kind: ScaleOut, Region: west, Gateways: 5})
		wg.Wait()
		do(Event{Kind: ScaleIn, Region: west})
		hold(ctx, 3*time.Second)
	})
	t.Logf("a rolling restart of %s twice round during an 8 s Redis stall: %d admitted (20 / 0.01 per s in the region)", east, rec.Total(ids[0], time.Time{}))
	t.Logf("%s scaled out from 2 to 5 during an 8 s Redis stall, and back: %d admitted (20 / 0.01 per s in the region)", west, rec.Total(ids[1], time.Time{}))
	return r
}

// deleteScenario is issue 21's rule deletion and its old-answer case, one in each region,
// each tenant at its limit on the region's first gateway, and the second gateway joining
// its load when the region's Redis is stopped (SIGSTOP) for 3 s:
//   - us-east: a tenant with its own rule of 20 / 0.02 per s (about 10 / 0.01 a region:
//     its share is not pinned, so that nothing but its rule names it); its own rule is
//     deleted (the route's larger default applies, RouteDefault: 200 / 0.05 per s), an
//     unrelated rule is written a second later (any reload), then the stall. The second
//     gateway never decided the tenant. Before issue 21: 40 admitted where the bound is
//     10 (the raise marker dropped for a tenant the snapshot no longer names, so the new
//     fallback bucket read full at the new capacity).
//   - eu-west: a tenant of 40 / 0.02 (20 a region), no restart, no change: the second
//     gateway's last answer is from before the first drained the bucket. Before issue
//     21: 29 where the bound is 20 (a fallback started from that old answer).
func deleteScenario(t *testing.T, ctx context.Context, env *Env) row {
	east, west := env.Regions[0], env.Regions[1]
	e, w := env.LiveOf(east), env.LiveOf(west)
	const stallAt = 5500 * time.Millisecond
	plans := []tenantPlan{
		{prefix: "del", capacity: 20, refill: 0.02, rate: 10, on: []string{e[0].ID}, joins: []string{e[1].ID}, joinAt: stallAt, fresh: true, unpinned: true},
		{prefix: "old", capacity: 40, refill: 0.02, rate: 10, on: []string{w[0].ID}, joins: []string{w[1].ID}, joinAt: stallAt},
	}
	r, rec, ids, _, _ := scenarioRun(t, ctx, env, "delete-stall", plans, nil, func(ids []string, load *Load, do func(Event)) {
		hold(ctx, 3*time.Second) // at their limits
		do(Event{Kind: RuleDelete, Tenant: ids[0]})
		hold(ctx, time.Second)
		do(Event{Kind: ShardChange, Tenant: ids[1], Shards: 1}) // unrelated: the same rule written again
		waitFor(ctx, load.began.Add(stallAt))
		var wg sync.WaitGroup
		for _, region := range []string{east, west} {
			wg.Go(func() { do(Event{Kind: RedisStall, Region: region, Hold: 3 * time.Second}) })
		}
		wg.Wait()
		hold(ctx, 3*time.Second)
	})
	t.Logf("own rule deleted, then a reload and a 3 s stall in %s, a gateway that never decided it joining: %d admitted (about 10 / 0.01 per s in the region before the deletion)", east, rec.Total(ids[0], time.Time{}))
	t.Logf("a 3 s stall in %s, no restart and no change, a gateway with an old answer joining: %d admitted (20 / 0.01 per s in the region)", west, rec.Total(ids[1], time.Time{}))
	return r
}

// bandsScenario is issue 24's bands under an operator's moves during a fault: a tenant
// of 40 / 20 per s with a band "minute" of 40 / 0.02 per s, pinned 50/50 (20 / 10 per s
// and 20 / 0.01 per s a region), loaded at 10 requests/s on us-east, whose Redis is
// stopped for 8 s while its gateways are restarted one after the other. The band binds,
// not the rule's own bucket: the checker holds the tenant's admissions to each band's
// bound separately (BandKey), so a fallback, a restart or a debt that forgot the band
// shows as a breach of "minute".
func bandsScenario(t *testing.T, ctx context.Context, env *Env) row {
	east := env.Regions[0]
	plans := []tenantPlan{{prefix: "bands", capacity: 40, refill: 20, rate: 10, region: east,
		bands: []regions.Band{{Name: "minute", Capacity: 40, RefillPerSecond: 0.02}}}}
	r, rec, ids, _, _ := scenarioRun(t, ctx, env, "bands-roll-stall", plans, nil, func(ids []string, load *Load, do func(Event)) {
		hold(ctx, 2*time.Second) // the minute band at its limit
		var wg sync.WaitGroup
		wg.Go(func() { do(Event{Kind: RedisStall, Region: east, Hold: 8 * time.Second}) })
		hold(ctx, 500*time.Millisecond)
		do(Event{Kind: RollingRestart, Region: east})
		wg.Wait()
		hold(ctx, 3*time.Second)
	})
	t.Logf("a band of 20 / 0.01 per s in %s through a rolling restart during an 8 s Redis stall: %d admitted", east, rec.Total(ids[0], time.Time{}))
	return r
}

// quotaSwingScenario is a calendar quota whose traffic moves between regions mid-period
// (docs/reliability.md, "Calendar quotas"): an hourly budget of 100 for the fleet,
// about 6 requests/s by every door into us-east for 15 s (slow enough that the
// rebalancer raises us-east's share while it spends), then into eu-west, unpinned, so
// the rebalancer moves its shares after it; at 20 s eu-west's Redis is killed and
// restarted empty 2 s later: its counter must come back at what the store counted. The fleet must
// admit at most B + A(t* − S, t*] in the period with the slack of CheckQuotas; a region
// allowed share × B regardless of the usage would admit about B·(s_east + s_west) with
// both shares near their rebalanced high.
func quotaSwingScenario(t *testing.T, ctx context.Context, env *Env) row {
	west := env.Regions[1]
	p := quotaPlan
	p.unpinned, p.swing = true, 15*time.Second
	p.capacity, p.refill = 1000, 100 // its own bucket never binds: the quota decides
	p.bands = []regions.Band{{Name: "hour", Capacity: 100, Period: regions.PeriodHour}}
	r, rec, ids, _, _ := scenarioRun(t, ctx, env, "quota-swing", []tenantPlan{p}, nil, func(ids []string, load *Load, do func(Event)) {
		hold(ctx, 20*time.Second)
		do(Event{Kind: RedisKill, Region: west, Hold: 2 * time.Second})
		hold(ctx, 8*time.Second)
	})
	t.Logf("an hourly quota of 100 swung from %s to %s with %s's Redis restarted empty: %d admitted", env.Regions[0], west, west, rec.Total(ids[0], time.Time{}))
	if r.quota.Budget == 0 {
		t.Errorf("quota-swing: no quota period checked")
	}
	return r
}
