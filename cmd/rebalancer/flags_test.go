package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryRefusesLeaderTimeoutBelowATick (issue 22): a --leader-timeout that elapses
// between two ticks made the only replica lose its lock 5 times in 16 s. The binary
// refuses it at start, names the flags, and exits non-zero; a timeout above a tick
// starts (it then fails on the database it cannot reach, a different error).
func TestBinaryRefusesLeaderTimeoutBelowATick(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, "rebalancer")
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, append([]string{"--database-url", "postgres://x@127.0.0.1:1/db",
			"--prometheus-url", "http://127.0.0.1:1", "--once", "--admin-listen", ""}, args...)...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	out, code := run("--check-interval", "10s", "--leader-timeout", "5s")
	if code != 2 || !strings.Contains(out, "--leader-timeout 5s: must be longer than the shorter of --interval and --check-interval (10s) plus --reload-wait (2s)") {
		t.Errorf("--leader-timeout 5s with checks every 10s: exit %d, %q; want a refusal naming the flags, exit 2", code, out)
	}
	if out, _ := run("--check-interval", "10s", "--leader-timeout", "30s"); strings.Contains(out, "--leader-timeout") {
		t.Errorf("--leader-timeout 30s with checks every 10s refused: %q", out)
	}
	// Days are a duration too, and a bad duration is a usage error naming the flag.
	if out, _ := run("--interval", "7d", "--check-interval", "1d12h"); strings.Contains(out, "--interval") || strings.Contains(out, "invalid argument") {
		t.Errorf("--interval 7d refused: %q", out)
	}
	if out, code := run("--interval", "7 days"); code != 2 || !strings.Contains(out, `invalid argument "7 days" for "--interval" flag`) {
		t.Errorf("--interval \"7 days\": exit %d, %q; want 2 naming the flag", code, out)
	}
}
