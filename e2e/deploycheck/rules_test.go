package deploycheck

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install the Debian package prometheus (apt-get install -y prometheus)")
	}
	return p
}

func TestRulesAreValid(t *testing.T) {
	cmd := exec.Command(promtool(t), "check", "rules", "rules.yml")
	cmd.Dir = filepath.Join(DeployDir(), "prometheus")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool check rules did not report success:\n%s", out)
	}
}

func TestRulesUnitTests(t *testing.T) {
	cmd := exec.Command(promtool(t), "test", "rules", "rules_test.yml")
	cmd.Dir = filepath.Join(DeployDir(), "prometheus")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
