package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/e2e/bench/results"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// ChildKind is the kind of child process this one was started as ("echo" or "gateway"),
// or "" for the runner itself: the runner re-executes its own binary for its children.
func ChildKind() string { return os.Getenv(envChild) }

// RunChild runs the child process of the given kind until it is signalled.
func RunChild(kind string) error { return runChild(kind) }

// Run is the whole suite, with the command line args (see doc.go), writing its progress
// to stdout.
func Run(ctx context.Context, args []string, stdout io.Writer) error { return run(ctx, args, stdout) }

// The phases, in the order they run.
var allPhases = []string{"overhead", "engine", "scripts", "memory", "accuracy", "profile"}

// options are the command line.
type options struct {
	runs     int
	quick    bool
	render   bool // only render the documents from the results files
	phases   []string
	files    results.Files // the results file written (read, with -render) and the documents rendered
	profiles string        // where profile summaries go
	timeout  time.Duration
}

func parseOptions(args []string, root string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	runs := fs.Int("runs", 0, "runs of every measurement; the document shows medians and min-max (default 3, 1 with -quick)")
	quick := fs.Bool("quick", false, "seconds instead of minutes: short loads, small data sets (a smoke test, not numbers to publish)")
	render := fs.Bool("render", false, "measure nothing: render the documents again from the results files (default the committed ones)")
	resultsFile := fs.String("results", "", "the results file to write (with -render, to read); default docs/bench/results.json for a full run, else $TMPDIR/quotaplane-bench-*.json")
	out := fs.String("out", "", "the document to render (default docs/BENCHMARKS.md with the committed results, else the results file with .md)")
	readme := fs.String("readme", "", "a README whose bench section is rewritten (default README.md with the committed results, else none)")
	rls := fs.String("rls", "", "the make bench-rls results to render with (default docs/bench/rls.json with the committed results, else none)")
	profiles := fs.String("profiles", "", "directory for profile summaries (default docs/profiles with the committed results, else the work directory)")
	phases := fs.String("phases", strings.Join(allPhases, ","), "comma-separated phases to run: "+strings.Join(allPhases, ", "))
	timeout := fs.Duration("timeout", 30*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o := options{runs: *runs, quick: *quick, render: *render, profiles: *profiles, timeout: *timeout}
	if o.runs == 0 {
		o.runs = 3
		if o.quick {
			o.runs = 1
		}
	}
	if o.runs < 1 || o.runs > 9 {
		return options{}, fmt.Errorf("-runs %d: want 1..9", o.runs)
	}
	for p := range strings.SplitSeq(*phases, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(allPhases, p) {
			return options{}, fmt.Errorf("-phases: unknown phase %q (want %s)", p, strings.Join(allPhases, ", "))
		}
		o.phases = append(o.phases, p)
	}
	if len(o.phases) == 0 {
		return options{}, errors.New("-phases: none given")
	}
	partial := len(o.phases) < len(allPhases)
	if o.render && (o.quick || partial || *runs != 0) {
		return options{}, errors.New("-render measures nothing: it takes no -quick, -phases or -runs")
	}
	// The committed files: a full run, or -render, without files of its own.
	committed := *resultsFile == "" && *out == "" && (o.render || (!o.quick && !partial))
	if committed {
		o.files = results.Committed(root)
		if *readme != "" {
			o.files.Readme = *readme
		}
		if *rls != "" {
			o.files.RLS = *rls
		}
		if o.profiles == "" && !o.render {
			o.profiles = filepath.Join(root, "docs", "profiles")
		}
		return o, nil
	}
	o.files = results.Files{Results: *resultsFile, Benchmarks: *out, Readme: *readme, RLS: *rls}
	if o.files.Results == "" && o.render {
		return options{}, errors.New("-render with -out: give -results, the file to render from")
	}
	if o.files.Results == "" && o.files.Benchmarks != "" {
		o.files.Results = strings.TrimSuffix(o.files.Benchmarks, filepath.Ext(o.files.Benchmarks)) + ".json"
	}
	if o.files.Results == "" {
		kind := "run"
		switch {
		case o.quick:
			kind = "quick"
		case partial:
			kind = "partial"
		}
		o.files.Results = filepath.Join(os.TempDir(), "quotaplane-bench-"+kind+".json")
	}
	if o.files.Benchmarks == "" {
		o.files.Benchmarks = strings.TrimSuffix(o.files.Results, filepath.Ext(o.files.Results)) + ".md"
	}
	if o.files.Results == o.files.Benchmarks {
		return options{}, fmt.Errorf("-results and -out are the same file %s", o.files.Results)
	}
	return o, nil
}

func (o options) has(phase string) bool { return slices.Contains(o.phases, phase) }

// command is the command line the run is, for the results file.
func (o options) command() string {
	cmd := fmt.Sprintf("go run ./cmd/bench -runs %d", o.runs)
	if o.quick {
		cmd += " -quick"
	}
	if len(o.phases) < len(allPhases) {
		cmd += " -phases " + strings.Join(o.phases, ",")
	}
	return cmd
}

// run is the whole suite.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	root, err := testenv.ModuleRoot(ctx)
	if err != nil {
		return err
	}
	opts, err := parseOptions(args, root)
	if err != nil {
		return err
	}
	if opts.render {
		if err := results.WriteDocuments(opts.files); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "bench: rendered %s from %s\n", strings.Join(opts.files.Outputs(), ", "), strings.Join(opts.files.Inputs(), ", "))
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, opts.timeout)
	defer cancel()
	work, err := os.MkdirTemp("", "quotaplane-bench-*")
	if err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	defer os.RemoveAll(work)
	if opts.profiles == "" {
		opts.profiles = filepath.Join(work, "profiles")
	}
	b := &bench{opts: opts, root: root, work: work, log: stdout, rep: newReport()}
	meta := results.Run{Command: opts.command(), Runs: opts.runs, Quick: opts.quick, Phases: opts.phases,
		Commit: commit(ctx, root), Start: time.Now().UTC(), Machine: readMachine(ctx)}
	b.logf("bench: %d run(s), phases %s, commit %s, machine %s, load average %s", opts.runs, strings.Join(opts.phases, ","), meta.Commit, meta.Machine.CPU, meta.Machine.LoadStart)
	if err := b.build(ctx); err != nil {
		return err
	}
	if err := b.runPhases(ctx); err != nil {
		return err
	}
	meta.End = time.Now().UTC()
	meta.Machine.LoadEnd = testenv.LoadAverage()
	if err := results.WriteFile(opts.files.Results, b.collect(meta)); err != nil {
		return err
	}
	if err := results.WriteDocuments(opts.files); err != nil {
		return err
	}
	b.logf("bench: wrote %s; rendered %s (%s)", opts.files.Results, strings.Join(opts.files.Outputs(), ", "), meta.End.Sub(meta.Start).Round(time.Second))
	return nil
}

