package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// stat is a figure over runs: the median and the range.
type stat struct {
	med, lo, hi float64
	n           int
}

func statOf(xs []float64) stat {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return stat{}
	}
	slices.Sort(v)
	s := stat{lo: v[0], hi: v[len(v)-1], n: len(v)}
	if len(v)%2 == 1 {
		s.med = v[len(v)/2]
	} else {
		s.med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return s
}

// show formats the median and, over more than one run, the range: "1.2 [1.1–1.4]".
func (s stat) show(f func(float64) string) string {
	if s.n == 0 {
		return "–"
	}
	if s.n == 1 || f(s.lo) == f(s.hi) {
		return f(s.med)
	}
	return f(s.med) + " [" + f(s.lo) + "–" + f(s.hi) + "]"
}

// Formatters.
func fmtMs(ns float64) string { return strconv.FormatFloat(ns/1e6, 'f', 2, 64) + " ms" }

func fmtSignedMs(ns float64) string {
	if ns >= 0 {
		return "+" + fmtMs(ns)
	}
	return "−" + fmtMs(-ns)
}

func fmtUs(us float64) string {
	switch {
	case us >= 10_000:
		return strconv.FormatFloat(us/1000, 'f', 1, 64) + " ms"
	case us >= 1000:
		return strconv.FormatFloat(us/1000, 'f', 2, 64) + " ms"
	case us >= 10:
		return strconv.FormatFloat(us, 'f', 0, 64) + " µs"
	}
	return strconv.FormatFloat(us, 'f', 2, 64) + " µs"
}

func fmtInt(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "−" + b.String()
	}
	return b.String()
}

func fmtF(prec int) func(float64) string {
	return func(v float64) string { return strconv.FormatFloat(v, 'f', prec, 64) }
}

func fmtX(v float64) string   { return strconv.FormatFloat(v, 'f', 2, 64) + "x" }
func fmtPct(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "%" }
func fmtMB(v float64) string  { return strconv.FormatFloat(v/1e6, 'f', 1, 64) + " MB" }
func fmtSecs(v float64) string {
	return strconv.FormatFloat(v/1e9, 'f', 2, 64) + " s"
}

// machine describes where the suite ran.
type machine struct {
	cpu, memory, kernel, goVersion, redis, postgres string
	nproc                                           int
	loadStart, loadEnd                              string
}

func readMachine(ctx context.Context) machine {
	m := machine{nproc: runtime.NumCPU(), goVersion: runtime.Version(), loadStart: testenv.LoadAverage()}
	if out, err := exec.CommandContext(ctx, "nproc").Output(); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil {
			m.nproc = n
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.Join(strings.Fields(v), " ")
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				m.memory = strconv.FormatFloat(kb/1024/1024, 'f', 1, 64) + " GiB"
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = "Linux " + strings.TrimSpace(string(b))
	}
	version := func(bin string, args ...string) string {
		out, err := exec.CommandContext(ctx, bin, args...).Output()
		if err != nil {
			return bin + " (version unknown)"
		}
		return strings.TrimSpace(string(out))
	}
	m.redis = version("redis-server", "--version")
	if f := strings.Fields(m.redis); len(f) >= 3 {
		m.redis = "redis-server " + strings.TrimPrefix(f[2], "v=")
	}
	m.postgres = version("postgres", "--version")
	return m
}

func fmtDuration(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
}
