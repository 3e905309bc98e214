package gendoc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const doc = `# Title

<!-- figures:begin (written by make figures) -->
old line 1
old line 2
<!-- figures:end -->

between

<!-- other:begin -->
<!-- other:end -->
tail
`

func TestSection(t *testing.T) {
	for _, c := range []struct {
		name, want string
	}{
		{"figures", "old line 1\nold line 2\n"},
		{"other", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Section([]byte(doc), c.name)
			if err != nil || got != c.want {
				t.Errorf("Section(%s) = %q, %v; want %q", c.name, got, err, c.want)
			}
		})
	}
	names, err := Names([]byte(doc))
	if err != nil || strings.Join(names, ",") != "figures,other" {
		t.Errorf("Names = %v, %v", names, err)
	}
}

func TestReplace(t *testing.T) {
	for _, c := range []struct {
		name, section, text, want string
	}{
		{"text without a final newline", "figures", "new", strings.Replace(doc, "old line 1\nold line 2\n", "new\n", 1)},
		{"empty section filled", "other", "a\nb\n", strings.Replace(doc, "<!-- other:begin -->\n", "<!-- other:begin -->\na\nb\n", 1)},
		{"emptied", "figures", "", strings.Replace(doc, "old line 1\nold line 2\n", "", 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Replace([]byte(doc), c.section, c.text)
			if err != nil || string(got) != c.want {
				t.Errorf("Replace:\n%s\nerr %v; want\n%s", got, err, c.want)
			}
			back, err := Section(got, c.section)
			if want := strings.TrimSuffix(c.text, "\n"); err != nil || strings.TrimSuffix(back, "\n") != want {
				t.Errorf("Section after Replace = %q, %v; want %q", back, err, want)
			}
		})
	}
}

// TestMarkerErrors: every malformed document is refused with ErrMarkers and the name of
// what is wrong, and Rewrite leaves such a file as it was.
func TestMarkerErrors(t *testing.T) {
	for _, c := range []struct {
		name, doc, section, want string
	}{
		{"missing section", doc, "absent", "no section absent"},
		{"bad section name", doc, "Bad Name", "not a section name"},
		{"another marker style", "<!-- rlsbench:start -->\nx\n<!-- rlsbench:end -->\n", "rlsbench", "is not <!-- NAME:begin"},
		{"marker inside a line", "text <!-- a:begin -->\n<!-- a:end -->\n", "a", "alone on its line"},
		{"never ends", "<!-- a:begin -->\nx\n", "a", "never ends"},
		{"ends without a begin", "x\n<!-- a:end -->\n", "a", "was not begun"},
		{"nested", "<!-- a:begin -->\n<!-- b:begin -->\n<!-- b:end -->\n<!-- a:end -->\n", "a", "begins inside a"},
		{"twice", "<!-- a:begin -->\n<!-- a:end -->\n<!-- a:begin -->\n<!-- a:end -->\n", "a", "appears twice"},
		{"end with a note", "<!-- a:begin -->\n<!-- a:end (x) -->\n", "a", "end marker has no note"},
		{"upper-case name", "<!-- A:begin -->\n<!-- A:end -->\n", "a", "is not <!-- NAME:begin"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Section([]byte(c.doc), c.section)
			if !errors.Is(err, ErrMarkers) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Section: %v; want ErrMarkers with %q", err, c.want)
			}
			path := filepath.Join(t.TempDir(), "doc.md")
			if err := os.WriteFile(path, []byte(c.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := Rewrite(path, c.section, "new\n"); !errors.Is(err, ErrMarkers) {
				t.Errorf("Rewrite: %v; want ErrMarkers", err)
			}
			if got, _ := os.ReadFile(path); string(got) != c.doc {
				t.Errorf("Rewrite changed a document it refused:\n%s", got)
			}
		})
	}
}

func TestRewrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Rewrite(path, "other", "figure 1"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if s, err := Section(got, "other"); err != nil || s != "figure 1\n" {
		t.Errorf("after Rewrite: %q, %v", s, err)
	}
	if s, _ := Section(got, "figures"); s != "old line 1\nold line 2\n" {
		t.Errorf("Rewrite touched another section: %q", s)
	}
	if err := Rewrite(filepath.Join(t.TempDir(), "missing.md"), "other", "x"); err == nil {
		t.Error("Rewrite of a missing file: no error")
	}
}

// TestRepositoryMarkers: every committed Markdown file uses the one marker style, so a
// document cannot grow a second syntax that only its own writer understands.
func TestRepositoryMarkers(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "--full-name", "--", ":/*.md").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	files := strings.Fields(string(out))
	if len(files) < 5 {
		t.Fatalf("git ls-files found %d Markdown files; the test reads the wrong tree", len(files))
	}
	sections := 0
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(top)), f))
		if err != nil {
			t.Fatal(err)
		}
		names, err := Names(b)
		if err != nil {
			t.Errorf("%s: %v", f, err)
		}
		sections += len(names)
	}
	if sections < 5 {
		t.Errorf("%d generated sections in the repository's Markdown; want the ones docs/ and README.md hold", sections)
	}
}