// bench holds what the phases share.
type bench struct {
	opts options
	root string // the module root
	work string // temporary files
	log  io.Writer
	rep  *report

	scripts *scriptsPhase // the script phase's calls and figures

	gatewayBin string // cmd/gateway
	self       string // this program, built, for the child processes
	testBins   map[string]string
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// testPackages are the packages whose benchmarks the runner runs from compiled test
// binaries (so that every run uses the same binary and no run pays for a build).
var testPackages = map[string]string{
	"limiter": "./gateway/limiter",
	"lua":     "./lua",
	"gateway": "./gateway",
}

// build compiles cmd/gateway and this program (the child processes: the echo upstream
// and the profiled gateway, so that they are the same optimised build whether the runner
// runs from go run or from its race-enabled test), then the test binaries the phases need.
func (b *bench) build(ctx context.Context) error {
	bin := filepath.Join(b.work, "bin")
	start := time.Now()
	goCmd := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = b.root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := goCmd("build", "-o", bin+string(os.PathSeparator), "./cmd/gateway", "./cmd/bench"); err != nil {
		return err
	}
	b.gatewayBin, b.self = filepath.Join(bin, "gateway"), filepath.Join(bin, "bench")
	b.testBins = map[string]string{}
	if b.opts.has("engine") || b.opts.has("memory") {
		var pkgs []string
		for name, pkg := range testPackages {
			if b.opts.quick && name != "limiter" {
				continue
			}
			pkgs = append(pkgs, pkg)
			b.testBins[name] = filepath.Join(bin, filepath.Base(pkg)+".test")
		}
		slices.Sort(pkgs)
		if err := goCmd(append([]string{"test", "-c", "-o", bin + string(os.PathSeparator)}, pkgs...)...); err != nil {
			return err
		}
	}
	b.logf("bench: built binaries in %s", time.Since(start).Round(time.Second))
	return nil
}

// runPhases runs every selected phase: the repeated ones once per run, interleaved, so
// that a change in the machine's load during the suite touches every row alike.
func (b *bench) runPhases(ctx context.Context) error {
	var ov *overhead
	if b.opts.has("overhead") {
		var err error
		if ov, err = b.startOverhead(ctx); err != nil {
			return err
		}
		defer ov.close()
	}
	for i := range b.opts.runs {
		b.logf("bench: run %d of %d", i+1, b.opts.runs)
		if ov != nil {
			if err := ov.run(ctx, i); err != nil {
				return err
			}
		}
		if b.opts.has("engine") {
			if err := b.engineRun(ctx, i); err != nil {
				return err
			}
		}
		if b.opts.has("scripts") {
			if err := b.scriptsRun(ctx, i); err != nil {
				return err
			}
		}
		if b.opts.has("accuracy") {
			if err := b.accuracyRun(ctx, i); err != nil {
				return err
			}
		}
		if b.opts.has("memory") {
			if err := b.redisMemoryRun(ctx, i); err != nil {
				return err
			}
		}
	}
	if ov != nil {
		b.rep.overhead = ov.result()
	}
	if b.opts.has("memory") {
		if err := b.gatewayMemory(ctx); err != nil {
			return err
		}
		if err := b.localMemory(ctx); err != nil {
			return err
		}
	}
	if b.opts.has("profile") {
		if err := b.profile(ctx); err != nil {
			return err
		}
	}
	return nil
}
