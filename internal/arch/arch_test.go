package arch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/gendoc"
)

// pkg is the part of `go list -json` the test reads.
type pkg struct {
	ImportPath   string
	Name         string
	Module       *struct{ Path string }
	Imports      []string
	Deps         []string
	TestImports  []string
	XTestImports []string
}

// moduleRoot is the directory of go.mod.
func moduleRoot(t *testing.T) (root, module string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Path}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("go list -m: %q", out)
	}
	return f[0], f[1]
}

// listPackages runs `go list -deps -json ./...` in root and returns the module's own
// packages, keyed by their path relative to the module.
func listPackages(t *testing.T, root, module string) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps -json: %v", err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		if p.Module == nil || p.Module.Path != module {
			continue
		}
		pkgs[strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")] = p
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages of %s; the test reads the wrong tree", len(pkgs), module)
	}
	return pkgs
}

// table reads the rows of a generated section of docs/architecture.md (internal/gendoc): the
// first column's package and the last column's list of `code` names.
func table(t *testing.T, root, marker string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	section, err := gendoc.Section(data, marker)
	if err != nil {
		t.Fatalf("docs/architecture.md: %v", err)
	}
	code := regexp.MustCompile("`([^`]+)`")
	rows := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(section))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		name := code.FindStringSubmatch(cells[0])
		if name == nil {
			t.Fatalf("docs/architecture.md: row without a package: %s", line)
		}
		if _, dup := rows[name[1]]; dup {
			t.Fatalf("docs/architecture.md: %s listed twice in %s", name[1], marker)
		}
		var allowed []string
		for _, m := range code.FindAllStringSubmatch(cells[len(cells)-1], -1) {
			allowed = append(allowed, m[1])
		}
		rows[name[1]] = allowed
	}
	if len(rows) == 0 {
		t.Fatalf("docs/architecture.md: empty %s table", marker)
	}
	return rows
}

// TestDependencyMap: every package of the module is in the map, imports only what its
// row allows, and nothing imports cmd/ (tests included); package main lives in cmd/ only.
func TestDependencyMap(t *testing.T) {
	root, module := moduleRoot(t)
	pkgs := listPackages(t, root, module)
	allowed := table(t, root, "deps")
	own := func(path string) (string, bool) {
		if path == module {
			return "", true
		}
		rel, ok := strings.CutPrefix(path, module+"/")
		return rel, ok
	}
	for name, p := range pkgs {
		row, listed := allowed[name]
		if !listed {
			t.Errorf("%s: not in the dependency map of docs/architecture.md; add a row saying what it owns and may import", name)
		}
		if p.Name == "main" && !strings.HasPrefix(name, "cmd/") {
			t.Errorf("%s: package main outside cmd/", name)
		}
		for _, imp := range p.Imports {
			rel, ok := own(imp)
			if !ok {
				continue
			}
			if strings.HasPrefix(rel, "cmd/") {
				t.Errorf("%s imports %s: nothing may import cmd/", name, rel)
				continue
			}
			if listed && !slices.Contains(row, rel) {
				t.Errorf("%s imports %s, which its row of docs/architecture.md does not allow", name, rel)
			}
		}
		for _, imp := range append(slices.Clone(p.TestImports), p.XTestImports...) {
			if rel, ok := own(imp); ok && strings.HasPrefix(rel, "cmd/") {
				t.Errorf("tests of %s import %s: nothing may import cmd/", name, rel)
			}
		}
	}
	for name := range allowed {
		if _, ok := pkgs[name]; !ok {
			t.Errorf("docs/architecture.md lists %s, which is not a package of the module", name)
		}
	}
}

// TestForbiddenReach: the pure packages do not reach the database or its driver, even
// through another package.
func TestForbiddenReach(t *testing.T) {
	root, module := moduleRoot(t)
	pkgs := listPackages(t, root, module)
	for name, forbidden := range table(t, root, "reach") {
		p, ok := pkgs[name]
		if !ok {
			t.Errorf("docs/architecture.md: %s in the reach table is not a package of the module", name)
			continue
		}
		for _, f := range forbidden {
			full := f
			if !strings.Contains(f, ".") {
				full = module + "/" + f // a package of this module
			}
			for _, d := range p.Deps {
				if d == full || strings.HasPrefix(d, full+"/") {
					t.Errorf("%s reaches %s (through its imports); docs/architecture.md forbids it", name, d)
					break
				}
			}
		}
	}
}
