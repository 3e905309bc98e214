package torture

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// Kind is the kind of a scheduled event.
type Kind int

// The event kinds. Faults run one at a time on the fault track; what operators do to the
// fleet runs one at a time on the fleet track, each during or right after a Redis fault
// of its region; changes run on the change track, which keeps clear of PostgreSQL
// outages (a write needs the database).
const (
	RedisStall     Kind = iota + 1 // SIGSTOP a region's Redis for Hold, then SIGCONT
	RedisKill                      // SIGKILL a region's Redis, restart it empty after Hold
	BlackHole                      // the proxy between one gateway and its Redis accepts and never answers, for Hold
	Latency                        // that proxy holds every reply for Delay, for Hold
	PostgresKill                   // SIGKILL PostgreSQL, restart it after Hold
	RedisEvicting                  // CONFIG SET an evicting maxmemory-policy on a region's Redis for Hold; its gateways must say so
	GatewayRestart                 // take a gateway out of the load, SIGTERM it, start it, put it back
	GatewayKill                    // the same with SIGKILL (a crash-looping pod): what it owes dies with it
	RollingRestart                 // restart every gateway of a region one after the other, twice round
	ScaleOut                       // start gateways in a region until it has Gateways of them
	ScaleIn                        // stop the gateways the last ScaleOut started in a region
	RegionRemove                   // stop a region's gateways, remove the region, add it back after Hold, start them
	RuleChange                     // set a tenant's capacity and refill
	ShardChange                    // set a tenant's rule's shard count
	ShareSet                       // set a tenant's share override (shares sum to 1)
	ShareClear                     // clear a tenant's share override
	RuleRefused                    // try a rule beyond the bounds (Capacity, Refill): refused by the store and the database, nothing changes
	RuleDelete                     // delete a tenant's own rule for its route: its larger tenant-wide rule applies
)

var kindNames = map[Kind]string{
	RedisStall: "redis-stall", RedisKill: "redis-kill", BlackHole: "black-hole", Latency: "latency",
	PostgresKill: "postgres-kill", RedisEvicting: "redis-evicting",
	GatewayRestart: "gateway-restart", GatewayKill: "gateway-kill", RollingRestart: "rolling-restart",
	ScaleOut: "scale-out", ScaleIn: "scale-in", RegionRemove: "region-remove",
	RuleChange: "rule-change", ShardChange: "shard-change", ShareSet: "share-set", ShareClear: "share-clear",
	RuleRefused: "rule-refused", RuleDelete: "rule-delete",
}

func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Fault reports whether k runs on the fault track.
func (k Kind) Fault() bool { return k >= RedisStall && k <= RedisEvicting }

// Fleet reports whether k runs on the fleet track.
func (k Kind) Fleet() bool { return k >= GatewayRestart && k <= RegionRemove }

// redisFault reports whether k makes a region's Redis (or one gateway's way to it) fail.
func (k Kind) redisFault() bool { return k >= RedisStall && k <= Latency }

