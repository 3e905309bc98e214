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

// The event kinds. Faults run one at a time on the fault track; changes run on the change
// track, which keeps clear of PostgreSQL outages (a write needs the database).
const (
	RedisStall     Kind = iota + 1 // SIGSTOP a region's Redis for Hold, then SIGCONT
	RedisKill                      // SIGKILL a region's Redis, restart it empty after Hold
	BlackHole                      // the proxy between one gateway and its Redis accepts and never answers, for Hold
	Latency                        // that proxy holds every reply for Delay, for Hold
	PostgresKill                   // SIGKILL PostgreSQL, restart it after Hold
	GatewayRestart                 // take a gateway out of the load, SIGTERM it, start it, put it back
	RedisEvicting                  // CONFIG SET an evicting maxmemory-policy on a region's Redis for Hold; its gateways must say so
	RuleChange                     // set a tenant's capacity and refill
	ShardChange                    // set a tenant's rule's shard count
	ShareSet                       // set a tenant's share override (shares sum to 1)
	ShareClear                     // clear a tenant's share override
	RuleRefused                    // try a rule beyond the bounds (Capacity, Refill): refused by the store and the database, nothing changes
)

var kindNames = map[Kind]string{
	RedisStall: "redis-stall", RedisKill: "redis-kill", BlackHole: "black-hole", Latency: "latency",
	PostgresKill: "postgres-kill", GatewayRestart: "gateway-restart", RedisEvicting: "redis-evicting",
	RuleChange: "rule-change", ShardChange: "shard-change", ShareSet: "share-set", ShareClear: "share-clear",
	RuleRefused: "rule-refused",
}

func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Fault reports whether k runs on the fault track.
func (k Kind) Fault() bool { return k >= RedisStall && k <= RedisEvicting }

// Event is one scheduled fault or change, At after the schedule's start.
type Event struct {
	At   time.Duration
	Kind Kind
	// Hold is how long a fault lasts (RedisStall, RedisKill, BlackHole, Latency,
	// PostgresKill, RedisEvicting).
	Hold time.Duration
	// Region is the Redis's region (RedisStall, RedisKill, RedisEvicting); Gateway the gateway id
	// (BlackHole, Latency, GatewayRestart); Tenant the tenant of a change.
	Region, Gateway, Tenant string
	Delay                   time.Duration // Latency
	Capacity                int64         // RuleChange, RuleRefused
	Refill                  float64       // RuleChange, RuleRefused
	Shards                  int           // ShardChange
	Shares                  map[string]float64
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%6.2fs %-15s", e.At.Seconds(), e.Kind)
	switch e.Kind {
	case RedisStall, RedisKill, RedisEvicting:
		fmt.Fprintf(&b, " region=%s hold=%v", e.Region, e.Hold)
	case BlackHole:
		fmt.Fprintf(&b, " gateway=%s hold=%v", e.Gateway, e.Hold)
	case Latency:
		fmt.Fprintf(&b, " gateway=%s delay=%v hold=%v", e.Gateway, e.Delay, e.Hold)
	case PostgresKill:
		fmt.Fprintf(&b, " hold=%v", e.Hold)
	case GatewayRestart:
		fmt.Fprintf(&b, " gateway=%s", e.Gateway)
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
	case ShareClear:
		fmt.Fprintf(&b, " tenant=%s", e.Tenant)
	}
	return b.String()
}

// TenantSpec is a tenant's starting rule; changes scale it.
type TenantSpec struct {
	ID       string
	Capacity int64
	Refill   float64
}

// GatewaySpec names a gateway and its region.
type GatewaySpec struct{ ID, Region string }

