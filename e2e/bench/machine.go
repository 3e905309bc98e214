package bench

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"github.com/quotaplane/quotaplane/e2e/bench/results"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// readMachine describes where the suite runs (the load average at the end is read
// when it ends).
func readMachine(ctx context.Context) results.Machine {
	m := results.Machine{NProc: runtime.NumCPU(), Go: runtime.Version(), LoadStart: testenv.LoadAverage()}
	if out, err := exec.CommandContext(ctx, "nproc").Output(); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil {
			m.NProc = n
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.Join(strings.Fields(v), " ")
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				m.Memory = strconv.FormatFloat(kb/1024/1024, 'f', 1, 64) + " GiB"
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	version := func(bin string, args ...string) string {
		out, err := exec.CommandContext(ctx, bin, args...).Output()
		if err != nil {
			return bin + " (version unknown)"
		}
		return strings.TrimSpace(string(out))
	}
	m.Redis = version("redis-server", "--version")
	if f := strings.Fields(m.Redis); len(f) >= 3 {
		m.Redis = "redis-server " + strings.TrimPrefix(f[2], "v=")
	}
	m.Postgres = version("postgres", "--version")
	return m
}

// commit is the measured tree: git describe --always --dirty, or "unknown".
func commit(ctx context.Context, root string) string {
	cmd := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
