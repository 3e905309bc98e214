package results

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"
	"time"

	"github.com/quotaplane/quotaplane/internal/gendoc"
)

//go:embed templates/*.tmpl
var templateFS embed.FS

var templates = template.Must(template.New("").Option("missingkey=error").Funcs(template.FuncMap{
	"ms":   figure(fmtMs),
	"sms":  figure(fmtSignedMs),
	"us":   figure(fmtUs),
	"int":  figure(fmtInt),
	"x":    figure(fmtX),
	"pct":  figure(fmtPct),
	"mb":   figure(fmtMB),
	"secs": figure(fmtSecs),
	"f0":   figure(fmtF(0)),
	"f1":   figure(fmtF(1)),
	"f2":   figure(fmtF(2)),
	"f3":   figure(fmtF(3)),
	"f4":   figure(fmtF(4)),
	"date": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 MST") },
	"day":  func(t time.Time) string { return t.UTC().Format("2006-01-02") },
	"took": func(a, b time.Time) string {
		d := b.Sub(a).Round(time.Second)
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	},
	"nsus":    figure(func(ns float64) string { return fmtUs(ns / 1000) }),
	"first":   func(load string) string { f, _, _ := strings.Cut(load, " "); return f },
	"sub":     func(a, b any) (float64, error) { return arith(a, b, func(x, y float64) float64 { return x - y }) },
	"div":     func(a, b any) (float64, error) { return arith(a, b, func(x, y float64) float64 { return x / y }) },
	"mul100":  func(v float64) float64 { return 100 * v },
	"inc":     func(i int) int { return i + 1 },
	"deref":   func(b *bool) bool { return b != nil && *b },
	"list":    func(s ...string) []string { return s },
	"maxload": func() float64 { return MaxLoad },
}).ParseFS(templateFS, "templates/*.tmpl"))

// view is what the templates see.
type view struct {
	B           *Bench
	R           *RLS // nil: no RLS results
	Targets     []Target
	ResultsFile string // the results files as the documents name them
	RLSFile     string
}

// TargetsOf are the targets measured by section.
func (v view) TargetsOf(section string) []Target {
	var out []Target
	for _, t := range v.Targets {
		if t.Section == section {
			out = append(out, t)
		}
	}
	return out
}

// Target is the target with id (a template naming an unknown one fails).
func (v view) Target(id string) (Target, error) {
	for _, t := range v.Targets {
		if t.ID == id {
			return t, nil
		}
	}
	return Target{}, fmt.Errorf("no target %q", id)
}

// Files are the inputs and outputs of a render. Empty output paths are skipped; an
// empty RLS path means no RLS results.
type Files struct {
	Results    string // docs/bench/results.json
	RLS        string // docs/bench/rls.json
	Benchmarks string // docs/BENCHMARKS.md, written whole
	Readme     string // README.md, its "bench" section
	Proxies    string // docs/proxies.md, its "rls" section
	// Root, when set, is the directory the documents name the results files relative to.
	Root string
	// RLSOptional: a missing RLS file means no RLS results (the committed files, before
	// the first make bench-rls); otherwise a named RLS file must exist.
	RLSOptional bool
}

// Committed are the committed files of the module at root.
func Committed(root string) Files {
	return Files{
		Root:       root,
		Results:    filepath.Join(root, "docs", "bench", "results.json"),
		RLS:        filepath.Join(root, "docs", "bench", "rls.json"),
		Benchmarks: filepath.Join(root, "docs", "BENCHMARKS.md"),
		Readme:     filepath.Join(root, "README.md"),
		Proxies:    filepath.Join(root, "docs", "proxies.md"),

		RLSOptional: true,
	}
}

// The generated sections of README.md and docs/proxies.md.
const (
	ReadmeSection  = "bench"
	ProxiesSection = "rls"
)

// Rendered is every document text of one pair of results.
type Rendered struct {
	Benchmarks, Readme, Proxies string
}

