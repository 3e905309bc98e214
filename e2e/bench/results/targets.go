package results

import (
	"fmt"
	"strconv"
	"strings"
)

// Verdict is a target's outcome in one run.
type Verdict string

const (
	Met         Verdict = "met"
	NotMet      Verdict = "not met"
	NotMeasured Verdict = "not measured"
)

// MaxLoad is the 1-minute load average below which the RLS comparison counts: above
// it the machine was busy with other work and the verdict is "not measured".
const MaxLoad = 2.0

// Target is one target and its verdict in the run. Every verdict compares the median
// over the runs (of a ratio taken run by run, for ratios) with the criterion.
type Target struct {
	ID        string
	Issue     string // the issue that set it
	Section   string // the section of docs/BENCHMARKS.md that measures it
	What      string
	Criterion string
	Figure    string // as measured, "–" when not measured
	Verdict   Verdict
	Why       string // for NotMeasured: why
}

// target is one definition: what is measured, the criterion, and how the figure and
// the verdict follow from the results. The criterion text and its check sit side by
// side here so that they cannot drift apart.
type target struct {
	id, issue, section, what, criterion string
	eval                                func(b *Bench, r *RLS) (figure string, ok bool, why string)
}

// at least, at most: a verdict from a stat's median.
func atLeast(s Stat, min float64, f func(float64) string) (string, bool, string) {
	if !s.Measured() {
		return "–", false, "not in this run"
	}
	return show(s, f), s.Med >= min, ""
}

func atMost(s Stat, max float64, f func(float64) string) (string, bool, string) {
	if !s.Measured() {
		return "–", false, "not in this run"
	}
	return show(s, f), s.Med <= max, ""
}

func below(s Stat, lim float64, f func(float64) string) (string, bool, string) {
	if !s.Measured() {
		return "–", false, "not in this run"
	}
	return show(s, f), s.Med < lim, ""
}

// LoadOne is the 1-minute figure of a /proc/loadavg line; ok is false when it does
// not parse ("unknown").
func LoadOne(load string) (float64, bool) {
	f := strings.Fields(load)
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}

const million = 1_000_000

