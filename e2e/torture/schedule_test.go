package torture

import (
	"math"
	"testing"
	"time"
)

func testConfig() ScheduleConfig {
	return ScheduleConfig{
		Length:  75 * time.Second,
		Regions: []string{"us-east", "eu-west"},
		Gateways: []GatewaySpec{
			{"us-east-1", "us-east"}, {"us-east-2", "us-east"}, {"eu-west-1", "eu-west"}, {"eu-west-2", "eu-west"},
		},
		Tenants: []TenantSpec{{ID: "a", Capacity: 40, Refill: 0.05}, {ID: "b", Capacity: 60, Refill: 0.5}, {ID: "n", Capacity: 100, Refill: 20}, {ID: "k", Capacity: 10, Refill: 1, Keep: true}},
	}
}

// TestGenerateReplays: the schedule is a pure function of the seed: the same seed gives
// the same schedule, other seeds give others.
func TestGenerateReplays(t *testing.T) {
	cfg := testConfig()
	seen := map[string]uint64{}
	for seed := uint64(1); seed <= 20; seed++ {
		a, b := Generate(seed, cfg).String(), Generate(seed, cfg).String()
		if a != b {
			t.Fatalf("seed %d gave two schedules:\n%s\n%s", seed, a, b)
		}
		body := a[len("schedule seed=")+len(fmtUint(seed)):]
		if other, dup := seen[body]; dup {
			t.Errorf("seeds %d and %d gave the same schedule", other, seed)
		}
		seen[body] = seed
	}
}

func fmtUint(u uint64) string {
	s := ""
	for {
		s = string(rune('0'+u%10)) + s
		u /= 10
		if u == 0 {
			return s
		}
	}
}

// TestGenerateRules: the schedule keeps the rules it promises: faults one at a time and
// fleet events one at a time, each fleet event during a Redis fault of its region or
// within 2 s after it, a scale-out always scaled in again (before the end), a region
// removal only with its starting gateways, overrides summing to 1, no change near a
// PostgreSQL kill, no share change while a region is removed, a rule deletion only of a
// tenant that may lose it and followed by another change, every event kind drawn over a
// few seeds.
func TestGenerateRules(t *testing.T) {
	cfg := testConfig()
	kinds := map[Kind]int{}
	for seed := uint64(1); seed <= 30; seed++ {
		s := Generate(seed, cfg)
		var faultEnd, fleetAt time.Duration
		var pg, faults [][2]time.Duration
		faultRegion := []string{}
		scaled := map[string]bool{}
		var removed [][2]time.Duration
		for _, e := range s.Events {
			kinds[e.Kind]++
			if e.At < 0 || e.At >= cfg.Length {
				t.Errorf("seed %d: %v outside [0, %v)", seed, e, cfg.Length)
			}
			switch {
			case e.Kind == PostgresKill:
				pg = append(pg, [2]time.Duration{e.At, e.At + e.Hold + 3*time.Second})
			case e.Kind.redisFault():
				end := e.At + e.Hold + 2*time.Second
				if e.Kind == RedisKill {
					end += 2 * time.Second // its restart
				}
				faults = append(faults, [2]time.Duration{e.At, end})
				faultRegion = append(faultRegion, e.Region)
			case e.Kind == RegionRemove:
				removed = append(removed, [2]time.Duration{e.At, e.At + e.Hold + estRegion})
			}
		}
		for i, e := range s.Events {
			switch {
			case e.Kind.Fault():
				if e.At < faultEnd {
					t.Errorf("seed %d: %v starts before the previous fault ended (%v)", seed, e, faultEnd)
				}
				faultEnd = e.At + e.Hold
			case e.Kind.Fleet():
				if e.At < fleetAt {
					t.Errorf("seed %d: %v before the previous fleet event", seed, e)
				}
				fleetAt = e.At
				tied := false
				for j, f := range faults {
					tied = tied || (faultRegion[j] == e.Region && e.At >= f[0] && e.At <= f[1])
				}
				last := e.Kind == ScaleIn && e.At >= cfg.Length-5*time.Second
				if e.Kind == RegionRemove {
					tied = false // the other region's fault
					for j, f := range faults {
						tied = tied || (faultRegion[j] != e.Region && e.At >= f[0] && e.At <= f[1])
					}
				}
				if !tied && !last {
					t.Errorf("seed %d: %v neither during nor right after a Redis fault of its region", seed, e)
				}
				switch e.Kind {
				case ScaleOut:
					if scaled[e.Region] {
						t.Errorf("seed %d: %v while already scaled out", seed, e)
					}
					scaled[e.Region] = true
				case ScaleIn:
					if !scaled[e.Region] {
						t.Errorf("seed %d: %v without a scale-out before", seed, e)
					}
					scaled[e.Region] = false
				case RegionRemove:
					if scaled[e.Region] {
						t.Errorf("seed %d: %v while the region is scaled out", seed, e)
					}
				default:
					if scaled[e.Region] {
						t.Errorf("seed %d: %v while the region is scaled out (the scale-in comes first)", seed, e)
					}
				}
			case e.Kind == ShareSet || e.Kind == ShareClear:
				for _, r := range removed {
					if e.At > r[0]-time.Second && e.At < r[1]+time.Second {
						t.Errorf("seed %d: %v while a region is removed (%v)", seed, e, r)
					}
				}
				sum := 0.0
				for _, v := range e.Shares {
					sum += v
				}
				if e.Kind == ShareSet && (math.Abs(sum-1) > 1e-9 || len(e.Shares) != len(cfg.Regions)) {
					t.Errorf("seed %d: %v: shares sum to %v", seed, e, sum)
				}
			case e.Kind == RuleDelete:
				if e.Tenant == "k" {
					t.Errorf("seed %d: %v deletes a rule marked Keep", seed, e)
				}
				followed := false
				for _, f := range s.Events[i+1:] {
					followed = followed || (!f.Kind.Fault() && !f.Kind.Fleet() && f.Tenant != e.Tenant && f.At <= e.At+time.Second)
				}
				if !followed {
					t.Errorf("seed %d: %v not followed by another change within a second", seed, e)
				}
			}
			if !e.Kind.Fault() && !e.Kind.Fleet() {
				for _, d := range pg {
					if e.At > d[0]-7*time.Second && e.At < d[1]+time.Second {
						t.Errorf("seed %d: %v near a PostgreSQL kill %v", seed, e, d)
					}
				}
			}
		}
		for r, on := range scaled {
			if on {
				t.Errorf("seed %d: %s still scaled out at the end", seed, r)
			}
		}
	}
	for k := RedisStall; k <= RuleDelete; k++ {
		if kinds[k] == 0 {
			t.Errorf("no %v in 30 seeds", k)
		}
	}
	t.Logf("kinds over 30 seeds: %v", kinds)
}
