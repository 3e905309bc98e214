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
		Tenants: []TenantSpec{{"a", 40, 0.05}, {"b", 60, 0.5}, {"n", 100, 20}},
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

// TestGenerateRules: the schedule keeps the rules it promises: faults one at a time,
// overrides summing to 1, no change near a PostgreSQL kill, no Redis fault in a region
// soon after one of its gateways restarted, every event kind drawn over a few seeds.
func TestGenerateRules(t *testing.T) {
	cfg := testConfig()
	kinds := map[Kind]int{}
	for seed := uint64(1); seed <= 30; seed++ {
		s := Generate(seed, cfg)
		var faultEnd time.Duration
		restartEnd := map[string]time.Duration{}
		var pg [][2]time.Duration
		for _, e := range s.Events {
			kinds[e.Kind]++
			if e.At < 0 || e.At >= cfg.Length {
				t.Errorf("seed %d: %v outside [0, %v)", seed, e, cfg.Length)
			}
			if e.Kind == PostgresKill {
				pg = append(pg, [2]time.Duration{e.At, e.At + e.Hold + 3*time.Second})
			}
		}
		for _, e := range s.Events {
			switch {
			case e.Kind.Fault():
				if e.At < faultEnd {
					t.Errorf("seed %d: %v starts before the previous fault ended (%v)", seed, e, faultEnd)
				}
				faultEnd = e.At + e.Hold
				if e.Kind == GatewayRestart {
					restartEnd[e.Gateway[:7]] = e.At + 3*time.Second
				}
				if (e.Kind == RedisStall || e.Kind == RedisKill) && restartEnd[e.Region] > 0 && e.At < restartEnd[e.Region]+8*time.Second {
					t.Errorf("seed %d: %v within the quiet time after a gateway restart in its region", seed, e)
				}
			case e.Kind == ShareSet:
				sum := 0.0
				for _, v := range e.Shares {
					sum += v
				}
				if math.Abs(sum-1) > 1e-9 || len(e.Shares) != len(cfg.Regions) {
					t.Errorf("seed %d: %v: shares sum to %v", seed, e, sum)
				}
			default:
				for _, d := range pg {
					if e.At > d[0]-7*time.Second && e.At < d[1]+time.Second {
						t.Errorf("seed %d: %v near a PostgreSQL kill %v", seed, e, d)
					}
				}
			}
		}
	}
	for k := RedisStall; k <= ShareClear; k++ {
		if kinds[k] == 0 {
			t.Errorf("no %v in 30 seeds", k)
		}
	}
}
