package main

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDynamicCompletion: cobra's __complete (what the shell scripts call at Tab) offers the
// regions, tenants and key ids of the database the command would use, and nothing, quickly
// and silently, when it cannot reach one.
func TestDynamicCompletion(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("regions", "add", "us-east")
	c.ok("regions", "add", "eu-west")
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "search", "--capacity", "10", "--refill", "1")
	c.ok("keys", "create", "--tenant", "shop-b", "--label", "ci")
	c.ok("keys", "create", "--tenant", "shop-c")
	c.ok("keys", "revoke", "2")

	// Directives: 4 no file completion, 6 that and no space.
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"regions remove", []string{"regions", "remove", ""}, "eu-west\nus-east\n:4\n"},
		{"regions remove, prefix", []string{"regions", "remove", "u"}, "us-east\n:4\n"},
		{"regions remove, one argument", []string{"regions", "remove", "us-east", ""}, ":4\n"},
		{"bucket inspect --region", []string{"bucket", "inspect", "--region", ""}, "eu-west\nus-east\n:4\n"},
		{"rules list --tenant", []string{"rules", "list", "--tenant", ""}, "shop-a\nshop-b\nshop-c\n:4\n"},
		{"keys create --tenant, prefix", []string{"keys", "create", "--tenant", "shop-b"}, "shop-b\n:4\n"},
		{"shares set --tenant", []string{"shares", "set", "--tenant", "shop-"}, "shop-a\nshop-b\nshop-c\n:4\n"},
		{"status --tenant", []string{"status", "--tenant", ""}, "shop-a\nshop-b\nshop-c\n:4\n"},
		{"keys revoke: valid keys only", []string{"keys", "revoke", ""}, "1\tshop-b ci\n:4\n"},
		{"shares set regions", []string{"shares", "set", "us-east=0.5", ""}, "eu-west=\n:6\n"},
		{"shares set, share being typed", []string{"shares", "set", "us-east="}, ":4\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.ok(append([]string{"__complete"}, tc.args...)...)
			if r.stdout != tc.want {
				t.Errorf("__complete %q:\n got %q\nwant %q", tc.args, r.stdout, tc.want)
			}
		})
	}

	t.Run("with --database-url", func(t *testing.T) {
		r := newCLI(t, nil).ok("__complete", "--database-url", url, "regions", "remove", "")
		if want := "eu-west\nus-east\n:4\n"; r.stdout != want {
			t.Errorf("got %q, want %q", r.stdout, want)
		}
	})
	t.Run("old variable", func(t *testing.T) {
		r := newCLI(t, map[string]string{envDatabaseURLOld: url}).ok("__complete", "regions", "remove", "")
		if want := "eu-west\nus-east\n:4\n"; r.stdout != want {
			t.Errorf("got %q, want %q", r.stdout, want)
		}
	})

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "postgres://alice:Sekr1t-pass@127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port) + "/db?sslmode=disable"
	l.Close()
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"no database", nil},
		{"database unreachable", map[string]string{envDatabaseURL: dead}},
		{"wrong database", map[string]string{envDatabaseURL: strings.Replace(url, "/"+lastPathPart(url), "/nonexistent_db", 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := newCLI(t, tc.env).ok("__complete", "regions", "remove", "")
			if r.stdout != ":4\n" {
				t.Errorf("stdout %q, want no candidates", r.stdout)
			}
			if strings.Contains(r.stderr, "Sekr1t-pass") || strings.Contains(r.stderr, "ratectl:") {
				t.Errorf("stderr %q: want cobra's directive line only", r.stderr)
			}
			if d := time.Since(start); d > completionTimeout+time.Second {
				t.Errorf("completion took %v, want at most %v", d, completionTimeout)
			}
		})
	}
}

// lastPathPart is the database name of a URL without a query.
func lastPathPart(u string) string {
	u, _, _ = strings.Cut(u, "?")
	return u[strings.LastIndex(u, "/")+1:]
}