var targets = []target{
	{"redis-memory", "23", "memory", "Redis memory per bucket at 1,000,000 buckets", "≤ 150 B",
		func(b *Bench, _ *RLS) (string, bool, string) {
			if b.Memory == nil || b.Memory.Redis == nil {
				return "–", false, "no memory phase in this run"
			}
			for _, m := range b.Memory.Redis.PerBucket {
				if m.Buckets == million {
					return atMost(m.Bytes, 150, func(v float64) string { return fmtF(1)(v) + " B" })
				}
			}
			return "–", false, "this run filled fewer than 1,000,000 buckets"
		}},
	{"script-vs-article", "23", "scripts", "our script's Redis ceiling (redis-benchmark -P 16, 100k keys) over the article's script", "≥ 1.0x",
		func(b *Bench, _ *RLS) (string, bool, string) { return scriptRatio(b, "ours", false, 1.0) }},
	{"script-vs-redis-rate", "23", "scripts", "our script's Redis ceiling over go-redis/redis_rate's GCRA script (same run)", "≥ 1.0x",
		func(b *Bench, _ *RLS) (string, bool, string) { return scriptRatio(b, "ours", true, 1.0) }},
	{"batch-vs-article", "23", "scripts", "many buckets per call: our batch's decisions/s over the article's single-call ceiling", "≥ 1.8x",
		func(b *Bench, _ *RLS) (string, bool, string) { return scriptRatio(b, "ours-batch", false, 1.8) }},
	{"engine-vs-redis-rate-64", "23", "engine", "ours (the default path) over go-redis/redis_rate, decisions/s at 64 callers, 100k keys", "≥ 1.8x",
		func(b *Bench, _ *RLS) (string, bool, string) { return engineRel(b, 64, 1.8) }},
	{"engine-vs-redis-rate-16", "23", "engine", "ours over go-redis/redis_rate, decisions/s at 16 callers, 100k keys", "≥ 1.2x",
		func(b *Bench, _ *RLS) (string, bool, string) { return engineRel(b, 16, 1.2) }},
	{"engine-p99-64", "23", "engine", "p99 of a decision at 64 callers, 100k keys (ours, the default path)", "< 1 ms",
		func(b *Bench, _ *RLS) (string, bool, string) {
			row := b.Engine.Row("100k", 64, "pipelined")
			if row == nil {
				return "–", false, "not in this run"
			}
			return below(row.P99Us, 1000, fmtUs)
		}},
	{"gateway-vs-proxy", "23", "overhead", "p99 a gateway deciding on Redis (c) adds at 2,500 requests/s, over what a bare httputil.ReverseProxy (r) adds, side by side", "≤ 1.1x",
		func(b *Bench, _ *RLS) (string, bool, string) {
			c, p := b.Overhead.Latency(2500, "c"), b.Overhead.Latency(2500, "r")
			if c == nil || p == nil || !c.AddedP99Ms.Measured() || !p.AddedP99Ms.Measured() {
				return "–", false, "no 2,500 requests/s point of paths (c) and (r) in this run"
			}
			fig := fmt.Sprintf("(c) %s, (r) %s", show(c.AddedP99Ms, fmtSignedMs), show(p.AddedP99Ms, fmtSignedMs))
			if p.AddedP99Ms.Med > 0 {
				fig += " (" + fmtX(c.AddedP99Ms.Med/p.AddedP99Ms.Med) + ")"
			}
			return fig, c.AddedP99Ms.Med <= 1.1*p.AddedP99Ms.Med, ""
		}},
	{"rls-vs-envoy", "23", "rls", "RLS decisions/s over envoyproxy/ratelimit's at 64 gRPC callers, 1-minute load average below 2 at the start", "≥ 3x",
		func(_ *Bench, r *RLS) (string, bool, string) {
			if r == nil {
				return "–", false, "no make bench-rls results"
			}
			ratio := r.Ratio(64)
			if ratio == 0 {
				return "–", false, "no 64-caller rows of both servers in the RLS run"
			}
			fig := fmt.Sprintf("%s (%s / %s decisions/s)", fmtX(ratio), fmtInt(r.Row("quotaplane", 64).DecisionsPerS), fmtInt(r.Row("ratelimit", 64).DecisionsPerS))
			load, ok := LoadOne(r.LoadStart)
			if !ok || load >= MaxLoad {
				return fig, false, fmt.Sprintf("machine busy: load average %s at the start", r.LoadStart)
			}
			return fig, ratio >= 3, ""
		}},

	{"overhead-added-p99", "8", "overhead", "p99 a gateway deciding on Redis (c) adds over direct (a), 2,500 requests/s", "≤ 0.5 ms",
		func(b *Bench, _ *RLS) (string, bool, string) {
			c := b.Overhead.Latency(2500, "c")
			if c == nil {
				return "–", false, "no 2,500 requests/s point in this run"
			}
			return atMost(c.AddedP99Ms, 0.5, fmtSignedMs)
		}},
	{"overhead-max-rps", "8", "overhead", "highest rate with p99 < 10 ms: gateway + Redis (c) over gateway, local limiter (b)", "≥ 0.8x",
		func(b *Bench, _ *RLS) (string, bool, string) {
			m := b.Overhead.MaxOf("c")
			if m == nil {
				return "–", false, "not in this run"
			}
			return atLeast(m.VsLocal, 0.8, fmtX)
		}},
	{"engine-vs-ceiling-64", "8", "engine", "ours over the redis-benchmark -P 16 ceiling of our script at 64 callers, 100k keys", "≥ 0.9x",
		func(b *Bench, _ *RLS) (string, bool, string) {
			return engineRelOf(b, 64, func(r *EngineRelative) Stat { return r.VsCeiling }, 0.9)
		}},
	{"engine-vs-ceiling-256", "8", "engine", "the same at 256 callers", "≥ 0.9x",
		func(b *Bench, _ *RLS) (string, bool, string) {
			return engineRelOf(b, 256, func(r *EngineRelative) Stat { return r.VsCeiling }, 0.9)
		}},
	{"engine-1-caller", "8, 23", "engine", "at 1 caller, ours within 10% of a bare EVALSHA round trip (decisions/s ratio), 100k keys", "≥ 0.9x",
		func(b *Bench, _ *RLS) (string, bool, string) {
			return engineRelOf(b, 1, func(r *EngineRelative) Stat { return r.VsBare }, 0.9)
		}},
	{"leases", "14", "engine", "leases: Redis calls per admitted decision on a hot key at the article's hot-tenant rule, the last, partly spent lease aside, in every run", "≤ 1 per 20",
		func(b *Bench, _ *RLS) (string, bool, string) {
			if b.Engine == nil || len(b.Engine.Leases) == 0 {
				return "–", false, "not in this run"
			}
			var figs []string
			ok, recorded := true, true
			for _, l := range b.Engine.Leases {
				figs = append(figs, fmt.Sprintf("%s at %d", show(l.CallsPerAdmitted, fmtF(4)), l.Callers))
				recorded = recorded && l.WithinBound != nil
				ok = ok && l.WithinBound != nil && *l.WithinBound
			}
			fig := strings.Join(figs, ", ") + " callers"
			if !recorded {
				return fig, false, "the per-run check was not recorded with these figures"
			}
			return fig, ok, ""
		}},
}

func scriptRatio(b *Bench, script string, vsRedisRate bool, min float64) (string, bool, string) {
	row := b.Scripts.Row(script)
	if row == nil {
		return "–", false, "no script phase in this run"
	}
	s := row.VsArticle
	if vsRedisRate {
		s = row.VsRedisRate
	}
	fig, ok, why := atLeast(s, min, fmtX)
	if row.DecisionsPerCall > 1 {
		fig += fmt.Sprintf(" (%d decisions per call)", row.DecisionsPerCall)
	}
	return fig, ok, why
}

func engineRel(b *Bench, callers int, min float64) (string, bool, string) {
	return engineRelOf(b, callers, func(r *EngineRelative) Stat { return r.VsRedisRate }, min)
}

func engineRelOf(b *Bench, callers int, f func(*EngineRelative) Stat, min float64) (string, bool, string) {
	rel := b.Engine.Rel("100k", callers)
	if rel == nil {
		return "–", false, "not in this run"
	}
	return atLeast(f(rel), min, fmtX)
}

// Targets evaluates every target on the results (either may be nil: its targets are
// not measured), issue 23's first.
func Targets(b *Bench, r *RLS) []Target {
	if b == nil {
		b = &Bench{}
	}
	out := make([]Target, 0, len(targets))
	for _, t := range targets {
		fig, ok, why := t.eval(b, r)
		v := NotMet
		switch {
		case why != "":
			v = NotMeasured
		case ok:
			v = Met
		}
		out = append(out, Target{ID: t.id, Issue: t.issue, Section: t.section, What: t.what, Criterion: t.criterion, Figure: fig, Verdict: v, Why: why})
	}
	return out
}
