package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/internal/version"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m)) }

// result is what one ratectl invocation produced.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs ratectl in-process with a controlled environment: no variables but env, the
// operator "alice", a fixed build, and now() from clock when set, else the real time.
type cli struct {
	t     testing.TB
	env   map[string]string
	clock func() time.Time
	stdin string
}

func newCLI(t testing.TB, env map[string]string) *cli {
	return &cli{t: t, env: env}
}

func (c *cli) run(args ...string) result {
	c.t.Helper()
	now := c.clock
	if now == nil {
		now = time.Now
	}
	a := &app{
		getenv: func(k string) string { return c.env[k] },
		now:    now,
		actor:  func() (string, error) { return "alice", nil },
		stdin:  strings.NewReader(c.stdin),
		build: func() version.Info {
			return version.Info{Version: "v0.0.0-test", Commit: "0123456789abcdef", Date: "2026-11-30T21:00:00Z", GoVersion: "go1.26", Platform: "linux/amd64"}
		},
	}
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code := a.execute(ctx, args, &out, &errb)
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// ok runs args and fails the test unless they succeed.
func (c *cli) ok(args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 0 {
		c.t.Fatalf("ratectl %s: exit %d\nstderr: %s\nstdout: %s", strings.Join(args, " "), r.code, r.stderr, r.stdout)
	}
	return r
}

var timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)

// normTimes replaces every RFC 3339 time by a placeholder of the same width as the
// tables print, so golden files do not depend on when the test ran.
func normTimes(s string) string { return timeRE.ReplaceAllString(s, "YYYY-MM-DDThh:mm:ssZ") }

// golden compares got with testdata/NAME.golden, or rewrites the file with -update.
func golden(t testing.TB, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden file %s: %v (run go test -update to create it)", path, err)
	}
	if string(want) != got {
		t.Errorf("output differs from %s (run go test -update after checking it):\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}
