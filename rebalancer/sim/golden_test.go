package sim

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.csv and the results table in docs/rebalancer.md")

// The shipped traces are generated here (fixed seeds), so they can be read, changed and
// regenerated: go test ./rebalancer/sim -run 'TestGoldenTraces|TestWriteTable' -update
var traces = []struct {
	file    string
	regions []string
	gen     func(w *traceWriter)
}{
	{"steady-70-30.csv", twoRegions, genSteady},
	{"follow-the-sun.csv", []string{"us-east", "eu-west", "ap-south"}, genFollowTheSun},
	{"flash-crowd.csv", twoRegions, genFlashCrowd},
	{"dark-failover.csv", twoRegions, genDarkFailover},
	{"untracked-tail.csv", []string{"us-east", "eu-west", "ap-south"}, genUntrackedTail},
}

var twoRegions = []string{"us-east", "eu-west"}

type traceWriter struct {
	b   bytes.Buffer
	rng *rand.Rand
}

func newTraceWriter(seed uint64, comment string, regions ...string) *traceWriter {
	w := &traceWriter{rng: rand.New(rand.NewPCG(seed, 1))}
	for _, l := range strings.Split(comment, "\n") {
		fmt.Fprintf(&w.b, "# %s\n", l)
	}
	fmt.Fprintf(&w.b, "# regions,%s\n", strings.Join(regions, ","))
	return w
}

func (w *traceWriter) event(t int, tenant, label string) {
	fmt.Fprintf(&w.b, "# event,%d,%s,%s\n", t, tenant, label)
}

func (w *traceWriter) header() { fmt.Fprintln(&w.b, Header) }

// row writes offered rps with +-10% uniform noise, rounded to 0.1.
func (w *traceWriter) row(t int, region, tenant string, rps float64) {
	v := rps * (0.9 + 0.2*w.rng.Float64())
	fmt.Fprintf(&w.b, "%d,%s,%s,%.1f\n", t, region, tenant, math.Round(v*10)/10)
}

func genSteady(w *traceWriter) {
	w.event(0, "*", "start at the equal split")
	w.header()
	for t := 0; t < 3600; t += 10 {
		w.row(t, "us-east", "big", 910) // 1300 rps offered against a 1000 rps limit, 70/30
		w.row(t, "eu-west", "big", 390)
		w.row(t, "us-east", "small", 600) // the example: 600/100 under a 1000 limit
		w.row(t, "eu-west", "small", 100)
	}
}

func genFollowTheSun(w *traceWriter) {
	// A six-hour "day": each region's demand is a raised-cosine bump centred on its
	// local noon, so the peak moves us-east -> eu-west -> ap-south -> us-east.
	regions := []string{"us-east", "eu-west", "ap-south"}
	peak := []float64{850, 650, 450}
	noon := []float64{0, 2 * 3600, 4 * 3600}
	const day = 6 * 3600
	w.event(1*3600, "*", "peak moves us-east to eu-west")
	w.event(3*3600, "*", "peak moves eu-west to ap-south")
	w.event(5*3600, "*", "peak moves ap-south to us-east")
	w.header()
	for t := 0; t < day; t += 30 {
		for i, r := range regions {
			phase := 2 * math.Pi * (float64(t) - noon[i]) / day
			bump := math.Pow((1+math.Cos(phase))/2, 3)
			w.row(t, r, "global", 60+peak[i]*bump)
		}
	}
}

func genFlashCrowd(w *traceWriter) {
	w.event(900, "shop", "flash crowd in eu-west")
	w.event(1380, "shop", "flash crowd over")
	w.event(2400, "shop", "second spike in eu-west")
	w.header()
	for t := 0; t < 3600; t += 10 {
		eu := 150.0
		switch {
		case t >= 900 && t < 1380:
			eu = 650
		case t >= 2400 && t < 2700:
			eu = 450
		}
		w.row(t, "us-east", "shop", 500)
		w.row(t, "eu-west", "shop", eu)
	}
}

func genDarkFailover(w *traceWriter) {
	w.event(1200, "shop", "us-east dark, traffic fails over to eu-west")
	w.event(2400, "shop", "us-east back")
	w.header()
	for t := 0; t < 4200; t += 10 {
		if t >= 1200 && t < 2400 {
			w.row(t, "eu-west", "shop", 800) // us-east has no rows: dark
			continue
		}
		w.row(t, "us-east", "shop", 560)
		w.row(t, "eu-west", "shop", 240)
	}
}

