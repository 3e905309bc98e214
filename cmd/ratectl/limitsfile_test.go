package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/version"
)

// TestLimitsFileRefused: a limits file store.ParseLimits refuses (its tests hold the
// cases) is a usage error naming the file, read before the database is dialled: an id
// that YAML reads as a number, a "billion laughs" file of a few hundred bytes.
func TestLimitsFileRefused(t *testing.T) {
	t.Parallel()
	var laughs strings.Builder
	laughs.WriteString("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i <= 9; i++ {
		p := fmt.Sprintf("*a%d", i-1)
		fmt.Fprintf(&laughs, "a%d: &a%d [%s]\n", i, i, strings.Repeat(p+", ", 9)+p)
	}
	for _, tc := range []struct{ name, yaml, contains string }{
		{"tenant 0042", "rules:\n  - {tenant: 0042, route: '*', capacity: 1, refill_per_second: 1}\n", `line 2: rules[0].tenant: 0042 is read by YAML as a number, not as the text written: quote it ("0042")`},
		{"billion laughs", laughs.String(), "YAML nodes once aliases are expanded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "limits.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			r := newCLI(t, nil).run("diff", "-f", path)
			checkError(t, r, exitUsage, tc.contains, "")
			if !strings.HasPrefix(r.stderr, "ratectl: "+path+": ") {
				t.Errorf("stderr %q does not name the file first", r.stderr)
			}
		})
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
