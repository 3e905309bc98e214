package faults

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/e2e/stack"
	"github.com/quotaplane/quotaplane/internal/gendoc"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the figures in docs/reliability.md")

// The bounds the faults are held to. The contract is a decision within the Redis
// timeout + 1 ms at the 99th percentile, and Redis decisions again within the breaker's
// interval after a fault. This 2-core machine is shared with other jobs (load average
// 4-8 while these figures were taken) and runs PostgreSQL, two Redis, four gateways,
// Prometheus, the rebalancer and the load generator besides: a process may wait tens of
// milliseconds for a CPU, and a breaker then trips on a timeout that no Redis caused.
// So the test asserts generous bounds that still catch a real regression (a request held
// by a stalled Redis for its read timeout, a breaker that never closes), and reports the
// measured p99, the fraction within timeout + 1 ms and the recovery time, which
// docs/reliability.md records.
const (
	LatencyBound   = 100 * time.Millisecond
	RecoveryBound  = 5 * BreakerOpenFor
	AdmissionSlack = 1.05
	faultHold      = 5 * time.Second
)

// fault is one scripted fault: run injects it, holds it, heals it and checks what is
// particular to it; the harness around it measures and checks the rest.
type fault struct {
	name string
	// region is the region whose Redis is hit ("" for none); restarts is how often it
	// comes back empty.
	region   string
	restarts int
	outage   time.Duration // how long the region's Redis admits nothing for certain
	// affected are the gateways whose latency is measured (nil: all running).
	affected []string
	run      func(t *testing.T, c *faultCase)
}

// faultCase is what a fault's run works with.
type faultCase struct {
	ctx    context.Context
	env    *Env
	load   *Load
	window *Window
	// recoverRegion, when set by run after the heal, is waited for (Redis decisions
	// again) and the time recorded.
	recoverRegion string
	notes         []string
}

func (c *faultCase) note(format string, args ...any) {
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
}

