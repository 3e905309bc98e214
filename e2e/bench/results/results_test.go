package results

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/gendoc"
)

// moduleRoot is the directory of go.mod (the committed files are read from there).
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestCommittedDocuments: docs/BENCHMARKS.md, the README's bench section and
// docs/proxies.md's rls section are exactly what the committed results files render
// to, so neither the figures nor the prose can be edited in one place only. After a
// template change: go run ./cmd/bench -render.
func TestCommittedDocuments(t *testing.T) {
	f := Committed(moduleRoot(t))
	b, r, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if r == nil {
		t.Fatalf("%s is missing", f.RLS)
	}
	want, err := Render(f, b, r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.Benchmarks)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want.Benchmarks {
		t.Errorf("%s is not what %s and %s render to: run go run ./cmd/bench -render\n%s", f.Benchmarks, f.Results, f.RLS, firstDiff(string(got), want.Benchmarks))
	}
	for _, s := range []struct{ path, section, want string }{
		{f.Readme, ReadmeSection, want.Readme},
		{f.Proxies, ProxiesSection, want.Proxies},
	} {
		doc, err := os.ReadFile(s.path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := gendoc.Section(doc, s.section)
		if err != nil {
			t.Fatal(err)
		}
		if got != s.want {
			t.Errorf("%s, section %s, is not what the results render to: run go run ./cmd/bench -render\n%s", s.path, s.section, firstDiff(got, s.want))
		}
	}
}

func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var a, b string
		if i < len(g) {
			a = g[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return "line " + itoa(i+1) + ":\n  committed: " + a + "\n  rendered:  " + b
		}
	}
	return ""
}

func itoa(i int) string { return fmtInt(float64(i)) }

func stat(vs ...float64) Stat { return StatOf(vs) }

func verdict(t *testing.T, b *Bench, r *RLS, id string) Target {
	t.Helper()
	for _, x := range Targets(b, r) {
		if x.ID == id {
			return x
		}
	}
	t.Fatalf("no target %s", id)
	return Target{}
}

