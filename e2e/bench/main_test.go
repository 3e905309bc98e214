package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/e2e/bench/results"
)

// TestQuick runs the whole suite in -quick mode (every phase, short loads, small data)
// and checks that the results file has every phase's figures, that the document and
// the README section it renders have every section with figures in it, and that
// -render makes the same document from the results file alone: so the runner keeps
// compiling and working against the packages it drives.
func TestQuick(t *testing.T) {
	dir := t.TempDir()
	resultsFile, out := filepath.Join(dir, "results.json"), filepath.Join(dir, "BENCHMARKS.md")
	readme := filepath.Join(dir, "README.md")
	if err := os.WriteFile(readme, []byte("# x\n\n<!-- bench:begin (test) -->\nold\n<!-- bench:end -->\n\nrest\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var log bytes.Buffer
	start := time.Now()
	err := run(ctx, []string{"-quick", "-results", resultsFile, "-out", out, "-readme", readme, "-profiles", filepath.Join(dir, "profiles")}, &log)
	t.Logf("quick run took %s; log:\n%s", time.Since(start).Round(time.Second), log.String())
	if err != nil {
		t.Fatal(err)
	}
	var res results.Bench
	if err := results.ReadFile(resultsFile, &res); err != nil {
		t.Fatal(err)
	}
	if !res.Run.Quick || res.Run.Commit == "" || res.Overhead == nil || res.Engine == nil || res.Scripts == nil || res.Memory == nil ||
		res.Memory.Redis == nil || res.Memory.Gateway == nil || res.Memory.Local == nil || res.Accuracy == nil || res.Profile == nil {
		t.Fatalf("results file lacks a phase: %+v", res)
	}
	if r := res.Overhead.Latency(2500, "r"); r == nil || !r.AddedP99Ms.Measured() {
		t.Errorf("overhead: no bare reverse proxy path (r) measured: %+v", res.Overhead.Paths)
	}
	for _, name := range []string{"article", "redis_rate", "ours", "ours-batch"} {
		row := res.Scripts.Row(name)
		if row == nil || row.CallsPerS.Med <= 0 || row.DecisionsPerS.Med != row.CallsPerS.Med*float64(row.DecisionsPerCall) || !row.VsArticle.Measured() {
			t.Errorf("scripts: row %s missing or empty: %+v", name, row)
		}
	}
	if row := res.Scripts.Row("ours-batch"); row != nil && row.DecisionsPerCall != 16 {
		t.Errorf("scripts: ours-batch takes %d decisions per call, want 16", row.DecisionsPerCall)
	}
	doc, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Machine", "## Targets", "**This is a `-quick` run",
		"## 1. Gateway overhead", "(c) gateway + Redis", "(r) bare httputil.ReverseProxy", "Highest rate sustained",
		"## 2. Decision engine and peers", "Redis ceiling, redis-benchmark -P 16", "**ours, pipelined (the default)**",
		"## 3. Redis ceiling of each script", "| the article's script |", "| **ours, many buckets per call** |",
		"## 4. Memory", "`used_memory` delta per bucket", "gateway RSS, 1,000 tenants, 10,000 keys", "`Store.LoadSnapshot`", "heap per live bucket",
		"## 5. Accuracy at scale", "| ours (5 ms timeout, the default) |", "| ours, 100 ms timeout |", "| redis_rate |",
		"## 6. Profiles", "allocations per request",
		"## 7. Envoy RLS door", "Not measured: `make bench-rls`",
		"## Commands",
		"| 23 | Redis memory per bucket at 1,000,000 buckets | ≤ 150 B | – | not measured: this run filled fewer than 1,000,000 buckets |",
		"| 23 | p99 a gateway deciding on Redis (c) adds at 2,500 requests/s, over what a bare httputil.ReverseProxy (r) adds, side by side | ≤ 1.1x | (c) ",
	} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("document lacks %q", want)
		}
	}
	if !regexp.MustCompile(`\| [1-9][0-9,]* \| [0-9.]+% \| [0-9.]+ (µs|ms) \| [0-9,]+ \| [0-9.]+ \|`).Match(doc) {
		t.Errorf("profile: no row with requests, CPU, bytes and allocations per request:\n%s", doc)
	}
	for _, bad := range []string{"NaN", "Inf", "<no value>", "%!"} {
		if strings.Contains(string(doc), bad) {
			t.Errorf("document has %q:\n%s", bad, doc)
		}
	}
	rd, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rd), "old") || !strings.Contains(string(rd), "docs/BENCHMARKS.md") || !strings.HasSuffix(string(rd), "<!-- bench:end -->\n\nrest\n") {
		t.Errorf("README headline not replaced between the markers:\n%s", rd)
	}
	for _, f := range []string{"cpu-top.txt", "alloc-top.txt"} {
		if b, err := os.ReadFile(filepath.Join(dir, "profiles", f)); err != nil || !bytes.Contains(b, []byte("flat%")) {
			t.Errorf("profile summary %s: %v\n%s", f, err, b)
		}
	}
	// The results file alone renders the same document.
	again := filepath.Join(dir, "again.md")
	if err := run(ctx, []string{"-render", "-results", resultsFile, "-out", again}, &log); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(again); !bytes.Equal(b, doc) {
		t.Errorf("-render from %s differs from the document the run wrote", resultsFile)
	}
}

