package deploycheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
)

// ruleFiles are the Prometheus rule files deploy/prometheus ships: rules.yml for every
// region, rebalancer-rules.yml for the home region only. Each has a promtool unit test
// file beside it, NAME_test.yml.
var ruleFiles = []string{"rules.yml", "rebalancer-rules.yml"}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install the Debian package prometheus (apt-get install -y prometheus)")
	}
	return p
}

func testFile(rules string) string { return strings.TrimSuffix(rules, ".yml") + "_test.yml" }

func TestRulesAreValid(t *testing.T) {
	cmd := exec.Command(promtool(t), append([]string{"check", "rules"}, ruleFiles...)...)
	cmd.Dir = filepath.Join(DeployDir(), "prometheus")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "SUCCESS"); n != len(ruleFiles) {
		t.Fatalf("promtool check rules reported success for %d of %d files:\n%s", n, len(ruleFiles), out)
	}
}

func TestRulesUnitTests(t *testing.T) {
	for _, f := range ruleFiles {
		t.Run(f, func(t *testing.T) {
			cmd := exec.Command(promtool(t), "test", "rules", testFile(f))
			cmd.Dir = filepath.Join(DeployDir(), "prometheus")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("promtool test rules %s: %v\n%s", testFile(f), err, out)
			}
		})
	}
}

// ruleFile is the part of a rules file the checks read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T, name string) ruleFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(DeployDir(), "prometheus", name))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(data, &rf); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return rf
}

// unitTests is the part of a promtool test file the coverage check reads.
type unitTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name        string `yaml:"name"`
		InputSeries []any  `yaml:"input_series"`
		AlertTests  []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestEveryAlertIsShownToFire: a promtool test makes each alert fire (an alert tested
// only for staying quiet proves nothing), and each alert whose expression uses absent()
// fires in a test with no input series at all, as after its source was deleted.
func TestEveryAlertIsShownToFire(t *testing.T) {
	for _, f := range ruleFiles {
		data, err := os.ReadFile(filepath.Join(DeployDir(), "prometheus", testFile(f)))
		if err != nil {
			t.Fatal(err)
		}
		var ut unitTests
		if err := yaml.Unmarshal(data, &ut); err != nil {
			t.Fatalf("%s: %v", testFile(f), err)
		}
		if !slices.Equal(ut.RuleFiles, []string{f}) {
			t.Errorf("%s tests rule_files %v, want [%s]", testFile(f), ut.RuleFiles, f)
		}
		fires, firesOverNothing := map[string]bool{}, map[string]bool{}
		for _, tc := range ut.Tests {
			for _, at := range tc.AlertTests {
				if len(at.ExpAlerts) > 0 {
					fires[at.Alertname] = true
					firesOverNothing[at.Alertname] = firesOverNothing[at.Alertname] || len(tc.InputSeries) == 0
				}
			}
		}
		for _, g := range readRules(t, f).Groups {
			for _, r := range g.Rules {
				switch {
				case r.Alert == "":
				case !fires[r.Alert]:
					t.Errorf("%s: no test in %s makes %s fire", f, testFile(f), r.Alert)
				case strings.Contains(r.Expr, "absent(") && !firesOverNothing[r.Alert]:
					t.Errorf("%s: %s uses absent() but no test in %s makes it fire with no input series", f, r.Alert, testFile(f))
				}
			}
		}
	}
}
