package torture

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/e2e/faults"
	"github.com/quotaplane/quotaplane/e2e/stack"
	"github.com/quotaplane/quotaplane/internal/gendoc"
	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

var (
	seedFlag   = flag.Uint64("seed", 0, "run only this seed (0: seeds 1..-seeds and the fixed scenarios)")
	seedsFlag  = flag.Int("seeds", 2, "how many seeds to run (1..N)")
	lengthFlag = flag.Duration("length", 60*time.Second, "each seed's schedule length")
	update     = flag.Bool("update", false, "rewrite the torture figures in docs/reliability.md")
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m)) }

// row is one line of the figures table.
type row struct {
	name     string
	events   string
	sum      Summary
	admitted int
	worst    Window
	global   Window
	ok       bool
	// fallback are the requests the gateways admitted from their fallback, and
	// redisErrs their Redis call errors, during the run (from /metrics).
	fallback, redisErrs float64
	// refused are the fallback's refusals (a failed Redis call with the breaker closed,
	// a gateway not counted yet, a cost above the fallback bucket), during the run.
	refused float64
	debts   debts
	// quota is the run's worst calendar-quota period (Budget 0: none checked).
	quota QuotaPeriod
}

// debts are the fallback's accounting over a run, summed over the gateways: the tokens
// it admitted (each owed) and what became of them.
type debts struct{ owed, repaid, writtenOff, lost float64 }

// settled is what a reply from Redis accounted for, or a stop could not charge.
func (d debts) settled() float64 { return d.repaid + d.writtenOff + d.lost }

// fleetScrape is every running gateway's /metrics (a gateway that does not answer is
// left out).
func fleetScrape(ctx context.Context, env *Env) map[string]faults.Scrape {
	out := map[string]faults.Scrape{}
	for _, g := range env.Live() {
		if sc, err := faults.ScrapeURL(ctx, g.Admin); err == nil {
			out[g.ID] = sc
		}
	}
	return out
}

// fleetDelta is the increase of a counter summed over the gateways (from 0 for one that
// restarted in between: another process_start_time_seconds).
func fleetDelta(before, after map[string]faults.Scrape, name string, match ...string) float64 {
	sum := 0.0
	for id, a := range after {
		b, ok := before[id]
		if !ok || a.Sum("process_start_time_seconds") != b.Sum("process_start_time_seconds") {
			sum += a.Sum(name, match...)
			continue
		}
		sum += a.Sum(name, match...) - b.Sum(name, match...)
	}
	return sum
}