// ScheduleConfig is what a schedule is drawn over.
type ScheduleConfig struct {
	Length   time.Duration // the schedule's span (events start within it)
	Regions  []string
	Gateways []GatewaySpec
	Tenants  []TenantSpec
	// ChangeGap is the mean time between changes (default 5s).
	ChangeGap time.Duration
	// Quiet is how long after a gateway restart no fault hits the Redis of its region
	// (default 8s): the fallback divides a region's budget by the live instance count,
	// which lags a restart by a heartbeat TTL and a reload; keeping the two apart keeps
	// the "N lags" slack of the invariant at 0 (docs/reliability.md). It is also how long
	// after a Redis fault no gateway of its region restarts, which keeps the "a gateway
	// stopped while it owes" slack at 0.
	Quiet time.Duration
	// PostgresMargin keeps changes this far from a PostgreSQL kill (default 7s: a
	// reload interval and a second), so that no change waits in the database for a
	// gateway that cannot reload: the reload lag stays one reload.
	PostgresMargin time.Duration
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

// Generate draws the schedule of seed. It is a pure function of its arguments: the same
// seed and config give the same schedule, on every machine and Go version (math/rand/v2's
// PCG is specified).
func Generate(seed uint64, cfg ScheduleConfig) Schedule {
	if cfg.ChangeGap <= 0 {
		cfg.ChangeGap = 5 * time.Second
	}
	if cfg.Quiet <= 0 {
		cfg.Quiet = 8 * time.Second
	}
	if cfg.PostgresMargin <= 0 {
		cfg.PostgresMargin = 7 * time.Second
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	dur := func(lo, hi time.Duration) time.Duration { // uniform, to 100 ms
		steps := int64((hi - lo) / (100 * time.Millisecond))
		return lo + time.Duration(rng.Int64N(steps+1))*100*time.Millisecond
	}
	s := Schedule{Seed: seed, Length: cfg.Length}

	// The fault track: one fault at a time, a gap of 1-3 s between them.
	type span struct{ from, to time.Duration }
	var pgDown []span
	lastRestart := map[string]time.Duration{} // region -> end of its last gateway restart
	lastFault := map[string]time.Duration{}   // region -> end of its last Redis fault
	at := dur(2*time.Second, 4*time.Second)
	for at < cfg.Length {
		e := Event{At: at}
		var took time.Duration
		switch k := rng.IntN(13); {
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
		case k == 12:
			// Long enough for every gateway of the region to re-read the policy (every
			// reload_interval) and say so.
			e.Kind, e.Region, e.Hold = RedisEvicting, pick(rng, cfg.Regions), dur(7*time.Second, 9*time.Second)
		default:
			g := cfg.Gateways[rng.IntN(len(cfg.Gateways))]
			e.Kind, e.Gateway, e.Region = GatewayRestart, g.ID, g.Region
			took = 3 * time.Second
		}
		if e.Kind != GatewayRestart && e.Kind != PostgresKill {
			if end, ok := lastRestart[e.Region]; ok && at < end+cfg.Quiet {
				// Too soon after a gateway of this region restarted: move on.
				at = end + cfg.Quiet
				continue
			}
		}
		if e.Kind == GatewayRestart {
			if end, ok := lastFault[e.Region]; ok && at < end+cfg.Quiet {
				// Too soon after a Redis fault of this region: a gateway stopped while its
				// fallback still owes loses the debt. Move on.
				at = end + cfg.Quiet
				continue
			}
			lastRestart[e.Region] = at + took
			e.Region = "" // printed by gateway only
		} else if e.Kind != PostgresKill {
			lastFault[e.Region] = at + e.Hold + took
		}
		s.Events = append(s.Events, e)
		at += e.Hold + took + dur(time.Second, 3*time.Second)
	}

	// The change track: exponential gaps around ChangeGap, none near a PostgreSQL kill.
	state := map[string]*TenantSpec{}
	override := map[string]bool{}
	for i := range cfg.Tenants {
		t := cfg.Tenants[i]
		state[t.ID] = &t
	}
	at = dur(time.Second, 3*time.Second)
	for at < cfg.Length {
		blocked := false
		for _, d := range pgDown {
			if at > d.from-cfg.PostgresMargin && at < d.to+time.Second {
				at, blocked = d.to+time.Second, true
			}
		}
		if blocked {
			continue
		}
		t := cfg.Tenants[rng.IntN(len(cfg.Tenants))]
		e := Event{At: at, Tenant: t.ID}
		switch k := rng.IntN(9); {
		case k < 3: // rule up or down: capacity x{1/2, 1, 2}, refill x{1/4, 1, 4}, within the bounds
			e.Kind = RuleChange
			e.Capacity = min(regions.MaxCapacity, max(min(40, t.Capacity), t.Capacity*[]int64{1, 2, 4}[rng.IntN(3)]/2))
			e.Refill = min(regions.MaxRefillPerSecond, t.Refill*[]float64{0.25, 1, 4}[rng.IntN(3)])
			state[t.ID].Capacity, state[t.ID].Refill = e.Capacity, e.Refill
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
		s.Events = append(s.Events, e)
		gap := time.Duration(rng.ExpFloat64() * float64(cfg.ChangeGap))
		at += min(max(gap, 500*time.Millisecond), 3*cfg.ChangeGap).Round(100 * time.Millisecond)
	}
	sort.SliceStable(s.Events, func(i, j int) bool { return s.Events[i].At < s.Events[j].At })
	return s
}

func pick(rng *rand.Rand, xs []string) string { return xs[rng.IntN(len(xs))] }
