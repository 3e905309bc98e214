package main

import (
	"strings"
	"testing"
)

// TestDurationFlags: every duration flag takes days (cliflag.Duration); a bad one is a
// usage error naming the flag.
func TestDurationFlags(t *testing.T) {
	t.Parallel()
	if r := newCLI(t, nil).run("--timeout", "7d12h", "version"); r.code != exitOK {
		t.Errorf("--timeout 7d12h: exit %d, stderr %q", r.code, r.stderr)
	}
	r := newCLI(t, nil).run("--timeout", "7x", "version")
	if r.code != exitUsage || !strings.Contains(r.stderr, `"--timeout"`) || !strings.Contains(r.stderr, "want a duration like 7d") {
		t.Errorf("--timeout 7x: exit %d, stderr %q; want %d naming the flag", r.code, r.stderr, exitUsage)
	}
	if h := newCLI(t, nil).ok("shares", "history", "--help").stdout; !strings.Contains(h, "--since duration") {
		t.Errorf("shares history --help does not show --since as a duration:\n%s", h)
	}
}
