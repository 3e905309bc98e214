package main

import (
	"strconv"
	"strings"
	"testing"
)

// TestHostileIDs feeds ids built to attack the database or to fool an operator (SQL
// metacharacters, Unicode look-alikes of valid ids, invisible characters, over-long ids)
// to every command that takes one: each is refused as a usage error before anything is
// read or written, and the database is unchanged.
func TestHostileIDs(t *testing.T) {
	t.Parallel()
	c, url := newDB(t)
	c.ok("regions", "add", "us-east")
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "create-order", "--capacity", "10", "--refill", "1")
	count := func() string {
		return strings.Join([]string{
			strconv.Itoa(sqlInt(t, url, `SELECT count(*) FROM region`)),
			strconv.Itoa(sqlInt(t, url, `SELECT count(*) FROM rate_limit_rule`)),
			strconv.Itoa(sqlInt(t, url, `SELECT count(*) FROM api_key`)),
			strconv.Itoa(sqlInt(t, url, `SELECT count(*) FROM region_share`)),
			strconv.Itoa(sqlInt(t, url, `SELECT count(*) FROM audit_log`)),
		}, "/")
	}
	before := count()
	hostile := []struct{ name, id string }{
		{"quote and comment", "shop-a'--"},
		{"statement", "x'; DROP TABLE rate_limit_rule; --"},
		{"boolean injection", "' OR '1'='1"},
		{"semicolon", "a;b"},
		{"percent (LIKE wildcard)", "shop%"},
		{"backslash", `shop\a`},
		{"Cyrillic a in shop-a", "shop-\u0430"},
		{"fullwidth letters", "\uff53\uff48\uff4f\uff50"},
		{"zero-width space", "shop\u200b-a"},
		{"right-to-left override", "shop-\u202ea"},
		{"combining accent", "shope\u0301"},
		{"NUL byte", "shop\x00a"},
		{"newline", "shop\na"},
		{"65 characters", strings.Repeat("a", 65)},
		{"a kilobyte", strings.Repeat("t", 1024)},
		{"slash (scope separator)", "shop/a"},
		{"braces (Redis hash tag)", "shop{a}"},
		{"colon (Redis key separator)", "shop:a"},
	}
	for _, h := range hostile {
		for _, args := range [][]string{
			{"rules", "set", "--apply", "--tenant", h.id, "--route", "create-order", "--capacity", "5", "--refill", "1"},
			{"rules", "set", "--apply", "--tenant", "shop-a", "--route", h.id, "--capacity", "5", "--refill", "1"},
			{"rules", "list", "--tenant", h.id},
			{"keys", "create", "--tenant", h.id},
			{"keys", "list", "--tenant", h.id},
			{"regions", "add", h.id},
			{"shares", "get", "--tenant", h.id},
			{"shares", "set", "--tenant", h.id, "us-east=1", "--reason", "x", "--apply"},
			{"shares", "set", h.id + "=1", "--reason", "x", "--apply"},
		} {
			t.Run(h.name+"/"+args[0]+" "+args[1], func(t *testing.T) {
				r := c.run(args...)
				if r.code != exitUsage {
					t.Fatalf("exit code %d, want %d (usage): stdout %q stderr %q", r.code, exitUsage, r.stdout, r.stderr)
				}
				if !strings.Contains(r.stderr, "invalid") && !strings.Contains(r.stderr, "want REGION=SHARE") {
					t.Errorf("stderr %q does not say what is invalid", r.stderr)
				}
				if strings.ContainsAny(r.stderr, "\x00\u202e") || strings.Count(r.stderr, "\n") != 1 {
					t.Errorf("stderr echoes control characters or spans lines: %q", r.stderr)
				}
			})
		}
	}
	if after := count(); after != before {
		t.Errorf("rows (region/rule/key/share/audit) %s -> %s: a refused command wrote", before, after)
	}
}
