package main

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInterruptExitsZero: Ctrl-C is how a person ends the demo, so it must exit 0 (make
// printed "Error 1" after it), here while the stack is still starting.
func TestInterruptExitsZero(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--duration", "30s")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "starting the two-region stack") {
		t.Fatalf("first line %q", lines.Text())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("the demo did not stop within 2 minutes of SIGINT")
	}
	if err != nil {
		t.Fatalf("exit after SIGINT: %v, want status 0; output %q", err, rest)
	}
	if len(rest) == 0 || rest[len(rest)-1] != "demo: stopped; the stack is shut down and its data removed" {
		t.Errorf("last lines %q, want the stopped line", rest)
	}
}

func TestTryLineUsesTheFollowedTenant(t *testing.T) {
	keys := map[string]string{"shop-a": "qp_a", "shop-b": "qp_b", "shop-c": "qp_c"}
	got := tryLine(keys, "http://127.0.0.1:1")
	if !strings.Contains(got, "'X-Api-Key: "+keys[shifting]+"'") || !strings.Contains(got, "# as "+shifting) {
		t.Errorf("try line %q does not use %s's key", got, shifting)
	}
}
