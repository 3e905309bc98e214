package job_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// randomSeeds is how many seeds TestRandomInterleavings draws: 3 in `go test`, more with
// QUOTAPLANE_RANDOM_SEEDS=N; QUOTAPLANE_RANDOM_SEED=S replays one.
func randomSeeds(t *testing.T) []uint64 {
	if s := os.Getenv("QUOTAPLANE_RANDOM_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("QUOTAPLANE_RANDOM_SEED=%q: %v", s, err)
		}
		return []uint64{v}
	}
	n := 3
	if s := os.Getenv("QUOTAPLANE_RANDOM_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("QUOTAPLANE_RANDOM_SEEDS=%q: want a count", s)
		}
		n = v
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(1000 + i)
	}
	return seeds
}

// replica is one rebalancer process: its elector and its job, whose tick can be stalled
// between its decreases and its increases.
type replica struct {
	name  string
	el    *job.Elector
	j     *job.Job
	stall chan chan chan struct{} // armed: the next tick reports here at the hook and waits
}

// TestRandomInterleavings draws seeded schedules of rebalancer runs and checks (two
// replicas, each possibly stalled between its writes while other things happen: its lock
// session killed, the other replica running, regions added or removed, overrides set or
// cleared, or its session timing out as a SIGSTOPped process's would), region add and
// remove, and overrides with and without expiry. After every step no scope sums above 1
// and every region has a row in every scope with rows; after the leader's next check,
// every scope sums to 1. A failure names its seed (QUOTAPLANE_RANDOM_SEED replays it).
//
// Issue 22: every region also runs a gateway's snapshot Reloader (LISTEN/NOTIFY and a
// timer, as a gateway does), and the schedule draws partitions of one gateway from
// PostgreSQL across an override's expiry, and gateway restarts (a clean stop, a new
// instance). The shares the gateways enforce (their snapshots, not the rows) must sum to
// at most 1 + 1e-9 once every gateway that can reach PostgreSQL has reloaded, and at
// every instant across an expiry with one gateway cut off (docs/rebalancer.md "Shares in
// a partition": the transition; no share write happens while it is cut off, the case
// the docs name as not covered).
func TestRandomInterleavings(t *testing.T) {
	t.Parallel()
	steps := 30
	if os.Getenv("QUOTAPLANE_RANDOM_SEEDS") != "" {
		steps = 60
	}
	for _, seed := range randomSeeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			runSchedule(t, seed, steps)
		})
	}
}