// Event is one scheduled fault, fleet event or change, At after the schedule's start.
type Event struct {
	At   time.Duration
	Kind Kind
	// Hold is how long a fault lasts (RedisStall, RedisKill, BlackHole, Latency,
	// PostgresKill, RedisEvicting), and how long a region stays removed (RegionRemove).
	Hold time.Duration
	// Region is the region of a Redis fault, of RedisEvicting and of a fleet event;
	// Gateway the gateway id (BlackHole, Latency, GatewayRestart, GatewayKill); Tenant the
	// tenant of a change.
	Region, Gateway, Tenant string
	Delay                   time.Duration // Latency
	Capacity                int64         // RuleChange, RuleRefused
	Refill                  float64       // RuleChange, RuleRefused
	Shards                  int           // ShardChange
	Shares                  map[string]float64
	Gateways                int // ScaleOut: the region's gateways after it
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%6.2fs %-15s", e.At.Seconds(), e.Kind)
	switch e.Kind {
	case RedisStall, RedisKill, RedisEvicting, RegionRemove:
		fmt.Fprintf(&b, " region=%s hold=%v", e.Region, e.Hold)
	case BlackHole:
		fmt.Fprintf(&b, " gateway=%s hold=%v", e.Gateway, e.Hold)
	case Latency:
		fmt.Fprintf(&b, " gateway=%s delay=%v hold=%v", e.Gateway, e.Delay, e.Hold)
	case PostgresKill:
		fmt.Fprintf(&b, " hold=%v", e.Hold)
	case GatewayRestart, GatewayKill:
		fmt.Fprintf(&b, " gateway=%s", e.Gateway)
	case RollingRestart, ScaleIn:
		fmt.Fprintf(&b, " region=%s", e.Region)
	case ScaleOut:
		fmt.Fprintf(&b, " region=%s gateways=%d", e.Region, e.Gateways)
	case RuleChange, RuleRefused:
		fmt.Fprintf(&b, " tenant=%s capacity=%d refill=%g", e.Tenant, e.Capacity, e.Refill)
	case ShardChange:
		fmt.Fprintf(&b, " tenant=%s shards=%d", e.Tenant, e.Shards)
	case ShareSet:
		keys := make([]string, 0, len(e.Shares))
		for k := range e.Shares {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&b, " tenant=%s", e.Tenant)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%.2f", k, e.Shares[k])
		}
	case ShareClear, RuleDelete:
		fmt.Fprintf(&b, " tenant=%s", e.Tenant)
	}
	return b.String()
}

// TenantSpec is a tenant's starting rule; changes scale it.
type TenantSpec struct {
	ID       string
	Capacity int64
	Refill   float64
	// Keep: its rule is never deleted (a rule at the bounds must stay at the bounds).
	Keep bool
	// Banded: its rule has bands, which a sharded rule cannot have: its shard changes
	// are drawn as rule changes.
	Banded bool
}

// GatewaySpec names a gateway and its region.
type GatewaySpec struct{ ID, Region string }

// ScheduleConfig is what a schedule is drawn over.
type ScheduleConfig struct {
	Length   time.Duration // the schedule's span (events start within it)
	Regions  []string
	Gateways []GatewaySpec // the gateways the stack runs at the start
	Tenants  []TenantSpec
	// ChangeGap is the mean time between changes (default 5s).
	ChangeGap time.Duration
	// PostgresMargin keeps changes this far from a PostgreSQL kill (default 7s: a
	// reload interval and a second), so that no change waits in the database for a
	// gateway that cannot reload: the reload lag stays one reload.
	PostgresMargin time.Duration
	// ScaleTo is how many gateways a region has after a scale-out (default 5).
	ScaleTo int
}

// Schedule is a seed's events, sorted by At.
type Schedule struct {
	Seed   uint64
	Length time.Duration
	Events []Event
}

func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "schedule seed=%d length=%v events=%d\n", s.Seed, s.Length, len(s.Events))
	for _, e := range s.Events {
		b.WriteString("  " + e.String() + "\n")
	}
	return b.String()
}

// Estimated durations of the fleet events on a loaded machine, to draw one fleet event
// after another (the executor runs them in order, however long each takes).
const (
	estRestart = 2 * time.Second // drain, SIGTERM or SIGKILL, start, ready
	estScale   = 3 * time.Second // start or stop the extra gateways
	estRegion  = 5 * time.Second // stop, remove, add, start (besides the hold)
)

// span is a stretch of schedule time.
type span struct{ from, to time.Duration }

// near reports whether at is within [from - before, to + after) of one of spans, and
// the end of that stretch.
func near(at time.Duration, spans []span, before, after time.Duration) (time.Duration, bool) {
	for _, d := range spans {
		if at > d.from-before && at < d.to+after {
			return d.to + after, true
		}
	}
	return at, false
}

