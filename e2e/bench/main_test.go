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
)

// TestQuick runs the whole suite in -quick mode (every phase, short loads, small data)
// and checks that the document has every section with figures in it, so that the runner
// keeps compiling and working against the packages it drives.
func TestQuick(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "BENCHMARKS.md")
	readme := filepath.Join(dir, "README.md")
	if err := os.WriteFile(readme, []byte("# x\n\n"+readmeBegin+"\nold\n"+readmeEnd+"\n\nrest\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var log bytes.Buffer
	start := time.Now()
	err := run(ctx, []string{"-quick", "-out", out, "-readme", readme, "-profiles", filepath.Join(dir, "profiles")}, &log)
	t.Logf("quick run took %s; log:\n%s", time.Since(start).Round(time.Second), log.String())
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Machine", "## Headline",
		"## 1. Gateway overhead", "(c) gateway + Redis", "Highest rate sustained",
		"## 2. Decision engine and 3. peers", "Redis ceiling, redis-benchmark -P 16", "**ours, pipelined (the default)**",
		"## 4. Memory", "`used_memory` delta per bucket", "gateway RSS, 1,000 tenants, 10,000 keys", "`Store.LoadSnapshot`", "heap per live bucket",
		"## 5. Accuracy at scale", "| ours (5 ms timeout, the default) |", "| ours, 100 ms timeout |", "| redis_rate |",
		"## 6. Profiles", "allocations per request",
		"## Commands",
	} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("document lacks %q", want)
		}
	}
	if !regexp.MustCompile(`\| [1-9][0-9,]* \| [0-9.]+% \| [0-9.]+ (µs|ms) \| [0-9,]+ \| [0-9.]+ \|`).Match(doc) {
		t.Errorf("profile: no row with requests, CPU, bytes and allocations per request:\n%s", doc)
	}
	if strings.Contains(string(doc), "NaN") || strings.Contains(string(doc), "Inf") {
		t.Errorf("document has NaN or Inf:\n%s", doc)
	}
	rd, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rd), "old") || !strings.Contains(string(rd), "docs/BENCHMARKS.md") || !strings.HasSuffix(string(rd), readmeEnd+"\n\nrest\n") {
		t.Errorf("README headline not replaced between the markers:\n%s", rd)
	}
	for _, f := range []string{"cpu-top.txt", "alloc-top.txt"} {
		if b, err := os.ReadFile(filepath.Join(dir, "profiles", f)); err != nil || !bytes.Contains(b, []byte("flat%")) {
			t.Errorf("profile summary %s: %v\n%s", f, err, b)
		}
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
		s := statOf(c.in)
		if s.med != c.med || s.lo != c.lo || s.hi != c.hi {
			t.Errorf("statOf(%v) = %+v, want med %v lo %v hi %v", c.in, s, c.med, c.lo, c.hi)
		}
		if got := s.show(fmtF(0)); got != c.show {
			t.Errorf("statOf(%v).show = %q, want %q", c.in, got, c.show)
		}
	}
	if got := statOf(nil).show(fmtF(0)); got != "–" {
		t.Errorf("empty stat shows %q", got)
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