// TestTorture runs the fixed issue-14 scenarios and the seeded schedules on one stack
// (each run with tenants of its own). A failing seed prints its schedule and how to
// replay it.
func TestTorture(t *testing.T) {
	if *seedsFlag < 1 || *seedsFlag > 200 {
		t.Fatalf("-seeds %d: want 1..200", *seedsFlag)
	}
	if *lengthFlag < 10*time.Second || *lengthFlag > 5*time.Minute {
		t.Fatalf("-length %v: want 10s..5m", *lengthFlag)
	}
	seeds := []uint64{}
	if *seedFlag != 0 {
		seeds = append(seeds, *seedFlag)
	} else {
		for s := 1; s <= *seedsFlag; s++ {
			seeds = append(seeds, uint64(s))
		}
	}
	budget := 5*time.Minute + time.Duration(len(seeds))*(*lengthFlag+90*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	began := time.Now()
	env, err := Start(ctx, Options{})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(env.Close)
	t.Logf("stack ready in %v", time.Since(began).Round(time.Second))

	var rows []row
	for _, sc := range scenarios {
		var r row
		ok := t.Run("scenario/"+sc.name, func(t *testing.T) { r = sc.run(t, ctx, env) })
		if r.name != "" {
			r.ok = ok
			rows = append(rows, r)
		}
	}
	for _, seed := range seeds {
		var r row
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { r = runSeed(t, ctx, env, seed) })
		if r.name != "" {
			r.ok = ok
			rows = append(rows, r)
		}
	}
	table := figuresTable(rows)
	t.Logf("total %v\n%s", time.Since(began).Round(time.Second), table)
	if *update {
		if err := gendoc.Rewrite("../../docs/reliability.md", reliabilitySection, fmt.Sprintf("Measured %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))+table); err != nil {
			t.Fatal(err)
		}
	}
}

// tenantPlan is one tenant of a run: its starting rule and the requests per second sent
// to each gateway.
type tenantPlan struct {
	prefix   string
	capacity int64
	refill   float64
	rate     float64
	// bulk sends the tenant's requests to stack.BulkRoute (stack.BulkCost tokens each)
	// instead of stack.Route; hostile sends them with a forged tenant header (Flow).
	bulk, hostile bool
	// unthrottled: the rule is at the bounds, so the tenant must never see a 429 (a rule
	// past what the limiter can count would fail open or be enforced as 1 token). Its
	// rule is never deleted.
	unthrottled bool
	// pinned sets a 50/50 share override before the keys are waited for, and waits for
	// the pinned regional capacity on every gateway the tenant is loaded on; a scenario
	// pins every plan but those with unpinned (a tenant named by no share override).
	pinned, unpinned bool
	// route is the tenant's route (default stack.Route, or stack.BulkRoute with bulk);
	// spell sends its requests by each door of the map, in turn in the spellings given
	// (rate per door), instead of plain requests by the proxy.
	route string
	// bands are the rule's further bands: each is checked as a bucket of its own, the
	// tenant's admissions against the band's limit (BandKey).
	bands []regions.Band
	spell map[Door][]Spelling
	// region loads the tenant only on the gateways of region, those a scale-out adds
	// included, and on limits it to these gateways (default every gateway addTenants is
	// given).
	region string
	on     []string
	// joins are gateways the tenant's load also goes to, from joinAt after the load
	// starts. With fresh, they are made to know its key with requests no route matches
	// (authenticated, then 404: no bucket is decided), so they hold nothing for it until
	// they join; otherwise with a decided request, an answer that is old when they join.
	joins  []string
	joinAt time.Duration
	fresh  bool
	// swing sends the tenant's load to the first region's gateways until swing after
	// the load starts, and to the second's from then on: the rebalancer moves its
	// shares with it. keep: its rule is never deleted (a calendar quota's counter counts
	// nothing while its rule is gone: the default that applies has no quota).
	swing time.Duration
	keep  bool
}

// The hostile client's spellings (issue 21): one route, one limit_by value and one
// client address written the ways a router, a header parser or a forged header may take
// them. Every admission of any of them counts against the tenant's rule for its route.
var (
	pathSpellings = paths("/orders", "/Orders", "/orders/", "/ORDERS/", "/orders#frag", "/orders;jsessionid=1",
		"/orders%2F", "/%6Frders", "/x/../orders", "/./orders")
	routeSpellings = []Spelling{{Route: "orders"}, {Route: "Orders"}, {Route: "orders/"}, {Route: "ORDERS"},
		{Route: " orders"}, {Route: "/orders"}, {Route: "orders;x"}}
	valueSpellings = values("acme", "ACME", " acme", "acme,", "acme;x", "Acme ", "acme,acme")
	ipSpellings    = forged("203.0.113.7", "198.51.100.23", "203.0.113.7, 127.0.0.1", "2001:db8::1", stack.TrustedProxy, "")
)

func paths(ps ...string) []Spelling {
	out := make([]Spelling, len(ps))
	for i, p := range ps {
		out[i] = Spelling{Path: p}
	}
	return out
}

func values(vs ...string) []Spelling {
	out := make([]Spelling, len(vs))
	for i, v := range vs {
		out[i] = Spelling{Path: "/search", Route: stack.ValueRoute, Value: v}
	}
	return out
}

func forged(as ...string) []Spelling {
	out := make([]Spelling, len(as))
	for i, a := range as {
		out[i] = Spelling{Path: "/byip", Route: stack.IPRoute, XFF: a}
	}
	return out
}

// seedTenants: three trickle tenants (a lost bucket shows: their refill is far below
// what they are offered, so they are at their limit within seconds; trickle-c's rule
// has a band of 30 / 0.2 per s that binds before its own 40 / 1 per s, issue 24),
// one with a normal
// refill, and one for each of issue 14's items 4 and 5: a small rule (5 tokens: a
// share of 0.2 is 1 token for 2 instances, so the fallback's budget rounds to the
// one-token floor, and a share of 0.5 to 1 each, never round(1.5) = 2), and a rule at the
// capacity and refill bounds. Item 7: three of them send forged tenant headers on every
// request. Issue 21 item 4: a hostile client at every door, one tenant per kind of
// spelling (a route, a limit_by header value, a forged client address), each at its
// limit within seconds. The cost case of item 4 is the cost-5-stall scenario: in the
// seeds a cost-5 tenant's windows are a few requests wide, and one request of fallback
// overlap is 12-25 % of them.
var seedTenants = []tenantPlan{
	{prefix: "trickle-a", capacity: 40, refill: 0.05, rate: 4},
	{prefix: "trickle-b", capacity: 60, refill: 0.5, rate: 3, hostile: true},
	{prefix: "trickle-c", capacity: 40, refill: 1, rate: 3, bands: []regions.Band{{Name: "minute", Capacity: 30, RefillPerSecond: 0.2}}},
	{prefix: "normal", capacity: 100, refill: 20, rate: 8, hostile: true},
	{prefix: "small", capacity: 5, refill: 0.05, rate: 2},
	{prefix: "bound", capacity: regions.MaxCapacity, refill: regions.MaxRefillPerSecond, rate: 2, hostile: true, unthrottled: true},
	{prefix: "spell-path", capacity: 20, refill: 0.1, rate: 0.5, spell: map[Door][]Spelling{DoorProxy: pathSpellings, DoorCheck: pathSpellings, DoorRLS: routeSpellings}},
	{prefix: "spell-value", capacity: 10, refill: 0.1, rate: 0.5, route: stack.ValueRoute, spell: map[Door][]Spelling{DoorProxy: valueSpellings, DoorCheck: valueSpellings, DoorRLS: valueSpellings}},
	{prefix: "spell-ip", capacity: 10, refill: 0.1, rate: 0.5, route: stack.IPRoute, spell: map[Door][]Spelling{DoorProxy: ipSpellings, DoorCheck: ipSpellings, DoorRLS: ipSpellings}},
	quotaPlan,
}

// quotaPlan is the calendar-quota tenant: an hourly quota of 120 for the fleet, far
// below its own bucket (400 / 40 per s), by every door at 1 request/s per gateway each,
// about 6/s into the region its traffic is in (360 in a 60 s run): the quota refuses
// from the first seconds on (a region gets its share of what is left) and the fleet
// nears the budget after the traffic has swung from the first region to the second
// (swing, set per run: half its length), as the rebalancer moves the shares of a
// period half spent.
var quotaPlan = tenantPlan{prefix: "quota", capacity: 400, refill: 40, rate: 1, keep: true,
	bands: []regions.Band{{Name: "hour", Capacity: 120, Period: regions.PeriodHour}},
	spell: map[Door][]Spelling{DoorProxy: paths("/orders"), DoorCheck: paths("/orders"), DoorRLS: {{Route: "orders"}}}}

// withSwing is plans with the swing of those that swing set to at.
func withSwing(plans []tenantPlan, at time.Duration) []tenantPlan {
	out := slices.Clone(plans)
	for i := range out {
		if len(out[i].bands) > 0 && out[i].bands[0].Quota() {
			out[i].swing = at
		}
	}
	return out
}

// setup is a run's tenants, once every gateway knows their keys, and the observer of
// their limits.
type setup struct {
	obs   *Observer
	ids   []string
	flows []Flow
	rules map[string]regions.Rule
	specs []TenantSpec
	// unthrottled are the tenants that must never see a 429 (tenantPlan.unthrottled).
	unthrottled []string
}

// addTenants creates the plans' tenants, with their flows limited to gateways (all
// when empty), or to the gateways of a plan's region.
func addTenants(t *testing.T, ctx context.Context, env *Env, plans []tenantPlan, gateways []string) setup {
	t.Helper()
	s := setup{rules: map[string]regions.Rule{}}
	routes := map[string]string{}
	probes := map[string]Flow{} // tenant -> a plain request of its route, by the proxy
	for _, p := range plans {
		flow := Flow{Rate: p.rate, Gateways: gateways, Region: p.region, Hostile: p.hostile}
		if p.region != "" {
			flow.Gateways = nil
		}
		if len(p.on) > 0 {
			flow.Gateways = p.on
		}
		route := cmp.Or(p.route, stack.Route)
		switch route {
		case stack.ValueRoute:
			flow.Path = "/search"
		case stack.IPRoute:
			flow.Path = "/byip"
		}
		if p.bulk {
			route, flow.Path, flow.Cost = stack.BulkRoute, "/bulk", stack.BulkCost
		}
		id, key, err := env.AddTenant(ctx, p.prefix, route, p.capacity, p.refill, p.bands...)
		if err != nil {
			t.Fatal(err)
		}
		flow.Tenant, flow.Key = id, key
		routes[id] = route
		s.ids = append(s.ids, id)
		probes[id] = flow
		var flows []Flow
		if len(p.spell) == 0 {
			flows = append(flows, flow)
		}
		for _, door := range []Door{DoorProxy, DoorCheck, DoorRLS} {
			if sp := p.spell[door]; len(sp) > 0 {
				f := flow
				f.Door, f.Spellings = door, sp
				flows = append(flows, f)
			}
		}
		for _, f := range flows {
			if p.swing <= 0 {
				s.flows = append(s.flows, f)
				continue
			}
			from, to := f, f
			from.Gateways, from.Region, from.Stop = nil, env.Regions[0], p.swing
			to.Gateways, to.Region, to.Start = nil, env.Regions[1], p.swing
			s.flows = append(s.flows, from, to)
		}
		if len(p.joins) > 0 {
			f := flow
			f.Gateways, f.Region, f.Start = p.joins, "", p.joinAt
			s.flows = append(s.flows, f)
		}
		if p.unthrottled {
			s.unthrottled = append(s.unthrottled, id)
		}
		s.rules[id] = regions.Rule{Tenant: id, Route: route, Capacity: p.capacity, RefillPerSecond: p.refill, Shards: 1, Bands: p.bands}
		s.specs = append(s.specs, TenantSpec{ID: id, Capacity: p.capacity, Refill: p.refill, Keep: p.unthrottled || p.keep, Banded: len(p.bands) > 0})
		if p.pinned {
			if err := env.Store.SetOverride(ctx, regions.Scope{Tenant: id, Route: regions.Wildcard}, half(env.Regions), "torture", "pin for a scenario", 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The limits in force are observed from now on. What a gateway enforced before the
	// first read (the rebalancer may already have moved a new tenant's shares) may be
	// enforced until one lag after it, so the load starts no sooner than that.
	obs, err := env.Observe(ctx, routes)
	if err != nil {
		t.Fatal(err)
	}
	s.obs = obs
	t.Cleanup(func() { obs.cancel(); <-obs.done })
	observed := time.Now()
	// Every gateway knows every key before the load starts: a 401 would count as a
	// failure. These probes are not recorded; what they admit only makes the recorded
	// count smaller, never larger.
	for i, id := range s.ids {
		f := probes[id]
		want := ""
		if plans[i].pinned {
			want = fmt.Sprint(regions.Scale(plans[i].capacity, plans[i].refill, half(env.Regions)[env.Regions[0]]).Capacity)
		}
		for _, g := range env.Live() {
			if slices.Contains(plans[i].joins, g.ID) {
				probe, w := f, want
				if plans[i].fresh {
					probe.Path, w = "/no-route", ""
				}
				waitHeader(t, ctx, g, probe, func(status int, lim string) bool {
					return status != http.StatusUnauthorized && (w == "" || lim == w)
				})
				continue
			}
			if (len(f.Gateways) > 0 && !slices.Contains(f.Gateways, g.ID)) || (f.Region != "" && g.Region != f.Region) {
				continue
			}
			waitHeader(t, ctx, g, f, func(status int, lim string) bool {
				return status != http.StatusUnauthorized && (want == "" || lim == want)
			})
		}
	}
	waitFor(ctx, observed.Add(Lag))
	return s
}

// half is an equal share per region.
func half(regions []string) map[string]float64 {
	out := map[string]float64{}
	for _, r := range regions {
		out[r] = 1 / float64(len(regions))
	}
	return out
}

var probeClient = &http.Client{Timeout: 5 * time.Second}

// waitHeader probes g with f's key and path until ok(status, X-RateLimit-Limit) holds
// (at most 20 s).
func waitHeader(t *testing.T, ctx context.Context, g *stack.Gateway, f Flow, ok func(int, string) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.URL+cmp.Or(f.Path, "/orders"), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", f.Key)
		resp, err := probeClient.Do(req)
		if err == nil {
			resp.Body.Close()
			lim := resp.Header.Get("X-RateLimit-Limit")
			if ok(resp.StatusCode, lim) {
				return
			}
			last = fmt.Sprintf("status %d limit %q", resp.StatusCode, lim)
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond) // polling a running gateway: no hook to wait on
	}
	t.Fatalf("gateway %s: not ready for the run (last %s)", g.ID, last)
}

func runSeed(t *testing.T, ctx context.Context, env *Env, seed uint64) row {
	su := addTenants(t, ctx, env, withSwing(seedTenants, *lengthFlag/2), nil)
	sched := Generate(seed, ScheduleConfig{Length: *lengthFlag, Regions: env.Regions, Gateways: env.GatewaySpecs(), Tenants: su.specs})
	replay := fmt.Sprintf("go test -count=1 -run 'TestTorture/seed=%d$' ./e2e/torture/ -seed %d -length %v", seed, seed, *lengthFlag)
	return runSchedule(t, ctx, env, fmt.Sprintf("seed %d", seed), su, sched, replay)
}

// steadyScenario is the seeds' load, the hostile client at every door included, for 20 s
// with no fault and no change: what the machine alone (CPU stalls against the 5 ms Redis
// timeout) does to the invariant, and what the doors do with a hostile client's
// spellings when nothing else happens.
func steadyScenario(t *testing.T, ctx context.Context, env *Env) row {
	su := addTenants(t, ctx, env, withSwing(seedTenants, 10*time.Second), nil)
	return runSchedule(t, ctx, env, "scenario steady", su, Schedule{Length: 20 * time.Second}, "go test -count=1 -run 'TestTorture/scenario/steady$' ./e2e/torture/")
}

// runSchedule sends the tenants' load, runs the schedule, and checks.
func runSchedule(t *testing.T, ctx context.Context, env *Env, name string, su setup, sched Schedule, replay string) row {
	t.Logf("%s", sched)
	rec := NewRecorder()
	obs := su.obs
	before := fleetScrape(ctx, env)
	load, err := StartLoad(ctx, rec, env.Targets(), su.flows, sched.Length+2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	x := NewExecutor(env, load, su.rules)
	x.Run(ctx, start, sched.Events)
	waitFor(ctx, start.Add(sched.Length+3*time.Second)) // a tail after the last event
	load.Stop()
	states := obs.Stop(ctx)
	res := check(t, env, states, rec, x)
	sum := rec.Summary()
	r := report(t, env, name, x, sum, res, states, rec)
	fleetCounters(t, ctx, env, before, &r)
	refusals := r.refused // the fleet's refusals for a failed Redis call, each a 429 for someone
	for _, id := range su.unthrottled {
		var excuses []Span
		for _, at := range x.Began(ShardChange, id) {
			excuses = append(excuses, Span{at, at.Add(Lag)})
		}
		for _, spans := range x.RedisRestarts() {
			for _, sp := range spans {
				excuses = append(excuses, Span{sp.From, sp.From.Add(Lag)}) // a restarted Redis has no shard either
			}
		}
		for _, sp := range x.RedisFaults() {
			// A call that fails is refused until the breaker opens, and a fallback bucket
			// starts empty (and earns nothing in a gateway not counted yet).
			excuses = append(excuses, Span{sp.From, sp.To.Add(Lag)})
		}
		refusals = checkUnthrottled(t, id, rec.Throttled(id), excuses, refusals, sum.Codes[id][http.StatusOK])
	}
	if t.Failed() {
		t.Logf("FAILED %s; replay with:\n  %s\n%s\nwhat ran:\n  %s", name, replay, sched, strings.Join(x.Log(), "\n  "))
	} else {
		t.Logf("what ran:\n  %s", strings.Join(x.Log(), "\n  "))
	}
	r.events = eventCounts(sched.Events)
	if r.events == "" {
		r.events = "none"
	}
	return r
}

// check runs Check over what a run recorded: the observed limits, the admissions, the
// Redis restarts and PostgreSQL outages the executor ran (x may be nil), and every
// gateway's lives and breaker spans (from the gateways' own logs, read now).
func check(t *testing.T, env *Env, states map[string]map[string][]State, rec *Recorder, x *Executor) Result {
	t.Helper()
	gws, err := env.GatewayRuns(time.Now())
	if err != nil {
		t.Errorf("breaker spans from the gateways' logs: %v", err)
	}
	adm := rec.Admitted()
	for key := range states { // a band's bucket is charged with every admission of its tenant
		if tenant, _, ok := strings.Cut(key, "#"); ok {
			adm[key] = adm[tenant]
		}
	}
	in := Input{Lag: Lag, States: states, Admitted: adm, Gateways: gws, Expected: Expected, QuotaSync: QuotaSync, QuotaMargin: QuotaSyncMargin}
	if x != nil {
		in.RedisRestarts, in.RedisKills, in.Outages, in.Quotas = x.RedisRestarts(), x.RedisKills(), x.Outages(), x.Quotas()
	}
	return Check(in)
}

// checkUnthrottled: a tenant whose rule is at the bounds is never throttled (item 5: a
// rule past what the limiter could count used to fail open, and MaxInt64 was enforced as
// 1 token), except by a shard change of its rule or a Redis restarted empty: a shard
// i >= 1 that does not exist starts empty at its first call (item 2's conservation), so
// that call may be refused even at a refill of 1e12/s, and so may the retry on a second
// new shard. A 429 sent within one lag of either is that; so is one during a Redis fault
// or within one lag after it (a failed call is refused until the breaker opens, and a
// fallback bucket starts empty), and one of the gateways' counted refusals of a failed
// Redis call. Any other fails the run. It returns the refusals it did not use.
func checkUnthrottled(t *testing.T, id string, throttled []time.Time, excuses []Span, refusals float64, admitted int) float64 {
	t.Helper()
	var after []string
	for _, at := range throttled {
		excused := false
		for _, sp := range excuses {
			excused = excused || (!at.Before(sp.From) && at.Before(sp.To))
		}
		if !excused {
			after = append(after, at.Format("15:04:05.000"))
		}
	}
	// A Redis call that timed out on the loaded machine outside a fault is refused too
	// (ratelimit_fallback_refused_total counts each): those 429s are the contract, not a
	// miscount, as long as no more are unexplained than the gateways refused.
	explained := min(float64(len(after)), refusals)
	unexplained := len(after) - int(explained)
	if unexplained > 0 || admitted == 0 {
		t.Errorf("%s has a rule at the bounds (capacity %d, refill %g): %d admitted, %d throttled not within %v of a shard change, a Redis restart or a Redis fault (at %v), of which the gateways' refusals of failed Redis calls (%.0f) explain %.0f; want none unexplained",
			id, int64(regions.MaxCapacity), float64(regions.MaxRefillPerSecond), admitted, len(after), Lag, after, refusals, explained)
	} else if len(throttled) > 0 {
		t.Logf("%s (rule at the bounds): %d throttled, each within %v of a shard change of its rule, a Redis restart or a Redis fault, or one of the gateways' %.0f refusals of a failed Redis call", id, len(throttled), Lag, refusals)
	}
	return refusals - explained
}

// report checks what every run must hold (no 5xx, no unexpected status, every request
// answered, every event carried out, the invariant in every window) and logs the worst
// windows.
func report(t *testing.T, env *Env, name string, x *Executor, sum Summary, res Result, states map[string]map[string][]State, rec *Recorder) row {
	t.Helper()
	t.Logf("%s: %s", name, sum)
	if sp := rec.Spellings(); len(sp) > 0 {
		t.Logf("the hostile client's spellings, by door (answers by status; the limits they were decided under):\n  %s", strings.Join(sp, "\n  "))
	}
	for _, w := range res.Worst {
		t.Logf("worst window: %s", w)
	}
	if sum.Status5xx != 0 || sum.Unexpected != 0 {
		t.Errorf("%d responses with status 5xx, %d with another unexpected status (codes %v); first errors:\n  %s", sum.Status5xx, sum.Unexpected-sum.Status5xx, sum.Codes, strings.Join(sum.Errors, "\n  "))
		if lines := env.NginxErrors(); sum.Status5xx != 0 && len(lines) > 0 {
			t.Logf("nginx error logs:\n  %s", strings.Join(lines, "\n  "))
		}
	}
	if sum.ClientErrors != 0 {
		t.Errorf("%d requests without an answer; first: %s", sum.ClientErrors, strings.Join(sum.Errors, "; "))
	}
	if sum.Undecided != 0 || sum.Identity != 0 {
		t.Errorf("%d answers without a decision (no X-RateLimit-Limit: failed open), %d with a tenant header other than the caller's own at the upstream; first:\n  %s",
			sum.Undecided, sum.Identity, strings.Join(sum.Problems, "\n  "))
	}
	if x != nil {
		for _, err := range x.Errors() {
			t.Errorf("event not carried out: %v", err)
		}
	}
	for _, w := range res.Breaches() {
		t.Errorf("invariant broken: %s", w)
		t.Logf("limits in force for %s: %s", w.Tenant, describeStates(states[w.Tenant]))
	}
	var worstQuota QuotaPeriod
	for _, q := range res.Quotas {
		t.Logf("quota period: %s", q)
		if q.Breach() {
			t.Errorf("calendar-quota invariant broken: %s", q)
		}
		if worstQuota.Budget == 0 || q.Ratio() > worstQuota.Ratio() {
			worstQuota = q
		}
	}
	r := row{name: name, sum: sum, quota: worstQuota}
	for _, w := range res.Worst {
		if w.Region != "" && w.Ratio() > r.worst.Ratio() {
			r.worst = w
		}
		if w.Region == "" && w.Ratio() > r.global.Ratio() {
			r.global = w
		}
	}
	for _, m := range rec.Admitted() {
		for _, as := range m {
			for _, a := range as {
				r.admitted += a.Tokens()
			}
		}
	}
	t.Logf("%s: max admitted/bound %.3f (regional), %.3f (regions together)", name, r.worst.Ratio(), r.global.Ratio())
	return r
}

// fleetCounters reads the fallback's admissions, its debts and the Redis errors since
// before into r, and checks the debts (issue 14 item 6): what the gateways count as
// repaid, written off and lost is never more than the tokens their fallbacks admitted
// (the repaid metric counts what the script charged, once per reply read, not what was
// sent). A gateway restarted in the run lost its counters and its debts with them, so
// its delta starts at its restart.
func fleetCounters(t *testing.T, ctx context.Context, env *Env, before map[string]faults.Scrape, r *row) {
	t.Helper()
	after := fleetScrape(ctx, env)
	r.fallback = fleetDelta(before, after, "ratelimit_requests_total", "source", "fallback", "decision", "allowed")
	r.redisErrs = fleetDelta(before, after, "ratelimit_redis_errors_total")
	r.refused = fleetDelta(before, after, "ratelimit_fallback_refused_total")
	r.debts = debts{
		owed:       fleetDelta(before, after, "ratelimit_fallback_owed_tokens_total"),
		repaid:     fleetDelta(before, after, "ratelimit_fallback_repaid_tokens_total"),
		writtenOff: fleetDelta(before, after, "ratelimit_fallback_debt_written_off_tokens_total"),
		lost:       fleetDelta(before, after, "ratelimit_fallback_debt_lost_tokens_total"),
	}
	d := r.debts
	t.Logf("gateways: %.0f requests admitted by the fallback (%.0f tokens owed: %.0f repaid, %.0f written off, %.0f lost), %.0f Redis errors",
		r.fallback, d.owed, d.repaid, d.writtenOff, d.lost, r.redisErrs)
	if d.settled() > d.owed+1e-9 {
		t.Errorf("the fallbacks admitted %.0f tokens, but %.0f are counted as repaid, written off or lost: a debt was counted twice", d.owed, d.settled())
	}
}

func describeStates(m map[string][]State) string {
	var b strings.Builder
	for _, r := range sortedKeys(m) {
		fmt.Fprintf(&b, "\n  %s:", r)
		for _, s := range m[r] {
			fmt.Fprintf(&b, " [%s C=%d R=%g s=%.2f shards=%d -> %.0f + %.3f/s]", s.From.Format("15:04:05.000"), s.C, s.R, s.S, s.Shards, s.Capacity, s.Refill)
		}
	}
	return b.String()
}

func eventCounts(events []Event) string {
	n := map[string]int{}
	for _, e := range events {
		n[e.Kind.String()]++
	}
	keys := sortedKeys(n)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

func figuresTable(rows []row) string {
	var b strings.Builder
	b.WriteString("| run | events | requests | admitted (tokens) | by the fallback | fallback tokens owed / repaid | Redis errors | 5xx | unanswered | max admitted / bound, one region | worst window | max admitted / bound, regions together | quota: fleet / (B + slack) | quota slack: stale / postgres / fallback / restart / stopped | pass |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		worst := "-"
		if r.worst.Admitted > 0 {
			worst = fmt.Sprintf("%s %s, %.1f s: %d of %.1f", r.worst.Tenant[:max(0, strings.LastIndex(r.worst.Tenant, "-"))], r.worst.Region, r.worst.To.Sub(r.worst.From).Seconds(), r.worst.Admitted, r.worst.Bound)
		}
		quota, slack := "-", "-"
		if q := r.quota; q.Budget > 0 {
			quota = fmt.Sprintf("%d / (%d + %d) = %.3f", q.Admitted, q.Budget, q.Slack(), q.Ratio())
			slack = fmt.Sprintf("%d / %d / %d / %d / %d", q.Stale, q.Postgres, q.Fallback, q.Restart, q.Stopped)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.0f | %.0f / %.0f | %.0f | %d | %d | %.3f | %s | %.3f | %s | %s | %s |\n", r.name, r.events, r.sum.Requests, r.admitted, r.fallback, r.debts.owed, r.debts.repaid, r.redisErrs, r.sum.Status5xx, r.sum.ClientErrors,
			r.worst.Ratio(), worst, r.global.Ratio(), quota, slack, map[bool]string{true: "yes", false: "**no**"}[r.ok])
	}
	fmt.Fprintf(&b, "\nLoad average at the end: %s.\n", testenv.LoadAverage())
	return b.String()
}

// reliabilitySection is the generated section of docs/reliability.md that -update
// rewrites (internal/gendoc).
const reliabilitySection = "torture"
