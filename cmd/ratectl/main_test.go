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

// TestOldEnvNames: RATECTL_PROMETHEUS_URL and RATECTL_ACTOR, ratectl's former names, are
// still read, with one deprecation line each, and lose silently to the RATELIMIT_ names.
func TestOldEnvNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		code int
		warn string // "" none
		err  string // on stderr, when code is not 0
	}{
		{name: "old prometheus", env: map[string]string{envPrometheusURLOld: "http://127.0.0.1:1"},
			warn: "ratectl: warning: RATECTL_PROMETHEUS_URL is deprecated: set RATELIMIT_PROMETHEUS_URL"},
		{name: "new prometheus", env: map[string]string{envPrometheusURL: "http://127.0.0.1:1"}},
		{name: "both prometheus", env: map[string]string{envPrometheusURL: "http://127.0.0.1:1", envPrometheusURLOld: "http://127.0.0.1:2"}},
		{name: "old actor", env: map[string]string{envActorOld: "ci"},
			warn: "ratectl: warning: RATECTL_ACTOR is deprecated: set RATELIMIT_ACTOR"},
		{name: "old actor is read", env: map[string]string{envActorOld: " "}, code: exitUsage,
			warn: "ratectl: warning: RATECTL_ACTOR is deprecated", err: "ratectl: --actor: must not be blank"},
		{name: "new actor", env: map[string]string{envActor: "ci"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newCLI(t, tc.env).run("version")
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			switch {
			case r.code != tc.code:
				t.Errorf("exit %d, want %d; stderr %q", r.code, tc.code, r.stderr)
			case tc.warn == "" && r.stderr != "":
				t.Errorf("stderr %q, want none", r.stderr)
			case tc.warn != "" && !strings.HasPrefix(lines[0], tc.warn):
				t.Errorf("stderr %q, want a first line starting %q", r.stderr, tc.warn)
			case tc.err != "" && (len(lines) != 2 || lines[1] != tc.err):
				t.Errorf("stderr %q, want the warning then %q", r.stderr, tc.err)
			case tc.err == "" && tc.warn != "" && len(lines) != 1:
				t.Errorf("stderr %q, want one line", r.stderr)
			}
		})
	}
}