// Generate draws the schedule of seed. It is a pure function of its arguments: the same
// seed and config give the same schedule, on every machine and Go version (math/rand/v2's
// PCG is specified).
//
// The fault track draws one fault at a time, 1-3 s apart. Two thirds of the Redis faults
// (stall, kill, black hole, latency) carry a fleet event of their region while the fleet
// track is free: a gateway restarted or killed, a rolling restart, a scale-out to ScaleTo
// gateways (the region's next fleet event is the scale-in back), or another region
// removed (its share goes to the faulted region) and added back. It starts while the
// fault lasts (an outage is then held until the fleet
// event is done, as an incident outlasts a rollout) or within 2 s after it ends. A third
// of the Redis stalls and kills come 0.5-2 s after a rule deletion (a tenant's own rule
// deleted, so its larger tenant-wide rule applies) and an unrelated change a second
// after it (any reload). The change track draws its other changes around them.
func Generate(seed uint64, cfg ScheduleConfig) Schedule {
	if cfg.ChangeGap <= 0 {
		cfg.ChangeGap = 5 * time.Second
	}
	if cfg.PostgresMargin <= 0 {
		cfg.PostgresMargin = 7 * time.Second
	}
	if cfg.ScaleTo <= 0 {
		cfg.ScaleTo = 5
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	dur := func(lo, hi time.Duration) time.Duration { // uniform, to 100 ms
		steps := int64((hi - lo) / (100 * time.Millisecond))
		return lo + time.Duration(rng.Int64N(steps+1))*100*time.Millisecond
	}
	s := Schedule{Seed: seed, Length: cfg.Length}
	base := map[string][]string{} // region -> its gateways at the start
	for _, g := range cfg.Gateways {
		base[g.Region] = append(base[g.Region], g.ID)
	}

	// The fault track, and the fleet events tied to its Redis faults.
	var pgDown, removed []span
	var deletes []time.Duration // rule deletions, before the Redis faults they precede
	scaled := map[string]bool{} // region -> scaled out, not back yet
	var fleetFree time.Duration // when the fleet track is free again
	other := func(region string) string {
		for {
			if r := pick(rng, cfg.Regions); r != region {
				return r
			}
		}
	}
	fleet := func(region string, at time.Duration) (Event, time.Duration, bool) {
		e := Event{At: at, Region: region}
		if scaled[region] {
			e.Kind = ScaleIn
			return e, estScale, true
		}
		switch k := rng.IntN(10); {
		case k < 2:
			e.Kind, e.Gateway = GatewayRestart, pick(rng, base[region])
			return e, estRestart, true
		case k < 3:
			e.Kind, e.Gateway = GatewayKill, pick(rng, base[region])
			return e, estRestart, true
		case k < 5:
			e.Kind = RollingRestart
			return e, 2 * time.Duration(len(base[region])) * estRestart, true
		case k < 8:
			e.Kind, e.Gateways = ScaleOut, cfg.ScaleTo
			return e, estScale, true
		default:
			if len(cfg.Regions) < 2 || at > cfg.Length-15*time.Second || scaled[other(region)] {
				return e, 0, false // a region must stay to serve, and time to add it back
			}
			// Another region is removed: the faulted one gets its share meanwhile.
			e.Kind, e.Region, e.Hold = RegionRemove, other(region), dur(4*time.Second, 8*time.Second)
			return e, e.Hold + estRegion, true
		}
	}
	at := dur(2*time.Second, 4*time.Second)
	for at < cfg.Length {
		e := Event{At: at}
		var took time.Duration
		switch k := rng.IntN(11); {
		case k < 2:
			e.Kind, e.Region, e.Hold = RedisStall, pick(rng, cfg.Regions), dur(time.Second, 4*time.Second)
		case k < 4:
			e.Kind, e.Region, e.Hold = RedisKill, pick(rng, cfg.Regions), dur(time.Second, 4*time.Second)
			took = 2 * time.Second // the restart
		case k < 6:
			g := cfg.Gateways[rng.IntN(len(cfg.Gateways))]
			e.Kind, e.Gateway, e.Region, e.Hold = BlackHole, g.ID, g.Region, dur(time.Second, 4*time.Second)
		case k < 8:
			g := cfg.Gateways[rng.IntN(len(cfg.Gateways))]
			e.Kind, e.Gateway, e.Region, e.Hold = Latency, g.ID, g.Region, dur(2*time.Second, 5*time.Second)
			e.Delay = []time.Duration{2 * time.Millisecond, 8 * time.Millisecond, 20 * time.Millisecond}[rng.IntN(3)]
		case k < 10:
			e.Kind, e.Hold = PostgresKill, dur(2*time.Second, 5*time.Second)
			took = 3 * time.Second
			pgDown = append(pgDown, span{at, at + e.Hold + took})
		default:
			// Long enough for every gateway of the region to re-read the policy (every
			// reload_interval) and say so.
			e.Kind, e.Region, e.Hold = RedisEvicting, pick(rng, cfg.Regions), dur(7*time.Second, 9*time.Second)
		}
		if e.Kind.redisFault() && at >= fleetFree && rng.IntN(3) > 0 {
			during := rng.IntN(2) == 0
			fat := at + e.Hold + took + dur(0, 2*time.Second)
			if during {
				fat = at + dur(300*time.Millisecond, time.Second)
			}
			if f, est, ok := fleet(e.Region, fat); ok && fat < cfg.Length-5*time.Second {
				if during && e.Kind != Latency {
					// The outage lasts until the fleet event is done (a latency is a slow
					// network, not an outage: it keeps its own hold).
					e.Hold = max(e.Hold, min(fat-at+est, 12*time.Second))
				}
				switch f.Kind {
				case ScaleOut:
					scaled[f.Region] = true
				case ScaleIn:
					scaled[f.Region] = false
				case RegionRemove:
					removed = append(removed, span{fat, fat + est})
				}
				s.Events = append(s.Events, f)
				fleetFree = fat + est + time.Second
			}
		}
		if (e.Kind == RedisStall || e.Kind == RedisKill) && rng.IntN(3) == 0 {
			deletes = append(deletes, max(0, at-dur(500*time.Millisecond, 2*time.Second)))
		}
		s.Events = append(s.Events, e)
		at += e.Hold + took + dur(time.Second, 3*time.Second)
	}
	// A region scaled out is scaled in before the end.
	for _, r := range cfg.Regions {
		if scaled[r] {
			s.Events = append(s.Events, Event{At: min(max(fleetFree, cfg.Length-5*time.Second), cfg.Length-100*time.Millisecond), Kind: ScaleIn, Region: r})
		}
	}

	// The change track: exponential gaps around ChangeGap, none near a PostgreSQL kill,
	// no share change while a region is removed (its shares are gone), and the rule
	// deletions drawn above, each followed by an unrelated change. A deleted rule stays
	// deleted for 10 s (the Redis fault after it); the tenant's next change writes it
	// again.
	state := map[string]*TenantSpec{}
	override := map[string]bool{}
	deleted := map[string]time.Duration{} // tenant -> when it may be written again
	for i := range cfg.Tenants {
		t := cfg.Tenants[i]
		state[t.ID] = &t
	}
	draw := func(at time.Duration, t *TenantSpec, shares bool) Event {
		e := Event{At: at, Tenant: t.ID}
		k := rng.IntN(9)
		if _, ok := deleted[t.ID]; ok {
			k = 0 // its next change writes its rule again
		} else if !shares && k >= 5 && k < 8 {
			k = 3
		}
		if t.Banded && k >= 3 && k < 5 {
			k = 0
		}
		switch {
		case k < 3: // rule up or down: capacity x{1/2, 1, 2}, refill x{1/4, 1, 4}, within the bounds
			e.Kind = RuleChange
			e.Capacity = min(regions.MaxCapacity, max(min(40, t.Capacity), t.Capacity*[]int64{1, 2, 4}[rng.IntN(3)]/2))
			e.Refill = min(regions.MaxRefillPerSecond, t.Refill*[]float64{0.25, 1, 4}[rng.IntN(3)])
			t.Capacity, t.Refill = e.Capacity, e.Refill
			delete(deleted, t.ID)
		case k < 5:
			e.Kind, e.Shards = ShardChange, []int{1, 4, 8}[rng.IntN(3)]
		case k == 8: // a rule past a bound, as "unlimited" might be written: refused
			e.Kind = RuleRefused
			e.Capacity, e.Refill = []int64{regions.MaxCapacity + 1, math.MaxInt64, t.Capacity}[rng.IntN(3)], t.Refill
			if e.Capacity == t.Capacity {
				e.Refill = 2 * regions.MaxRefillPerSecond
			}
		case k < 7 || !override[t.ID]:
			e.Kind = ShareSet
			first := []float64{0.2, 0.35, 0.5, 0.65, 0.8}[rng.IntN(5)]
			e.Shares = map[string]float64{}
			rest := 1.0
			for i, r := range cfg.Regions {
				if i == len(cfg.Regions)-1 {
					e.Shares[r] = rest
					break
				}
				v := first
				if i > 0 {
					v = rest / float64(len(cfg.Regions)-i)
				}
				e.Shares[r], rest = v, rest-v
			}
			override[t.ID] = true
		default:
			e.Kind = ShareClear
			override[t.ID] = false
		}
		return e
	}
	// pickTenant draws a tenant other than not whose rule may be written at at: not one
	// deleted less than 10 s before. Nil when there is none.
	pickTenant := func(at time.Duration, not string) *TenantSpec {
		for _, i := range rng.Perm(len(cfg.Tenants)) {
			t := state[cfg.Tenants[i].ID]
			if until, ok := deleted[t.ID]; (!ok || at >= until) && t.ID != not {
				return t
			}
		}
		return nil
	}
	var deletable []string
	for _, t := range cfg.Tenants {
		if !t.Keep {
			deletable = append(deletable, t.ID)
		}
	}
	pgBlocked := func(at time.Duration) bool {
		_, blocked := near(at, pgDown, cfg.PostgresMargin, time.Second)
		return blocked
	}
	at = dur(time.Second, 3*time.Second)
	for at < cfg.Length {
		if len(deletes) > 0 && deletes[0] <= at {
			d := deletes[0]
			deletes = deletes[1:]
			if pgBlocked(d) || pgBlocked(d+time.Second) || len(deletable) == 0 {
				continue
			}
			id := pick(rng, deletable)
			if _, ok := deleted[id]; ok {
				continue
			}
			deleted[id] = d + 10*time.Second
			s.Events = append(s.Events, Event{At: d, Kind: RuleDelete, Tenant: id})
			if other := pickTenant(d+time.Second, id); other != nil {
				_, inRemoval := near(d+time.Second, removed, time.Second, time.Second)
				s.Events = append(s.Events, draw(d+time.Second, other, !inRemoval))
			}
			at = max(at, d+2*time.Second)
			continue
		}
		if next, blocked := near(at, pgDown, cfg.PostgresMargin, time.Second); blocked {
			at = next
			continue
		}
		if t := pickTenant(at, ""); t != nil {
			_, inRemoval := near(at, removed, time.Second, time.Second)
			s.Events = append(s.Events, draw(at, t, !inRemoval))
		}
		gap := time.Duration(rng.ExpFloat64() * float64(cfg.ChangeGap))
		at += min(max(gap, 500*time.Millisecond), 3*cfg.ChangeGap).Round(100 * time.Millisecond)
	}
	kept := s.Events[:0]
	for _, e := range s.Events {
		if e.At < cfg.Length {
			kept = append(kept, e)
		}
	}
	s.Events = kept
	sort.SliceStable(s.Events, func(i, j int) bool { return s.Events[i].At < s.Events[j].At })
	return s
}

func pick(rng *rand.Rand, xs []string) string { return xs[rng.IntN(len(xs))] }