// TestTargets: each target's verdict at, just inside and just outside its criterion,
// and "not measured" (with why) when the run has no figure for it.
func TestTargets(t *testing.T) {
	memory := func(buckets int64, bytes float64) *Bench {
		return &Bench{Memory: &Memory{Redis: &RedisMemory{PerBucket: []BucketMemory{{Buckets: 100_000, Bytes: stat(1)}, {Buckets: buckets, Bytes: stat(bytes)}}}}}
	}
	scripts := func(vsArticle, vsRedisRate, batch float64) *Bench {
		return &Bench{Scripts: &Scripts{Rows: []ScriptRow{
			{Script: "ours", DecisionsPerCall: 1, VsArticle: stat(vsArticle), VsRedisRate: stat(vsRedisRate)},
			{Script: "ours-batch", DecisionsPerCall: 16, VsArticle: stat(batch)},
		}}}
	}
	engine := func(vs64, vs16, p99us float64) *Bench {
		return &Bench{Engine: &Engine{
			Groups:   []EngineGroup{{Keys: "100k", Rows: []EngineRow{{Callers: 64, Mode: "pipelined", P99Us: stat(p99us)}}}},
			Relative: []EngineRelative{{Keys: "100k", Callers: 64, VsRedisRate: stat(vs64)}, {Keys: "100k", Callers: 16, VsRedisRate: stat(vs16)}},
		}}
	}
	overhead := func(c, r float64) *Bench {
		return &Bench{Overhead: &Overhead{Rates: []Rate{{RPS: 2500, Rows: []LatencyRow{{Path: "c", AddedP99Ms: stat(c)}, {Path: "r", AddedP99Ms: stat(r)}}}}}}
	}
	rls := func(ours, theirs float64, load string) *RLS {
		return &RLS{LoadStart: load, Rows: []RLSRow{{Server: "quotaplane", Callers: 64, DecisionsPerS: ours}, {Server: "ratelimit", Callers: 64, DecisionsPerS: theirs}}}
	}
	within, outside := true, false
	for _, c := range []struct {
		name, id string
		b        *Bench
		r        *RLS
		want     Verdict
		why      string
	}{
		{"memory at the bound", "redis-memory", memory(million, 150), nil, Met, ""},
		{"memory over", "redis-memory", memory(million, 150.1), nil, NotMet, ""},
		{"memory: fewer buckets measured", "redis-memory", memory(20_000, 100), nil, NotMeasured, "fewer than 1,000,000"},
		{"memory: no phase", "redis-memory", &Bench{}, nil, NotMeasured, "no memory phase"},
		{"script vs article at the bound", "script-vs-article", scripts(1.0, 0, 0), nil, Met, ""},
		{"script vs article below", "script-vs-article", scripts(0.99, 0, 0), nil, NotMet, ""},
		{"script vs redis_rate", "script-vs-redis-rate", scripts(2, 0.99, 0), nil, NotMet, ""},
		{"batch at 1.8x", "batch-vs-article", scripts(0, 0, 1.8), nil, Met, ""},
		{"batch below", "batch-vs-article", scripts(0, 0, 1.79), nil, NotMet, ""},
		{"scripts: no phase", "batch-vs-article", &Bench{}, nil, NotMeasured, "no script phase"},
		{"engine 64 at 1.8x", "engine-vs-redis-rate-64", engine(1.8, 0, 0), nil, Met, ""},
		{"engine 64 below", "engine-vs-redis-rate-64", engine(1.79, 0, 0), nil, NotMet, ""},
		{"engine 16 at 1.2x", "engine-vs-redis-rate-16", engine(0, 1.2, 0), nil, Met, ""},
		{"engine 16 below", "engine-vs-redis-rate-16", engine(0, 1.19, 0), nil, NotMet, ""},
		{"p99 under 1 ms", "engine-p99-64", engine(0, 0, 999), nil, Met, ""},
		{"p99 of 1 ms is not under", "engine-p99-64", engine(0, 0, 1000), nil, NotMet, ""},
		{"engine: no phase", "engine-p99-64", &Bench{}, nil, NotMeasured, "not in this run"},
		{"gateway at 1.1x the proxy", "gateway-vs-proxy", overhead(1.1, 1), nil, Met, ""},
		{"gateway over 1.1x the proxy", "gateway-vs-proxy", overhead(1.11, 1), nil, NotMet, ""},
		{"no proxy path", "gateway-vs-proxy", &Bench{Overhead: &Overhead{Rates: []Rate{{RPS: 2500, Rows: []LatencyRow{{Path: "c", AddedP99Ms: stat(1)}}}}}}, nil, NotMeasured, "paths (c) and (r)"},
		{"rls at 3x, quiet", "rls-vs-envoy", &Bench{}, rls(3000, 1000, "1.99 1 1"), Met, ""},
		{"rls below 3x, quiet", "rls-vs-envoy", &Bench{}, rls(2999, 1000, "0.5 1 1"), NotMet, ""},
		{"rls at 3x, busy", "rls-vs-envoy", &Bench{}, rls(9000, 1000, "2.00 1 1"), NotMeasured, "machine busy: load average 2.00 1 1"},
		{"rls, load unknown", "rls-vs-envoy", &Bench{}, rls(9000, 1000, "unknown"), NotMeasured, "machine busy"},
		{"rls without envoyproxy/ratelimit", "rls-vs-envoy", &Bench{}, &RLS{LoadStart: "0.1 0 0", Rows: []RLSRow{{Server: "quotaplane", Callers: 64, DecisionsPerS: 1}}}, NotMeasured, "both servers"},
		{"no rls results", "rls-vs-envoy", &Bench{}, nil, NotMeasured, "no make bench-rls results"},
		{"leases within", "leases", &Bench{Engine: &Engine{Leases: []LeaseRow{{Callers: 1, WithinBound: &within}, {Callers: 16, WithinBound: &within}}}}, nil, Met, ""},
		{"leases outside in one", "leases", &Bench{Engine: &Engine{Leases: []LeaseRow{{Callers: 1, WithinBound: &within}, {Callers: 16, WithinBound: &outside}}}}, nil, NotMet, ""},
		{"leases not recorded", "leases", &Bench{Engine: &Engine{Leases: []LeaseRow{{Callers: 1}}}}, nil, NotMeasured, "not recorded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := verdict(t, c.b, c.r, c.id)
			if got.Verdict != c.want || !strings.Contains(got.Why, c.why) || (c.want != NotMeasured && got.Why != "") {
				t.Errorf("%s: %s (why %q, figure %q), want %s with %q", c.id, got.Verdict, got.Why, got.Figure, c.want, c.why)
			}
		})
	}
}

// TestTargetsAreUnique: every target has an id, an issue, a section the document has
// and a criterion; the README's ids exist (Render fails otherwise, see TestRenderEmpty).
func TestTargetsAreUnique(t *testing.T) {
	seen := map[string]bool{}
	sections := map[string]bool{"overhead": true, "engine": true, "scripts": true, "memory": true, "rls": true}
	for _, x := range Targets(nil, nil) {
		if seen[x.ID] || x.Issue == "" || !sections[x.Section] || x.Criterion == "" || x.What == "" {
			t.Errorf("target %+v: duplicate or incomplete", x)
		}
		seen[x.ID] = true
	}
}