// TestOptions: which files a run writes, and the refusals.
func TestOptions(t *testing.T) {
	root := "/repo"
	tmp := os.TempDir()
	for _, c := range []struct {
		name                 string
		args                 []string
		results, doc, readme string
		err                  string
		rls                  string
	}{
		{"full run: the committed files", nil, "/repo/docs/bench/results.json", "/repo/docs/BENCHMARKS.md", "/repo/README.md", "", "/repo/docs/bench/rls.json"},
		{"render: the committed files", []string{"-render"}, "/repo/docs/bench/results.json", "/repo/docs/BENCHMARKS.md", "/repo/README.md", "", "/repo/docs/bench/rls.json"},
		{"quick: temporary files", []string{"-quick"}, tmp + "/quotaplane-bench-quick.json", tmp + "/quotaplane-bench-quick.md", "", "", ""},
		{"part of the suite: temporary files", []string{"-phases", "engine"}, tmp + "/quotaplane-bench-partial.json", tmp + "/quotaplane-bench-partial.md", "", "", ""},
		{"-out names the results beside it", []string{"-out", "/x/b.md"}, "/x/b.json", "/x/b.md", "", "", ""},
		{"render a file of its own", []string{"-render", "-results", "/x/r.json"}, "/x/r.json", "/x/r.md", "", "", ""},
		{"render with RLS results", []string{"-render", "-results", "/x/r.json", "-rls", "/x/rls.json"}, "/x/r.json", "/x/r.md", "", "", "/x/rls.json"},
		{"render needs its results", []string{"-render", "-out", "/x/b.md"}, "", "", "", "give -results", ""},
		{"render measures nothing", []string{"-render", "-quick"}, "", "", "", "measures nothing", ""},
		{"unknown phase", []string{"-phases", "nope"}, "", "", "", `unknown phase "nope"`, ""},
		{"same file twice", []string{"-results", "/x/a", "-out", "/x/a"}, "", "", "", "same file", ""},
		{"runs out of range", []string{"-runs", "10"}, "", "", "", "want 1..9", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseOptions(c.args, root)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.files.Results != c.results || o.files.Benchmarks != c.doc || o.files.Readme != c.readme || o.files.RLS != c.rls {
				t.Errorf("files %+v, want results %s, document %s, readme %q, rls %q", o.files, c.results, c.doc, c.readme, c.rls)
			}
		})
	}
}

func TestParseBench(t *testing.T) {
	out := []byte("goos: linux\nBenchmarkDecisionEngine/keys=hot/callers=16/round=1/mode=pipelined-2   \t   19776\t     32884 ns/op\t         1.000 admitted/decision\t     30410 decisions/s\t       458.8 p50-µs\t 595 B/op\t      14 allocs/op\nPASS\n")
	lines := parseBench(out)
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1", len(lines))
	}
	l := lines[0]
	if l.name != "BenchmarkDecisionEngine/keys=hot/callers=16/round=1/mode=pipelined" || l.n != 19776 {
		t.Errorf("name %q n %d", l.name, l.n)
	}
	for unit, want := range map[string]float64{"ns/op": 32884, "decisions/s": 30410, "p50-µs": 458.8, "allocs/op": 14, "B/op": 595} {
		if l.metrics[unit] != want {
			t.Errorf("%s = %v, want %v", unit, l.metrics[unit], want)
		}
	}
}

func TestParseTraces(t *testing.T) {
	out := `File: gateway
Type: cpu
-----------+-------------------------------------------------------
      10ms   crypto/sha256.block
             github.com/quotaplane/quotaplane/gateway.hashKey
             net/http.(*conn).serve
-----------+-------------------------------------------------------
      1.5s   syscall.Syscall
             github.com/redis/go-redis/v9.(*baseClient).pipelineProcessCmds
-----------+-------------------------------------------------------
     512kB   runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
`
	tr := parseTraces(out)
	if len(tr) != 3 || tr[0].value != 10e6 || tr[1].value != 1.5e9 || tr[2].value != 512*1024 || len(tr[0].frames) != 3 {
		t.Fatalf("parseTraces = %+v", tr)
	}
	by, total := classify(tr)
	if total != 10e6+1.5e9+512*1024 {
		t.Errorf("total %v", total)
	}
	name := func(i int) string { return costClasses[i].name }
	for i := range costClasses {
		switch {
		case strings.HasPrefix(name(i), "API-key hash") && by[i] != 10e6,
			strings.HasPrefix(name(i), "Redis decision") && by[i] != 1.5e9,
			strings.HasPrefix(name(i), "garbage collection") && by[i] != 512*1024:
			t.Errorf("class %q got %v", name(i), by[i])
		}
	}
}