func runSchedule(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 17))
	allRegions := []string{"us-east", "eu-west", "ap-south", "sa-east"}
	w := newWorld(t, allRegions[:3]...)
	ctx := store.WithAudit(t.Context(), "test", "random")
	var log []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (replay: QUOTAPLANE_RANDOM_SEED=%d go test -run TestRandomInterleavings ./rebalancer/job/): "+format+"\nsteps:\n  %s",
			append(append([]any{seed, seed}, args...), strings.Join(log, "\n  "))...)
	}
	step := func(format string, args ...any) { log = append(log, fmt.Sprintf(format, args...)) }

	const sessionTimeout = 1500 * time.Millisecond
	mk := func(name string) *replica {
		el, err := job.NewElector(job.ElectorConfig{DatabaseURL: w.url, Timeout: 3 * time.Second, SessionTimeout: sessionTimeout, Holder: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = el.Close() })
		r := &replica{name: name, el: el, stall: make(chan chan chan struct{}, 1)}
		r.j = w.job(t, nil, func(c *job.Config) {
			c.Elector, c.Actor = el, "rebalancer-"+name
			c.Hook = func(ctx context.Context, p string) {
				if p != job.HookDecreasesWritten {
					return
				}
				select {
				case reached := <-r.stall:
					resume := make(chan struct{})
					reached <- resume
					select {
					case <-resume:
					case <-ctx.Done():
					}
				default:
				}
			}
		})
		return r
	}
	reps := []*replica{mk("a"), mk("b")}

	// The gateways: one snapshot Reloader per region, which a partition cuts off.
	type gateway struct {
		region string
		id     string
		rl     *store.Reloader
		cut    atomic.Bool
		stop   context.CancelFunc
		done   chan struct{}
	}
	gws := map[string]*gateway{}
	gwSeq := 0
	startGateway := func(region string) {
		gwSeq++
		g := &gateway{region: region, id: fmt.Sprintf("gw-%s-%d", region, gwSeq), done: make(chan struct{})}
		g.rl = store.NewReloader(store.ReloaderOptions{ListenURL: w.url, Interval: 300 * time.Millisecond,
			Load: func(ctx context.Context) (*regions.Snapshot, error) {
				if g.cut.Load() {
					return nil, errors.New("partitioned from postgresql")
				}
				return w.store.LoadSnapshot(ctx, 0)
			}})
		gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		g.stop = cancel
		go func() {
			defer close(g.done)
			_ = g.rl.Run(gctx)
		}()
		if err := w.store.Heartbeat(ctx, g.id, region); err != nil {
			t.Fatal(err)
		}
		gws[region] = g
	}
	stopGateway := func(region string) {
		g := gws[region]
		if g == nil {
			return
		}
		g.stop()
		<-g.done
		if err := w.store.RemoveInstance(ctx, g.id); err != nil {
			t.Fatal(err)
		}
		delete(gws, region)
	}
	t.Cleanup(func() {
		for _, g := range gws {
			g.stop()
			<-g.done
		}
	})
	for _, r := range allRegions[:3] {
		startGateway(r)
	}
	// enforced is what the gateways enforce for tenant (their snapshots), summed over the
	// regions they serve, and whether every gateway has a snapshot.
	enforced := func(tenant string) (float64, bool) {
		sum := 0.0
		for r, g := range gws {
			snap := g.rl.Current()
			if snap == nil {
				return 0, false
			}
			v, _ := snap.Share(r, tenant, "x")
			sum += v
		}
		return sum, true
	}
	// quiesce waits until every gateway that can reach PostgreSQL has loaded a snapshot
	// taken after now (database clock), then checks what the gateways enforce.
	quiesce := func(when string) {
		t.Helper()
		now, err := w.store.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for _, g := range gws {
			for !g.cut.Load() {
				if s := g.rl.Current(); s != nil && !s.LoadedAt().Before(now) {
					break
				}
				if time.Now().After(deadline) {
					fail("%s: gateway %s has not reloaded within 5 s", when, g.id)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		for _, tenant := range []string{"other", "shop-a"} {
			if sum, ok := enforced(tenant); ok && sum > 1+1e-9 {
				fail("%s: the gateways enforce %v for tenant %s (above 1)", when, sum, tenant)
			}
		}
	}

	current := func() []string {
		names, err := w.store.Regions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	setDemand := func() {
		d := map[string]float64{}
		for _, r := range current() {
			d[r] = float64(1 + rng.IntN(100))
		}
		w.dem.set(d)
	}
	// tick runs one tick of rep if it leads (as its scheduler would); when stallWith is
	// not nil and the tick gets to its increases, stallWith runs while it waits there.
	tick := func(rep *replica, full bool, stallWith func()) {
		if err := rep.el.IsLeader(ctx); err != nil {
			step("%s: not leader", rep.name)
			return
		}
		setDemand()
		reached := make(chan chan struct{}, 1)
		if stallWith != nil {
			rep.stall <- reached
		}
		done := make(chan job.Report, 1)
		go func() {
			var rep1 job.Report
			if full {
				rep1, _ = rep.j.RunOnce(ctx)
			} else {
				rep1, _ = rep.j.Check(ctx)
			}
			done <- rep1
		}()
		var res job.Report
		select {
		case resume := <-reached:
			step("%s: stalled between its writes (epoch %d)", rep.name, rep.el.Epoch())
			stallWith()
			close(resume)
			res = <-done
		case res = <-done:
			select { // not stalled: disarm
			case <-rep.stall:
			default:
			}
		}
		step("%s: %s -> %s %v", rep.name, res.Kind, res.Result, res.Err)
	}
	killSession := func(rep *replica) {
		var n int
		if err := w.store.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		step("killed the lock holder's session (%d)", n)
	}
	addRegion := func() {
		cur := current()
		var free []string
		for _, r := range allRegions {
			if !slices.Contains(cur, r) {
				free = append(free, r)
			}
		}
		if len(free) == 0 {
			return
		}
		r := free[rng.IntN(len(free))]
		if err := w.store.AddRegion(ctx, r); err != nil {
			fail("add region %s: %v", r, err)
		}
		if err := w.store.Heartbeat(ctx, "gw-"+r, r); err != nil {
			t.Fatal(err)
		}
		startGateway(r)
		step("added region %s", r)
	}
	removeRegion := func() {
		cur := current()
		if len(cur) <= 2 {
			return
		}
		r := cur[rng.IntN(len(cur))]
		if err := w.store.RemoveRegion(ctx, r, store.DropShares); err != nil {
			fail("remove region %s: %v", r, err)
		}
		stopGateway(r)
		if _, err := w.store.Pool().Exec(ctx, `DELETE FROM gateway_instance WHERE region = $1`, r); err != nil {
			t.Fatal(err)
		}
		step("removed region %s", r)
	}
	scopes := []regions.Scope{regions.GlobalScope, {Tenant: "shop-a", Route: regions.Wildcard}}
	setOverride := func() {
		sc := scopes[rng.IntN(len(scopes))]
		cur := current()
		split := map[string]float64{}
		sum := 0.0
		for _, r := range cur {
			v := rng.Float64()
			split[r], sum = v, sum+v
		}
		for r := range split {
			split[r] /= sum
		}
		// Make them sum to 1 exactly enough for ValidateShares.
		ttl := []time.Duration{0, 400 * time.Millisecond, time.Hour}[rng.IntN(3)]
		err := w.store.SetOverride(ctx, sc, split, "op", "random", ttl)
		if err != nil {
			fail("set override %s %v: %v", sc, split, err)
		}
		step("override %s = %v ttl %v", sc, split, ttl)
	}
	clearOverride := func() {
		sc := scopes[rng.IntN(len(scopes))]
		if err := w.store.ClearOverride(ctx, sc, "op", "random"); err != nil {
			fail("clear override %s: %v", sc, err)
		}
		step("cleared override %s", sc)
	}

	// sums checks the invariant; exact demands every scope at 1, else only never above.
	sums := func(when string, exact bool) {
		t.Helper()
		snap, err := w.store.LoadSnapshot(ctx, 0)
		if err != nil {
			fail("%s: load: %v", when, err)
		}
		regs := snap.Regions()
		for _, who := range [][2]string{{"other", "x"}, {"shop-a", "x"}} {
			sum := 0.0
			for _, r := range regs {
				v, _ := snap.Share(r, who[0], who[1])
				sum += v
			}
			// An override within regions.ExpiryGrace of its expiry enforces the lower of
			// itself and its replacement: the scope may sum below 1 until it has ended.
			if sum > 1+1e-9 || exact && !snap.InTransition() && math.Abs(sum-1) > 1e-9 {
				fail("%s: tenant %s's shares over %v sum to %v", when, who[0], regs, sum)
			}
		}
		rows, err := w.store.Shares(ctx)
		if err != nil {
			t.Fatal(err)
		}
		has := map[string]map[string]bool{}
		for _, sh := range rows {
			k := sh.Scope.String() + " " + string(sh.Source)
			if has[k] == nil {
				has[k] = map[string]bool{}
			}
			has[k][sh.Region] = true
		}
		for k, got := range has {
			for _, r := range regs {
				if !got[r] {
					fail("%s: %s has no row for region %s (rows %v)", when, k, r, got)
				}
			}
		}
	}
	// settle lets the leader (whichever replica leads) run a check, which heals a scope a
	// refused increase left below 1.
	settle := func() {
		for _, rep := range reps {
			if rep.el.IsLeader(ctx) == nil {
				tick(rep, false, nil)
				return
			}
		}
		step("settle: no leader")
	}

	other := func(rep *replica) *replica {
		if rep == reps[0] {
			return reps[1]
		}
		return reps[0]
	}
	inner := func(rep *replica) func() {
		return func() {
			switch rng.IntN(6) {
			case 0: // the classic split brain: session killed, the other runs
				killSession(rep)
				tick(other(rep), true, nil)
			case 1:
				addRegion()
			case 2:
				removeRegion()
			case 3:
				setOverride()
			case 4:
				clearOverride()
			case 5: // stopped past the session timeout (SIGSTOP): the other takes over
				time.Sleep(sessionTimeout + 300*time.Millisecond)
				step("%s stalled past the session timeout", rep.name)
				tick(other(rep), true, nil)
			}
		}
	}

	// partitionAcrossExpiry sets an override with a TTL, waits until every gateway
	// enforces it, cuts one gateway off PostgreSQL, and watches what the gateways enforce
	// until the override has ended everywhere (transition included), then heals the cut.
	partitionAcrossExpiry := func() {
		cur := current()
		sc := scopes[rng.IntN(len(scopes))]
		split := map[string]float64{}
		big := cur[rng.IntN(len(cur))]
		for _, r := range cur {
			split[r] = 0.1 / float64(len(cur)-1)
		}
		split[big] = 0.9
		ttl := regions.ExpiryGrace + time.Duration(500+rng.IntN(1000))*time.Millisecond
		if err := w.store.SetOverride(ctx, sc, split, "op", "incident", ttl); err != nil {
			fail("set override %s %v: %v", sc, split, err)
		}
		set := time.Now()
		quiesce("override set before the partition")
		victim := cur[rng.IntN(len(cur))]
		g := gws[victim]
		g.cut.Store(true)
		step("override %s = %v ttl %v; gateway of %s cut off", sc, split, ttl, victim)
		tenant := "other"
		if sc.Tenant == "shop-a" {
			tenant = "shop-a"
		}
		worst := 0.0
		for time.Since(set) < ttl+regions.ExpiryGrace+500*time.Millisecond {
			sum, _ := enforced(tenant)
			worst = max(worst, sum)
			if sum > 1+1e-9 {
				fail("%v into the override, gateway of %s cut off: the gateways enforce %v for %s", time.Since(set).Round(time.Millisecond), victim, sum, tenant)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// It ends the override on its own clock (a loaded machine may run its timer late:
		// up to 2 s more; the sum above was checked all along).
		for {
			snap := g.rl.Current()
			if _, src := snap.Share(victim, tenant, "x"); src != regions.SourceOverride {
				break
			}
			if time.Since(set) > ttl+regions.ExpiryGrace+2500*time.Millisecond {
				fail("gateway of %s (cut off) still enforces the override %v after it was set with ttl %v", victim, time.Since(set), ttl)
			}
			time.Sleep(10 * time.Millisecond)
		}
		g.cut.Store(false)
		step("gateway of %s back (max enforced sum %.6f)", victim, worst)
	}
	restartGateway := func() {
		cur := current()
		r := cur[rng.IntN(len(cur))]
		stopGateway(r)
		startGateway(r)
		step("gateway of %s restarted", r)
	}

	for i := range steps {
		rep := reps[rng.IntN(2)]
		if k := rng.IntN(12); k == 0 {
			partitionAcrossExpiry()
		} else if k == 1 {
			restartGateway()
		}
		switch k := rng.IntN(10); {
		case k < 3:
			tick(rep, true, nil)
		case k < 4:
			tick(rep, false, nil)
		case k < 6:
			tick(rep, true, inner(rep))
		case k < 7:
			addRegion()
		case k < 8:
			removeRegion()
		case k < 9:
			setOverride()
		default:
			if rng.IntN(2) == 0 {
				clearOverride()
			} else {
				killSession(rep)
			}
		}
		sums(fmt.Sprintf("after step %d", i), false)
		quiesce(fmt.Sprintf("after step %d", i))
		settle()
		sums(fmt.Sprintf("after step %d and a check", i), true)
		quiesce(fmt.Sprintf("after step %d and a check", i))
	}
	if testing.Verbose() {
		t.Logf("seed %d steps:\n  %s", seed, strings.Join(log, "\n  "))
	}
}