// genUntrackedTail is issue 22's tail: tenants without a scope of their own (they follow
// "*"), single-region tenants, sub-threshold noise, tenants arriving, and a region added
// (dark at first, then with a little traffic) and removed again.
func genUntrackedTail(w *traceWriter) {
	fmt.Fprintln(&w.b, "# untracked,solo,late,noise-1,noise-2,noise-3,noise-4")
	fmt.Fprintln(&w.b, "# region-added,1200,ap-south")
	fmt.Fprintln(&w.b, "# region-removed,2700,ap-south")
	w.event(0, "solo", "an untracked tenant sends everything to us-east")
	w.event(1200, "*", "ap-south added, no gateways yet")
	w.event(3000, "late", "a new untracked tenant arrives in us-east after solo left")
	w.header()
	for t := 0; t < 3600; t += 10 {
		w.row(t, "us-east", "big", 650) // tracked, two regions, at its limit
		w.row(t, "eu-west", "big", 350)
		w.row(t, "us-east", "one-region", 300) // tracked, all in us-east
		if t < 2400 {
			w.row(t, "us-east", "solo", 800) // untracked, all in us-east, below its limit
		}
		if t >= 3000 {
			w.row(t, "us-east", "late", 400) // untracked, new
		}
		for k := 1; k <= 4; k++ { // untracked trickles in eu-west, coming and going
			if (t/300+k)%3 != 0 {
				w.row(t, "eu-west", fmt.Sprintf("noise-%d", k), 0.1*float64(k))
			}
		}
		if t >= 1500 && t < 2700 { // ap-south's gateways report: a little of big
			w.row(t, "ap-south", "big", 30)
		}
	}
}

func generate(file string) []byte {
	for _, tc := range traces {
		if tc.file != file {
			continue
		}
		var seed uint64
		for _, c := range file {
			seed = seed*31 + uint64(c)
		}
		w := newTraceWriter(seed, "generated by rebalancer/sim/golden_test.go ("+strings.TrimSuffix(file, ".csv")+"); regenerate with -update\nlimit per tenant: capacity 2000, refill 1000 rps", tc.regions...)
		tc.gen(w)
		return w.b.Bytes()
	}
	panic("unknown trace " + file)
}

func TestGoldenTraces(t *testing.T) {
	for _, tc := range traces {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join("testdata", tc.file)
			want := generate(tc.file)
			if *update {
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs from its generator; run with -update", path)
			}
			if _, err := ParseTrace(bytes.NewReader(got)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// loadTraces parses the shipped traces.
func loadTraces(t testing.TB) []*Trace {
	t.Helper()
	var out []*Trace
	for _, tc := range traces {
		f, err := os.Open(filepath.Join("testdata", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := ParseTrace(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		tr.Name = strings.TrimSuffix(tc.file, ".csv")
		out = append(out, tr)
	}
	return out
}

// runAll runs every compared policy on every shipped trace with the default config.
func runAll(t testing.TB) []Report {
	t.Helper()
	var out []Report
	for _, tr := range loadTraces(t) {
		for _, p := range ComparePolicies(len(tr.Regions)) {
			rep, err := Run(tr, p, DefaultConfig())
			if err != nil {
				t.Fatalf("%s %s: %v", tr.Name, p, err)
			}
			out = append(out, rep)
		}
	}
	return out
}

const (
	tableBegin = "<!-- sim-table:begin (generated: go test ./rebalancer/sim -run TestWriteTable -update) -->\n"
	tableEnd   = "<!-- sim-table:end -->\n"
)

// TestWriteTable keeps the results table in docs/rebalancer.md in step with the code.
func TestWriteTable(t *testing.T) {
	var table bytes.Buffer
	if err := WriteMarkdown(&table, runAll(t)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "docs", "rebalancer.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(doc), tableBegin)
	_, after, ok2 := strings.Cut(rest, tableEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s: no table markers %q ... %q", path, tableBegin, tableEnd)
	}
	want := before + tableBegin + table.String() + tableEnd + after
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if string(doc) != want {
		t.Fatalf("the table in %s is stale; run: go test ./rebalancer/sim -run TestWriteTable -update\nwant:\n%s", path, table.String())
	}
}