func hold(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func TestFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	began := time.Now()
	env, err := Start(ctx, Options{})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(env.Close)
	t.Logf("environment ready in %v", time.Since(began).Round(time.Second))
	east, west := env.Regions[0], env.Regions[1]
	eastGWs, westGWs := ids(env.GatewaysOf(east)), ids(env.GatewaysOf(west))

	baseline := directBaseline(t, ctx, env)
	var rows []row
	for _, f := range []fault{
		{name: "Redis killed 5 s, back empty", region: east, restarts: 1, outage: faultHold, affected: eastGWs, run: func(t *testing.T, c *faultCase) {
			must(t, env.Redis[east].Kill())
			hold(ctx, faultHold)
			must(t, env.Redis[east].Restart(ctx))
			c.recoverRegion = east
		}},
		{name: "Redis paused (SIGSTOP) 5 s", region: east, outage: faultHold, affected: eastGWs, run: func(t *testing.T, c *faultCase) {
			must(t, env.Redis[east].Pause())
			hold(ctx, faultHold)
			must(t, env.Redis[east].Resume())
			c.recoverRegion = east
		}},
		{name: "Redis restarted empty", region: east, restarts: 1, affected: eastGWs, run: func(t *testing.T, c *faultCase) {
			must(t, env.Redis[east].Restart(ctx))
			c.recoverRegion = east
		}},
		{name: "Redis slowed to 20 ms for 5 s (timeout 10 ms)", region: east, outage: faultHold, affected: eastGWs, run: func(t *testing.T, c *faultCase) {
			env.Proxies.Get(east).SetDelay(20 * time.Millisecond)
			hold(ctx, faultHold)
			env.Proxies.Get(east).SetDelay(0)
			c.recoverRegion = east
		}},
		{name: "PostgreSQL killed 5 s and restarted", run: func(t *testing.T, c *faultCase) { postgresKilled(t, c) }},
		{name: "NOTIFY lost (trigger off; LISTEN cut)", run: func(t *testing.T, c *faultCase) { notifyLost(t, c) }},
		{name: "Prometheus down 8 s", run: func(t *testing.T, c *faultCase) { prometheusDown(t, c) }},
		{name: "scrape gap for " + west + " 10 s", run: func(t *testing.T, c *faultCase) { scrapeGap(t, c, west) }},
		{name: "region " + west + " dark 8 s", affected: eastGWs, run: func(t *testing.T, c *faultCase) { regionDark(t, c, west, westGWs) }},
		{name: "gateway SIGTERM under load", run: func(t *testing.T, c *faultCase) { gatewayTerm(t, c, eastGWs[0]) }},
	} {
		var fig Figures
		var notes []string
		ok := t.Run(f.name, func(t *testing.T) { fig, notes = runFault(t, ctx, env, f) })
		rows = append(rows, row{fig: fig, notes: notes, ok: ok})
	}
	table := figuresTable(rows, baseline)
	t.Logf("total %v\n%s", time.Since(began).Round(time.Second), table)
	if *update {
		if err := gendoc.Rewrite("../../docs/reliability.md", reliabilitySection, fmt.Sprintf("Measured %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))+table); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(gs []*stack.Gateway) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.ID)
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// runFault runs one fault under load in a window and checks the contract.
func runFault(t *testing.T, ctx context.Context, env *Env, f fault) (Figures, []string) {
	before := readTables(t, ctx, env)
	load := env.StartLoad(ctx, 3*time.Minute)
	stopped := false
	defer func() {
		if !stopped {
			_, _ = load.Stop()
		}
	}()
	hold(ctx, 2*time.Second) // steady state first
	w, err := env.Begin(ctx, f.name, f.region, load.Live)
	if err != nil {
		t.Fatal(err)
	}
	w.RedisRestarts, w.Affected, w.Outage = f.restarts, f.affected, f.outage
	c := &faultCase{ctx: ctx, env: env, load: load, window: w}
	f.run(t, c)
	if c.recoverRegion != "" {
		took, err := env.WaitRedis(ctx, c.recoverRegion, 10*time.Second)
		if err != nil {
			t.Errorf("Redis decisions in %s did not resume: %v", c.recoverRegion, err)
		}
		w.Recovery = took
		if took > RecoveryBound {
			t.Errorf("Redis decisions resumed %v after the fault ended, want <= %v (breaker interval %v)", took.Round(time.Millisecond), RecoveryBound, BreakerOpenFor)
		}
	}
	hold(ctx, time.Second)
	env.End(ctx, w, load.Live)
	res, err := load.Stop()
	stopped = true
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	fig := env.Evaluate(w)
	t.Logf("%s: %v elapsed, codes %v, decisions %v, decision p99 %v (%.2f%% <= %v), hot admitted %d, limit %.0f (%.2fx), recovery %v",
		f.name, fig.Elapsed.Round(time.Millisecond), fig.Codes, fig.Decisions, fig.DecisionP99, 100*fig.WithinBound, env.Opts().RedisTimeout+time.Millisecond,
		fig.HotAdmitted, fig.HotLimit, fig.Ratio(), fig.Recovery.Round(time.Millisecond))
	if fig.Status5xx != 0 {
		t.Errorf("%d responses with status 5xx (codes %v)", fig.Status5xx, fig.Codes)
	}
	if fig.DecisionP99 > LatencyBound {
		t.Errorf("decision p99 %v > %v", fig.DecisionP99, LatencyBound)
	}
	if fig.SlowDecisions > 0 {
		c.note("%.0f decisions over 50 ms", fig.SlowDecisions)
	}
	if fig.Ratio() > AdmissionSlack {
		t.Errorf("hot tenant admitted %d = %.2f x the limit %.0f, want <= %.2f x", fig.HotAdmitted, fig.Ratio(), fig.HotLimit, AdmissionSlack)
	}
	if fig.Decisions["none"] != 0 {
		t.Errorf("%v requests let through undecided", fig.Decisions["none"])
	}
	after := readTables(t, ctx, env)
	for _, p := range Compare(before, after) {
		t.Error(p)
	}
	notes := c.notes
	notes = append(notes, clientLatency(res, f.affected))
	return fig, notes
}

// readTables reads the tables, retrying while a restarted PostgreSQL comes back.
func readTables(t *testing.T, ctx context.Context, env *Env) *Tables {
	t.Helper()
	var tab *Tables
	var err error
	for range 50 {
		if tab, err = env.ReadTables(ctx); err == nil {
			return tab
		}
		hold(ctx, 200*time.Millisecond)
	}
	t.Fatalf("read tables: %v", err)
	return nil
}

// clientLatency summarises the load's client-side p99 over the affected gateways.
func clientLatency(res []loadgen.Result, affected []string) string {
	var worst time.Duration
	for _, r := range res {
		keep := len(affected) == 0
		for _, a := range affected {
			keep = keep || strings.HasPrefix(r.Name, a+"/")
		}
		if keep && r.P99 > worst {
			worst = r.P99
		}
	}
	return fmt.Sprintf("client p99 (worst stream, whole run) %v", worst.Round(10*time.Microsecond))
}

// directBaseline is the client-side p99 of the echo upstream without a gateway, at the
// load's total rate, for comparison with the client p99 through the gateways.
func directBaseline(t *testing.T, ctx context.Context, env *Env) time.Duration {
	o := env.Opts()
	rate := (o.HotRate + o.CalmRate) * float64(len(env.Gateways))
	res, err := loadgen.Run(ctx, []loadgen.Stream{{Name: "direct", Method: http.MethodPost, URL: env.Upstream + "/orders", Rate: loadgen.Constant(rate)}}, 3*time.Second, nil)
	if err != nil || len(res) != 1 {
		t.Fatalf("baseline: %v", err)
	}
	t.Logf("upstream direct at %.0f/s: p50 %v p99 %v", rate, res[0].P50, res[0].P99)
	return res[0].P99
}

func postgresKilled(t *testing.T, c *faultCase) {
	env, ctx := c.env, c.ctx
	before := map[string]float64{}
	for _, g := range env.Gateways {
		s, err := ScrapeURL(ctx, g.Admin)
		must(t, err)
		before[g.ID] = s.Sum("ratelimit_rule_reload_errors_total")
	}
	must(t, env.Postgres.Kill())
	hold(ctx, faultHold)
	failing := 0
	for _, g := range env.Gateways {
		if s, err := ScrapeURL(ctx, g.Admin); err == nil && s.Sum("ratelimit_rule_reload_errors_total") > before[g.ID] {
			failing++
		}
	}
	c.note("%d of %d gateways counted failed reloads while PostgreSQL was down and kept serving", failing, len(env.Gateways))
	healed := time.Now()
	must(t, env.Postgres.Restart(ctx))
	// Every gateway loads a snapshot again.
	err := waitUntil(ctx, ReloadInterval+5*time.Second, func() bool {
		for _, g := range env.Gateways {
			s, err := ScrapeURL(ctx, g.Admin)
			if err != nil || s.Sum("ratelimit_rules_last_reload_success_timestamp_seconds") < float64(healed.Unix()) {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Errorf("gateways did not reload after PostgreSQL came back: %v", err)
	}
	c.note("every gateway reloaded %v after PostgreSQL was restarted", time.Since(healed).Round(100*time.Millisecond))
}

// calmLimit is the calm tenant's regional capacity in region per the database now.
func calmLimit(t *testing.T, ctx context.Context, env *Env, region string) string {
	t.Helper()
	snap, err := env.Store.LoadSnapshot(ctx, 3*time.Second)
	must(t, err)
	_, lim, _ := snap.RegionalRule(region, CalmTenant, stack.Route)
	return fmt.Sprint(lim.Capacity)
}

// converge waits until every gateway answers the calm tenant with its region's capacity
// from the database, and returns how long that took.
func converge(t *testing.T, c *faultCase, what string) time.Duration {
	t.Helper()
	env, ctx := c.env, c.ctx
	want := map[string]string{}
	for _, r := range env.Regions {
		want[r] = calmLimit(t, ctx, env, r)
	}
	start := time.Now()
	err := waitUntil(ctx, ReloadInterval+5*time.Second, func() bool {
		for _, g := range env.Gateways {
			if env.limitHeader(ctx, g, CalmTenant) != want[g.Region] {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	if err != nil {
		t.Errorf("%s: gateways did not converge on the calm tenant's new limit %v: %v", what, want, err)
	}
	return took
}

// notifyLost makes two changes whose NOTIFY no gateway hears: one with the notify trigger
// disabled (only the reload timer can find it), and one right after the gateways'
// LISTEN connections were cut (the reconnect reloads). The rebalancer is paused so that
// no other change's NOTIFY makes the gateways reload.
func notifyLost(t *testing.T, c *faultCase) {
	env, ctx := c.env, c.ctx
	must(t, env.Rebalancer.Pause())
	defer func() { must(t, env.Rebalancer.Resume()) }()
	pool := env.Store.Pool()
	setCalm := func(capacity int) string {
		return fmt.Sprintf(`UPDATE rate_limit_rule SET capacity = %d WHERE tenant_id = '%s' AND route_id = '%s'`, capacity, CalmTenant, stack.Route)
	}
	_, err := pool.Exec(ctx, `BEGIN; ALTER TABLE rate_limit_rule DISABLE TRIGGER rate_limit_rule_notify; `+setCalm(800)+
		`; ALTER TABLE rate_limit_rule ENABLE TRIGGER rate_limit_rule_notify; COMMIT`)
	must(t, err)
	took := converge(t, c, "change without NOTIFY")
	c.note("a change made with the NOTIFY trigger disabled reached every gateway in %v (reload_interval %v)", took.Round(100*time.Millisecond), ReloadInterval)
	// The timer fires within reload_interval; the rest is a load and the polling, which
	// a starved machine stretches (the figure is reported).
	if took > ReloadInterval+3*time.Second {
		t.Errorf("change without NOTIFY took %v, want <= reload_interval %v + 3 s", took, ReloadInterval)
	}

	var cut int
	must(t, pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = 'quotaplane' AND query ILIKE 'listen%'`).Scan(&cut))
	_, err = pool.Exec(ctx, setCalm(400))
	must(t, err)
	took = converge(t, c, "change while LISTEN was cut")
	c.note("%d LISTEN connections cut, a change made at once reached every gateway in %v", cut, took.Round(100*time.Millisecond))
	if cut < len(env.Gateways) {
		t.Errorf("cut %d LISTEN connections, want one per gateway (%d)", cut, len(env.Gateways))
	}
}

// rebalancerRuns reads the rebalancer's runs and checks by result.
func rebalancerRuns(t *testing.T, ctx context.Context, env *Env, result string) float64 {
	t.Helper()
	s, err := ScrapeURL(ctx, env.RebalancerAdmin)
	must(t, err)
	return s.Sum("ratelimit_rebalancer_runs_total", "result", result) + s.Sum("ratelimit_rebalancer_checks_total", "result", result)
}

func prometheusDown(t *testing.T, c *faultCase) {
	env, ctx := c.env, c.ctx
	skipped := rebalancerRuns(t, ctx, env, "skipped_prometheus")
	shares := readTables(t, ctx, env).Shares
	must(t, env.Prometheus.Stop())
	hold(ctx, 2*env.Opts().RebalanceInterval)
	n := rebalancerRuns(t, ctx, env, "skipped_prometheus") - skipped
	after := readTables(t, ctx, env).Shares
	must(t, env.Prometheus.Restart(ctx))
	c.note("rebalancer skipped %v runs/checks for Prometheus and kept every share", n)
	if n < 1 {
		t.Errorf("no rebalancer run or check was skipped for Prometheus while it was down")
	}
	if fmt.Sprint(shares) != fmt.Sprint(after) {
		t.Errorf("shares changed while Prometheus was down:\n before %v\n after  %v", shares, after)
	}
}

func scrapeGap(t *testing.T, c *faultCase, region string) {
	env, ctx := c.env, c.ctx
	var jobs = env.ScrapeJobs()
	var gap = env.ScrapeJobs()
	for i := range gap {
		var groups []testenv.TargetGroup
		for _, g := range gap[i].Groups {
			if g.Labels["region"] != region {
				groups = append(groups, g)
			}
		}
		gap[i].Groups = groups
	}
	must(t, env.Prometheus.SetJobs(ctx, gap))
	// The first run after the gap may still see the region's last samples; from one
	// interval on, the region is unknown and its shares must stay as they are.
	iv := env.Opts().RebalanceInterval
	hold(ctx, iv+time.Second)
	ok := rebalancerRuns(t, ctx, env, "ok")
	shares := regionShares(readTables(t, ctx, env).Shares, region)
	hold(ctx, 2*iv)
	after := regionShares(readTables(t, ctx, env).Shares, region)
	runs := rebalancerRuns(t, ctx, env, "ok") - ok
	must(t, env.Prometheus.SetJobs(ctx, jobs))
	c.note("%v rebalancer runs/checks during the gap; %s's shares kept: %v", runs, region, after)
	if runs < 1 {
		t.Errorf("the rebalancer did not run during the scrape gap")
	}
	if fmt.Sprint(shares) != fmt.Sprint(after) {
		t.Errorf("%s's shares changed during its scrape gap:\n before %v\n after  %v", region, shares, after)
	}
}

func regionShares(all map[string]float64, region string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range all {
		if strings.HasSuffix(k, "|"+region) {
			out[k] = v
		}
	}
	return out
}

func regionDark(t *testing.T, c *faultCase, region string, gws []string) {
	env, ctx := c.env, c.ctx
	var wg sync.WaitGroup
	for _, id := range gws {
		must(t, c.load.Route(id, false))
	}
	for _, id := range gws {
		wg.Go(func() {
			if err := env.Gateway(id).Process.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// The rebalancer sees no live gateway and shrinks the region to the floor in the
	// scopes it manages (the calm tenant's; the hot one is pinned by an override).
	var share float64
	err := waitUntil(ctx, 8*time.Second, func() bool {
		snap, err := env.Store.LoadSnapshot(ctx, 3*time.Second)
		if err != nil {
			return false
		}
		share, _ = snap.Share(region, CalmTenant, stack.Route)
		return share <= 0.05+1e-9
	})
	if err != nil {
		t.Errorf("%s dark: its share of the calm tenant is %v, want the floor 0.05: %v", region, share, err)
	}
	c.note("%s dark: the rebalancer moved its share of the calm tenant to the floor %.2f", region, share)
	hold(ctx, 8*time.Second)
	for _, id := range gws {
		wg.Go(func() {
			if err := env.Gateway(id).Process.Restart(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, id := range gws {
		must(t, c.load.Route(id, true))
	}
}

// gatewayTerm sends SIGTERM to one gateway while slow requests it admitted are in flight
// through it: every one of them completes. A probe the gateway refuses (a 429: on a loaded
// machine a Redis call can time out, and a failed call is refused) is sent again before
// the signal, so what the drain is judged on is eight admitted requests, not the limiter.
func gatewayTerm(t *testing.T, c *faultCase, id string) {
	env, ctx := c.env, c.ctx
	g := env.Gateway(id)
	const (
		slow     = 8
		attempts = 40
		delay    = 4 * time.Second
	)
	var signalled atomic.Bool
	codes := make(chan int, slow)
	send := func() int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/orders?delay_ms=%d", g.URL, delay.Milliseconds()), nil)
		req.Header.Set("X-Api-Key", env.Keys[CalmTenant])
		resp, err := probeClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range slow {
		go func() {
			code := send()
			for i := 1; i < attempts && code == http.StatusTooManyRequests && !signalled.Load(); i++ {
				hold(ctx, 25*time.Millisecond)
				code = send()
			}
			codes <- code
		}()
	}
	// Signal once all eight are with the upstream (or after 2 s, and the count says why).
	err := waitUntil(ctx, 2*time.Second, func() bool { return env.UpstreamDelayed() >= slow })
	inFlight := env.UpstreamDelayed()
	must(t, c.load.Route(id, false))
	signalled.Store(true)
	start := time.Now()
	must(t, g.Process.Stop())
	stopped := time.Since(start)
	got := map[int]int{}
	for range slow {
		got[<-codes]++
	}
	c.note("SIGTERM with %d admitted slow requests in flight: %v; exited after %v", inFlight, got, stopped.Round(10*time.Millisecond))
	if err != nil {
		t.Errorf("only %d of %d slow requests were admitted and in flight before SIGTERM: %v", inFlight, slow, err)
	}
	if got[200] != slow {
		t.Errorf("in-flight requests through the stopped gateway: %v, want %d x 200", got, slow)
	}
	must(t, g.Process.Restart(ctx))
	must(t, c.load.Route(id, true))
}

type row struct {
	fig   Figures
	notes []string
	ok    bool
}

func figuresTable(rows []row, baseline time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| fault | window | requests | 5xx | refused conn. | fallback decisions | decision p99 | <= timeout + 1 ms | hot admitted | limit | admitted / limit | recovery | pass |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		f := r.fig
		rec := "-"
		if f.Recovery > 0 {
			rec = f.Recovery.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s | %v | %d | %d | %d | %.0f | %v | %.2f%% | %d | %.0f | %.2f | %s | %s |\n",
			f.Fault, f.Elapsed.Round(100*time.Millisecond), f.Requests, f.Status5xx, f.Codes[0], f.Decisions["fallback"],
			f.DecisionP99.Round(10*time.Microsecond), 100*f.WithinBound, f.HotAdmitted, f.HotLimit, f.Ratio(), rec,
			map[bool]string{true: "yes", false: "**no**"}[r.ok])
	}
	b.WriteString("\nNotes per fault:\n\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "- **%s**: ", r.fig.Fault)
		b.WriteString(strings.Join(r.notes, "; "))
		b.WriteString(".\n")
	}
	fmt.Fprintf(&b, "\nUpstream direct, client p99 at the same total rate: %v. Load average at the end: %s.\n", baseline.Round(10*time.Microsecond), testenv.LoadAverage())
	return b.String()
}

// reliabilitySection is the generated section of docs/reliability.md that -update
// rewrites (internal/gendoc).
const reliabilitySection = "faults"
