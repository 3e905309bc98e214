package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/rebalancer/sim"
)

func TestSim(t *testing.T) {
	t.Parallel()
	c := newCLI(t, nil)
	trace := filepath.Join("testdata", "traces", "shift.csv")

	// The static policy's figures depend only on the simulator's model; golden them.
	for _, format := range []string{"table", "json"} {
		r := c.ok("sim", "--trace", trace, "--policy", "static:0.5,0.5", "-o", format)
		golden(t, "sim_static."+format, r.stdout)
	}

	// Every policy, compared: the JSON has the documented fields, one report per policy,
	// and water-filling never admits more than the global limit.
	r := c.ok("sim", "--trace", trace, "--interval", "2m", "-o", "json")
	var reports []sim.Report
	if err := json.Unmarshal([]byte(r.stdout), &reports); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rep := range reports {
		got = append(got, rep.Policy)
		if rep.Trace != "shift.csv" || len(rep.ConvergenceSeconds) != 1 || rep.ConvergenceSeconds[0].Label != "shift to eu-west" {
			t.Errorf("report %+v", rep)
		}
	}
	if want := "waterfill proportional-offered proportional-allowed static:0.7,0.3"; strings.Join(got, " ") != want {
		t.Errorf("policies %v, want %s", got, want)
	}
	if reports[0].OverAdmission != 0 {
		t.Errorf("waterfill over-admission %v", reports[0].OverAdmission)
	}
	for _, field := range []string{`"utilisation"`, `"over_admission"`, `"worst_minute_over_admission"`, `"unnecessary_throttle"`,
		`"worst_region_unnecessary_throttle"`, `"convergence_seconds"`, `"writes"`} {
		if !strings.Contains(r.stdout, field) {
			t.Errorf("JSON lacks %s", field)
		}
	}

	// The table for people, and a trace on standard input.
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	in := newCLI(t, nil)
	in.stdin = string(data)
	r = in.ok("sim", "--trace", "-", "--policy", "waterfill")
	if !strings.Contains(r.stdout, "stdin") || !strings.Contains(r.stdout, "waterfill") || !strings.Contains(r.stdout, "writes") {
		t.Errorf("table: %s", r.stdout)
	}

	bad := filepath.Join(t.TempDir(), "bad.csv")
	if err := os.WriteFile(bad, []byte("time_seconds,region,tenant,offered_rps\n0,us-east,shop-a,-5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		contains string
	}{
		{"no trace", []string{"sim"}, `required flag(s) "trace" not set`},
		{"missing file", []string{"sim", "--trace", "/nonexistent/x.csv"}, "--trace: open /nonexistent/x.csv: no such file or directory"},
		{"bad trace", []string{"sim", "--trace", bad}, "trace bad.csv:"},
		{"bad policy", []string{"sim", "--trace", trace, "--policy", "magic"}, `--policy "magic"`},
		{"bad interval", []string{"sim", "--trace", trace, "--interval", "1500ms"}, "--interval 1.5s: must be whole seconds between 1s and 24h"},
		{"zero capacity", []string{"sim", "--trace", trace, "--capacity", "0"}, "--capacity 0: must be > 0"},
		{"negative refill", []string{"sim", "--trace", trace, "--refill=-1"}, "--refill -1: must be a number > 0"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkError(t, c.run(tc.args...), exitUsage, tc.contains, "") })
	}
}
