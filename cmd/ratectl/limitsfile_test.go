package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/version"
)

// TestLimitsFileStrict: what YAML would silently read as something else than written is
// refused, naming the line and the field: an id that YAML reads as a number, a fractional
// capacity, a second document; quoted ids are read exactly as written.
func TestLimitsFileStrict(t *testing.T) {
	t.Parallel()
	const rule = `{tenant: "*", route: "*", capacity: 1, refill_per_second: 1}`
	for _, tc := range []struct{ name, yaml, contains string }{
		{"tenant 0042", "rules:\n  - " + rule + "\n  - {tenant: 0042, route: '*', capacity: 1, refill_per_second: 1}\n", `line 3: rules[1].tenant: 0042 is read by YAML as a number, not as the text written: quote it ("0042")`},
		{"route 1.10", "rules:\n  - {tenant: a, route: 1.10, capacity: 1, refill_per_second: 1}\n", `line 2: rules[0].route: 1.10 is read by YAML as a number`},
		{"region number", "regions: [us-east, 1.10]\n", `line 1: regions[1]: 1.10 is read by YAML as a number`},
		{"region bool", "regions:\n  - true\n", `line 2: regions[0]: true is read by YAML as a boolean`},
		{"key tenant", "keys:\n  - {sha256: x, tenant: 7}\n", `keys[0].tenant: 7 is read by YAML as a number`},
		{"share region", "regions: ['1']\noverrides:\n  - {scope: '*', shares: {1: 1}, reason: x}\n", `line 3: overrides[0].shares key: 1 is read by YAML as a number`},
		{"fractional capacity", "rules:\n  - {tenant: '*', route: '*', capacity: 20.7, refill_per_second: 1}\n", `line 2: rules[0].capacity: 20.7 is not a whole number`},
		{"fractional shards", "rules:\n  - {tenant: '*', route: '*', capacity: 2, refill_per_second: 1, shards: 1.5}\n", `rules[0].shards: 1.5 is not a whole number`},
		{"tagged number", "regions: [!!str 1.10]\n", `regions[0]: 1.10 is read by YAML as a number`},
		{"second document", "regions: [a]\n---\nregions: [b]\n", `line 3: a second YAML document (after ---): a limits file holds one`},
		{"deep", "regions: " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\n", "nested deeper than 64 levels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "limits.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			// The file is read before the database is dialled: no database needed.
			checkError(t, newCLI(t, nil).run("diff", "-f", path), exitUsage, tc.contains, "")
		})
	}

	f, err := decodeLimits(context.Background(), []byte("regions: [\"0042\", '1.10']\nrules:\n  - {tenant: \"0042\", route: '1.10', capacity: 3, refill_per_second: 0.5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := *f.Regions; len(got) != 2 || got[0] != "0042" || got[1] != "1.10" {
		t.Errorf("regions %q, want [0042 1.10] as written", got)
	}
	if r := (*f.Rules)[0]; r.Tenant != "0042" || r.Route != "1.10" || r.Capacity != 3 {
		t.Errorf("rule %+v, want tenant 0042, route 1.10 as written", r)
	}
}

// TestLimitsFileBudget: a "billion laughs" file of a few hundred bytes (nine levels of ten
// aliases: 10^9 nodes expanded) fails at once with an error naming the budget, instead of
// eating gigabytes; and reading stops when the context ends (SIGTERM).
func TestLimitsFileBudget(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i <= 9; i++ {
		p := fmt.Sprintf("*a%d", i-1)
		fmt.Fprintf(&b, "a%d: &a%d [%s]\n", i, i, strings.Repeat(p+", ", 9)+p)
	}
	laughs := b.String()
	if len(laughs) > 600 {
		t.Fatalf("the file is %d bytes, want a few hundred", len(laughs))
	}
	start := time.Now()
	_, err := decodeLimits(context.Background(), []byte(laughs))
	if err == nil || !strings.Contains(err.Error(), "more than 5000000 YAML nodes once aliases are expanded") {
		t.Errorf("billion laughs: %v, want the node budget's error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("billion laughs took %v to refuse", d)
	}
	path := filepath.Join(t.TempDir(), "laughs.yaml")
	if err := os.WriteFile(path, []byte(laughs), 0o644); err != nil {
		t.Fatal(err)
	}
	checkError(t, newCLI(t, nil).run("diff", "-f", path), exitUsage, "YAML nodes once aliases are expanded", "")

	// A large valid file, read with the context already cancelled.
	var big strings.Builder
	big.WriteString("rules:\n")
	for i := range 20000 {
		fmt.Fprintf(&big, "  - {tenant: t%d, route: r, capacity: 1, refill_per_second: 1}\n", i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := decodeLimits(ctx, []byte(big.String())); !errors.Is(err, context.Canceled) {
		t.Errorf("decode after cancel: %v, want context.Canceled", err)
	}
}

// TestLimitsReadStopsOnCancel: diff -f - whose stdin never closes returns once the
// command's context ends (SIGTERM cancels it in main), instead of waiting for the input.
func TestLimitsReadStopsOnCancel(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	a := &app{
		getenv: func(string) string { return "" },
		now:    time.Now,
		actor:  func() (string, error) { return "alice", nil },
		stdin:  pr,
		build:  version.Get,
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // as SIGTERM does
	var out, errb strings.Builder
	code := a.execute(ctx, []string{"diff", "-f", "-"}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "reading stopped: context canceled") {
		t.Errorf("diff -f - cancelled: exit %d, stderr %q; want an error saying the read stopped", code, errb.String())
	}
}