// Load reads the results files of f (no RLS file: no RLS results, see RLSOptional).
func Load(f Files) (*Bench, *RLS, error) {
	var b Bench
	if err := ReadFile(f.Results, &b); err != nil {
		return nil, nil, err
	}
	if f.RLS == "" {
		return &b, nil, nil
	}
	var r RLS
	if err := ReadFile(f.RLS, &r); f.RLSOptional && errors.Is(err, fs.ErrNotExist) {
		return &b, nil, nil
	} else if err != nil {
		return nil, nil, err
	}
	return &b, &r, nil
}

// Render renders every document from the results (r may be nil).
func Render(f Files, b *Bench, r *RLS) (Rendered, error) {
	v := view{B: b, R: r, Targets: Targets(b, r), ResultsFile: f.name(f.Results), RLSFile: f.name(f.RLS)}
	var out Rendered
	for _, d := range []struct {
		tmpl string
		dst  *string
	}{{"benchmarks", &out.Benchmarks}, {"readme", &out.Readme}, {"proxies", &out.Proxies}} {
		var buf bytes.Buffer
		if err := templates.ExecuteTemplate(&buf, d.tmpl, v); err != nil {
			return Rendered{}, fmt.Errorf("render %s: %w", d.tmpl, err)
		}
		*d.dst = tidy(buf.String())
	}
	return out, nil
}

func (f Files) name(path string) string {
	if path == "" {
		return ""
	}
	if f.Root != "" {
		if rel, err := filepath.Rel(f.Root, path); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.ToSlash(rel)
		}
	}
	return filepath.ToSlash(path)
}

// WriteDocuments renders the documents from f's results files and writes them.
func WriteDocuments(f Files) error {
	b, r, err := Load(f)
	if err != nil {
		return err
	}
	out, err := Render(f, b, r)
	if err != nil {
		return err
	}
	if f.Benchmarks != "" {
		if err := os.WriteFile(f.Benchmarks, []byte(out.Benchmarks), 0o644); err != nil {
			return fmt.Errorf("write benchmarks document: %w", err)
		}
	}
	if f.Readme != "" {
		if err := gendoc.Rewrite(f.Readme, ReadmeSection, out.Readme); err != nil {
			return err
		}
	}
	if f.Proxies != "" {
		if err := gendoc.Rewrite(f.Proxies, ProxiesSection, out.Proxies); err != nil {
			return err
		}
	}
	return nil
}

// blankRuns are runs of blank lines the templates' conditional blocks leave behind.
var blankRuns = regexp.MustCompile(`\n{3,}`)

// tidy keeps at most one blank line in a row and ends the text with one newline, so
// that the templates can put a blank line after every block without counting them.
func tidy(s string) string {
	return strings.TrimRight(blankRuns.ReplaceAllString(s, "\n\n"), "\n") + "\n"
}

// arith applies f to two numbers of any of the types the results hold.
func arith(a, b any, f func(x, y float64) float64) (float64, error) {
	x, err := number(a)
	if err != nil {
		return 0, err
	}
	y, err := number(b)
	if err != nil {
		return 0, err
	}
	return f(x, y), nil
}

func number(v any) (float64, error) {
	switch x := v.(type) {
	case float64:
		return x, nil
	case int:
		return float64(x), nil
	case int64:
		return float64(x), nil
	}
	return 0, fmt.Errorf("%T is not a number", v)
}

// Inputs are the results files f reads.
func (f Files) Inputs() []string {
	var out []string
	for _, p := range []string{f.Results, f.RLS} {
		if p != "" {
			out = append(out, f.name(p))
		}
	}
	return out
}

// Outputs are the documents f writes.
func (f Files) Outputs() []string {
	var out []string
	for _, p := range []string{f.Benchmarks, f.Readme, f.Proxies} {
		if p != "" {
			out = append(out, f.name(p))
		}
	}
	return out
}
