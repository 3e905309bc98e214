package bench

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// benchLine is one result line of `go test -bench`: the name without the -GOMAXPROCS
// suffix, the iterations and every "value unit" pair (ns/op, B/op, allocs/op and the
// benchmark's own metrics).
type benchLine struct {
	name    string
	n       int64
	metrics map[string]float64
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// parseBench reads the result lines of go test -bench output.
func parseBench(out []byte) []benchLine {
	var lines []benchLine
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		bl := benchLine{name: procsSuffix.ReplaceAllString(f[0], ""), n: n, metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			bl.metrics[f[i+1]] = v
		}
		lines = append(lines, bl)
	}
	return lines
}

// testRun is one invocation of a compiled test binary.
type testRun struct {
	pkg     string // key of testPackages
	args    []string
	timeout time.Duration
}

// command is the go test command line that does the same, for the document.
func (r testRun) command() string {
	var args []string
	for _, a := range r.args {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "test.")
		k, v, ok := strings.Cut(a, "=")
		if ok && strings.ContainsAny(v, "|^$()* ") {
			v = "'" + v + "'"
		}
		if ok {
			args = append(args, "-"+k+" "+v)
		} else {
			args = append(args, "-"+k)
		}
	}
	return "go test " + strings.Join(args, " ") + " " + testPackages[r.pkg] + "/"
}

// runTest runs a compiled test binary in its package directory (as go test does) and
// returns its output.
func (b *bench) runTest(ctx context.Context, r testRun) ([]byte, error) {
	bin, ok := b.testBins[r.pkg]
	if !ok {
		return nil, fmt.Errorf("no test binary for %s", r.pkg)
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout+30*time.Second)
	defer cancel()
	args := append([]string{"-test.timeout=" + r.timeout.String()}, r.args...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = filepath.Join(b.root, testPackages[r.pkg])
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	b.logf("%s (%s)", r.command(), time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		return out.Bytes(), fmt.Errorf("%s: %w\n%s", r.command(), err, tail(out.Bytes(), 4000))
	}
	return out.Bytes(), nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
