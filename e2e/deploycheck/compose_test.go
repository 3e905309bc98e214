package deploycheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"

	"github.com/quotaplane/quotaplane/gateway"
)

// composeFile is the part of compose.yaml the checks read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		DependsOn   map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

// TestCompose checks compose.yaml without a container engine: its quotaplane images are the
// Dockerfile's targets under the overlays' names, every mounted file exists, the gateway
// configs load for their regions, the Prometheus configs pass promtool, and the start order
// is migrate, then setup (ratectl apply), then gateways and rebalancer.
func TestCompose(t *testing.T) {
	root := filepath.Join(DeployDir(), "..")
	data, err := os.ReadFile(filepath.Join(root, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^FROM \S+ AS (\S+)$`).FindAllStringSubmatch(string(dockerfile), -1) {
		targets[m[1]] = true
	}
	for _, want := range []string{"gateway", "rebalancer", "ratectl"} {
		if !targets[want] {
			t.Errorf("the Dockerfile has no target %s", want)
		}
	}
	if !strings.Contains(string(dockerfile), "FROM scratch AS base") {
		t.Error("the Dockerfile's images are not FROM scratch")
	}

	gateways := 0
	for name, s := range c.Services {
		if img, ok := strings.CutPrefix(s.Image, "ghcr.io/quotaplane/"); ok {
			target, tag, _ := strings.Cut(img, ":")
			if !targets[target] || tag != "0.1.0" {
				t.Errorf("service %s: image %s is no Dockerfile target at tag 0.1.0", name, s.Image)
			}
		}
		for _, v := range s.Volumes {
			src, _, ok := strings.Cut(v, ":")
			if !ok || !strings.HasPrefix(src, "./") {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, src)); err != nil {
				t.Errorf("service %s mounts %s: %v", name, src, err)
			}
		}
		region, isGateway := strings.CutPrefix(name, "gateway-")
		if !isGateway {
			continue
		}
		gateways++
		if s.DependsOn["setup"].Condition != "service_completed_successfully" {
			t.Errorf("service %s does not wait for setup (the schema and limits)", name)
		}
		path := filepath.Join(root, "deploy", "compose", "gateway-"+region+".yaml")
		cfg, err := gateway.LoadConfig(path, gateway.Overrides{DatabaseURL: s.Environment["RATELIMIT_DATABASE_URL"], RedisURL: s.Environment["RATELIMIT_REDIS_URL"]})
		if err != nil {
			t.Errorf("service %s: %v", name, err)
		} else if cfg.Region != region {
			t.Errorf("service %s runs region %q", name, cfg.Region)
		}
	}
	if gateways != 2 {
		t.Errorf("%d gateway services, want 2 (two regions)", gateways)
	}
	if c.Services["setup"].DependsOn["migrate"].Condition != "service_completed_successfully" {
		t.Error("setup does not wait for migrate")
	}
	if !slices.Equal(c.Services["migrate"].Command, []string{"migrate", "up"}) {
		t.Errorf("migrate runs %v", c.Services["migrate"].Command)
	}

	for _, region := range []string{"us-east", "eu-west"} {
		// promtool resolves rule_files from the config; lay them out as mounted.
		dir := t.TempDir()
		cfg, err := os.ReadFile(filepath.Join(root, "deploy", "compose", "prometheus-"+region+".yml"))
		if err != nil {
			t.Fatal(err)
		}
		cfg = []byte(strings.ReplaceAll(string(cfg), "/etc/prometheus/rules/", "rules/"))
		if err := os.MkdirAll(filepath.Join(dir, "rules"), 0o755); err != nil {
			t.Fatal(err)
		}
		rules, _ := os.ReadFile(filepath.Join(DeployDir(), "prometheus", "rules.yml"))
		_ = os.WriteFile(filepath.Join(dir, "rules", "rules.yml"), rules, 0o644)
		_ = os.WriteFile(filepath.Join(dir, "prometheus.yml"), cfg, 0o644)
		out, err := exec.Command(promtool(t), "check", "config", filepath.Join(dir, "prometheus.yml")).CombinedOutput()
		if err != nil {
			t.Errorf("promtool check config prometheus-%s.yml: %v\n%s", region, err, out)
		}
	}
}
