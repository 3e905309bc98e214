package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

func TestParseDays(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"7d", 7 * 24 * time.Hour, false},
		{"2w", 14 * 24 * time.Hour, false},
		{"1d12h", 36 * time.Hour, false},
		{"90m", 90 * time.Minute, false},
		{"0", 0, false},
		{"-1d", 0, true},
		{"-5m", 0, true},
		{"7days", 0, true},
		{"d", 0, true},
		{"", 0, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseDays(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("parseDays(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

// TestDatabaseURLEnv: RATELIMIT_DATABASE_URL is the name all three binaries read; the old
// RATECTL_DATABASE_URL still works, with one deprecation line, and loses to the new one.
func TestDatabaseURLEnv(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresDB(t)
	newCLI(t, map[string]string{envDatabaseURL: url}).ok("migrate", "up")

	r := newCLI(t, map[string]string{envDatabaseURL: url}).ok("regions", "list")
	if r.stderr != "" {
		t.Errorf("new variable: stderr %q, want none", r.stderr)
	}
	r = newCLI(t, map[string]string{envDatabaseURLOld: url}).ok("regions", "list")
	if want := "ratectl: warning: RATECTL_DATABASE_URL is deprecated: set RATELIMIT_DATABASE_URL"; !strings.HasPrefix(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("old variable: stderr %q, want one line starting %q", r.stderr, want)
	}
	r = newCLI(t, map[string]string{envDatabaseURL: url, envDatabaseURLOld: "postgres://nobody@127.0.0.1:1/x"}).ok("regions", "list")
	if r.stderr != "" {
		t.Errorf("both variables: stderr %q, want none (the new one wins, silently)", r.stderr)
	}
}

// TestUnmigratedDatabase: a database without the schema names the fix, not the SQL error.
func TestUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	c := newCLI(t, map[string]string{envDatabaseURL: testenv.PostgresDB(t)})
	for _, args := range [][]string{{"regions", "list"}, {"rules", "list"}, {"shares", "get"}, {"audit"}, {"export"}} {
		r := c.run(args...)
		checkError(t, r, exitFailure, "run `ratectl migrate up`", "")
		if strings.Contains(r.stderr, "list regions: list regions") {
			t.Errorf("%v: stutters: %q", args, r.stderr)
		}
	}
}

// TestTLSFailure: a server whose certificate we do not trust is a TLS failure, said so,
// with exit 1 (retrying will not help), not "unreachable" (exit 3).
func TestTLSFailure(t *testing.T) {
	t.Parallel()
	served, err := testenv.NewTLSFiles(filepath.Join(t.TempDir(), "served"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := testenv.NewTLSFiles(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	pg := testenv.PostgresTLSServer(t, served)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pg.CreateDatabase(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	good := pg.TLSURL("q", served.CAFile)
	bad := pg.TLSURL("q", other.CAFile)
	newCLI(t, nil).ok("migrate", "up", "--database-url", good) // the server works
	r := newCLI(t, nil).run("migrate", "status", "--database-url", bad)
	checkError(t, r, exitFailure, "TLS failed", "")
	if strings.Contains(r.stderr, "unreachable") {
		t.Errorf("TLS failure reported as unreachable: %q", r.stderr)
	}
}

// TestURLSecretNeverEchoed: whatever is given as the database URL, no secret of it is
// printed: a password pasted where the URL goes is hidden whole.
func TestURLSecretNeverEchoed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, url, secret string }{
		{"bare word", "s3cretPW", "s3cretPW"},
		{"bare word with spaces around", " s3cretPW ", "s3cretPW"},
		{"bad port", "postgres://ops:hunter2-Pw@127.0.0.1:notaport/x", "hunter2-Pw"},
		{"key=value garbage", "host=127.0.0.1 password='unterminated-Pw", "unterminated-Pw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, env := range []map[string]string{nil, {envDatabaseURL: tc.url}, {envDatabaseURLOld: tc.url}} {
				args := []string{"regions", "list"}
				if env == nil {
					args = append(args, "--database-url", tc.url)
				}
				r := newCLI(t, env).run(args...)
				if r.code == exitOK {
					t.Fatalf("%v %v: succeeded", env, args)
				}
				if strings.Contains(r.stderr+r.stdout, tc.secret) {
					t.Errorf("%v %v: output shows the secret: %q", env, args, r.stderr)
				}
			}
		})
	}
}

// TestMigrateDown: `migrate down` plans the roll-back of the newest migration and writes
// nothing; with --apply it rolls that one back (and only that one); up restores it.
func TestMigrateDown(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	applied := func() int {
		return sqlInt(t, url, `SELECT count(DISTINCT version_id) FROM goose_db_version WHERE version_id > 0 AND is_applied`)
	}
	latest := applied()
	r := c.ok("migrate", "down")
	if want := fmt.Sprintf("would roll back migration %d (", latest); !strings.Contains(r.stdout, want) {
		t.Errorf("plan: %q, want it to name migration %d", r.stdout, latest)
	}
	if n := applied(); n != latest {
		t.Fatalf("a plan rolled back: %d migrations applied, want %d", n, latest)
	}
	c.ok("migrate", "down", "--apply")
	if n := applied(); n != latest-1 {
		t.Errorf("after migrate down --apply: %d migrations applied, want %d", n, latest-1)
	}
	c.ok("migrate", "up")
	if n := applied(); n != latest {
		t.Errorf("after migrate up: %d migrations applied, want %d", n, latest)
	}
	c.ok("regions", "add", "r1")
}

// TestRedisURLEnv: bucket inspect reads the gateway's RATELIMIT_REDIS_URL; the old
// RATECTL_REDIS_URL still works, with one deprecation line, and loses to the new one.
func TestRedisURLEnv(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(testenv.Redis(t))
	args := []string{"bucket", "inspect", "--tenant", "shop-a", "--route", "r", "--capacity", "10", "--refill", "1"}
	r := newCLI(t, map[string]string{envRedisURL: url}).ok(args...)
	if r.stderr != "" {
		t.Errorf("new variable: stderr %q, want none", r.stderr)
	}
	r = newCLI(t, map[string]string{envRedisURLOld: url}).ok(args...)
	if want := "ratectl: warning: RATECTL_REDIS_URL is deprecated: set RATELIMIT_REDIS_URL"; !strings.HasPrefix(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("old variable: stderr %q, want one line starting %q", r.stderr, want)
	}
	r = newCLI(t, map[string]string{envRedisURL: url, envRedisURLOld: "redis://127.0.0.1:1/0"}).ok(args...)
	if r.stderr != "" {
		t.Errorf("both variables: stderr %q, want none (the new one wins, silently)", r.stderr)
	}
}

// TestHelpNamesEnv: --help names every variable ratectl reads, and the flag it stands for.
func TestHelpNamesEnv(t *testing.T) {
	t.Parallel()
	root := newCLI(t, nil).ok("--help").stdout
	for _, e := range []string{envDatabaseURL, envDatabaseURLOld, envRedisURL, envRedisURLOld, envPrometheusURL, envActor} {
		if !strings.Contains(root, e) {
			t.Errorf("ratectl --help does not name %s:\n%s", e, root)
		}
	}
	if h := newCLI(t, nil).ok("bucket", "inspect", "--help").stdout; !strings.Contains(h, "(env "+envRedisURL+")") {
		t.Errorf("bucket inspect --help does not name %s:\n%s", envRedisURL, h)
	}
}