// TestRenderEmpty: results with no phase at all render every document, each section
// saying it was not measured, with no template artefact.
func TestRenderEmpty(t *testing.T) {
	out, err := Render(Files{Results: "r.json"}, &Bench{Run: Run{Runs: 1, Start: time.Unix(0, 0)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{out.Benchmarks, out.Readme, out.Proxies} {
		for _, bad := range []string{"<no value>", "%!", "NaN", "\n\n\n"} {
			if strings.Contains(doc, bad) {
				t.Errorf("rendered %q:\n%s", bad, doc)
			}
		}
	}
	for _, want := range []string{"Not measured in this run (phase `overhead` not run)", "Not measured in this run (phase `scripts` not run)", "Not measured: `make bench-rls`"} {
		if !strings.Contains(out.Benchmarks, want) {
			t.Errorf("document lacks %q", want)
		}
	}
	if !strings.Contains(out.Proxies, "Not measured yet") {
		t.Errorf("proxies section: %q", out.Proxies)
	}
}

// TestRoundTrip: a results file reads back as written, and files of another schema or
// with unknown fields are refused.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ok := true
	b := &Bench{Run: Run{Command: "go run ./cmd/bench -runs 3", Runs: 3, Phases: []string{"engine"}, Start: time.Date(2026, 12, 1, 0, 16, 0, 0, time.UTC)},
		Engine:   &Engine{Leases: []LeaseRow{{Callers: 1, CallsPerAdmitted: stat(0.05, 0.049, 0.051), WithinBound: &ok}}},
		Overhead: &Overhead{Duration: Duration(3 * time.Second), Rates: []Rate{{RPS: 2500, Rows: []LatencyRow{{Path: "a", P99Ms: stat(1.25, 2.5)}}}}}}
	path := filepath.Join(dir, "results.json")
	if err := WriteFile(path, b); err != nil {
		t.Fatal(err)
	}
	var back Bench
	if err := ReadFile(path, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, b) {
		t.Errorf("read back %+v, wrote %+v", back, *b)
	}
	for _, c := range []struct{ name, text, want string }{
		{"other schema", `{"schema": 2, "run": {}}`, "schema 2"},
		{"unknown field", `{"schema": 1, "runn": {}}`, "unknown field"},
		{"bad duration", `{"schema": 1, "overhead": {"duration": "3 parsecs"}}`, "duration"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, "bad.json")
			if err := os.WriteFile(p, []byte(c.text), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := ReadFile(p, &Bench{}); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("ReadFile: %v, want %q", err, c.want)
			}
		})
	}
	if err := ReadFile(filepath.Join(dir, "missing.json"), &Bench{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestStatOf(t *testing.T) {
	for _, c := range []struct {
		in          []float64
		med, lo, hi float64
		show        string
	}{
		{[]float64{3, 1, 2}, 2, 1, 3, "2 [1–3]"},
		{[]float64{4, 1, 2, 3}, 2.5, 1, 4, "2 [1–4]"}, // round half to even
		{[]float64{5}, 5, 5, 5, "5"},
		{[]float64{7, 7}, 7, 7, 7, "7"},
	} {
		s := StatOf(c.in)
		if s.Med != c.med || s.Min != c.lo || s.Max != c.hi || s.N != len(c.in) {
			t.Errorf("StatOf(%v) = %+v, want med %v lo %v hi %v", c.in, s, c.med, c.lo, c.hi)
		}
		if got := show(s, fmtF(0)); got != c.show {
			t.Errorf("StatOf(%v) shows %q, want %q", c.in, got, c.show)
		}
	}
	if got := show(StatOf(nil), fmtF(0)); got != "–" {
		t.Errorf("empty stat shows %q", got)
	}
}

// TestLoadRLS: a named RLS file must exist, unless it is the committed one not yet
// written by a first make bench-rls.
func TestLoadRLS(t *testing.T) {
	dir := t.TempDir()
	bench := filepath.Join(dir, "results.json")
	if err := WriteFile(bench, &Bench{}); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "rls.json")
	if _, _, err := Load(Files{Results: bench, RLS: missing}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing named RLS file: %v", err)
	}
	if _, r, err := Load(Files{Results: bench, RLS: missing, RLSOptional: true}); err != nil || r != nil {
		t.Errorf("a missing optional RLS file: %v, %v", r, err)
	}
	if err := WriteFile(missing, &RLS{LoadStart: "0.5 0.5 0.5"}); err != nil {
		t.Fatal(err)
	}
	if _, r, err := Load(Files{Results: bench, RLS: missing, RLSOptional: true}); err != nil || r == nil || r.LoadStart != "0.5 0.5 0.5" {
		t.Errorf("an RLS file: %+v, %v", r, err)
	}
}
