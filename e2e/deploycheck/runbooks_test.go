package deploycheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runbookBase is where every alert's runbook_url points: the operations guide on the
// default branch, so a page opens from any alert receiver (not a path relative to a
// checkout nobody has at 3 a.m.).
const runbookBase = "https://github.com/quotaplane/quotaplane/blob/main/docs/operations.md#"

// TestAlertRunbooks: every alert has a runbook_url into docs/operations.md whose anchor is
// a heading of that file (as GitHub makes anchors), and no alert keeps the old relative
// "runbook" annotation.
func TestAlertRunbooks(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(DeployDir(), "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(string(doc))
	alerts := 0
	for _, f := range ruleFiles {
		for _, g := range readRules(t, f).Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				alerts++
				if _, ok := r.Annotations["runbook"]; ok {
					t.Errorf("%s: a relative runbook annotation; use runbook_url", r.Alert)
				}
				u := r.Annotations["runbook_url"]
				anchor, ok := strings.CutPrefix(u, runbookBase)
				if !ok {
					t.Errorf("%s: runbook_url %q does not start with %s", r.Alert, u, runbookBase)
					continue
				}
				if !anchors[anchor] {
					t.Errorf("%s: runbook_url anchor #%s is no heading of docs/operations.md", r.Alert, anchor)
				}
			}
		}
	}
	if alerts < 10 {
		t.Errorf("%d alerts in %v; expected the fail-open, upstream and rebalancer alerts too", alerts, ruleFiles)
	}
}

// headingAnchors are the anchors GitHub gives the Markdown headings of doc: lower case,
// punctuation dropped, spaces to hyphens (fenced code skipped).
func headingAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		out[a] = true
	}
	return out
}
