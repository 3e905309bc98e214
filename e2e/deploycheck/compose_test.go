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
		Image string `yaml:"image"`
		Build struct {
			Context string `yaml:"context"`
			Target  string `yaml:"target"`
		} `yaml:"build"`
		Profiles    []string `yaml:"profiles"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		DependsOn   map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

// TestCompose checks compose.yaml without a container engine: its quotaplane images are the
// Dockerfile's targets under the overlays' names and are built from this checkout, every
// long-running service has a healthcheck (the quotaplane images their own `healthcheck`
// subcommand on their admin port), every mounted file exists, the gateway configs load for
// their regions, the Prometheus configs pass promtool with the rule files they mount, and
// the start order is migrate, then setup (ratectl apply --only-missing, which never
// deletes: cmd/ratectl's TestComposeLimitsFile), then gateways and rebalancer.
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

	// One-shot services: what others wait for to complete, and the CLI (profile tools).
	oneShot := map[string]bool{}
	for _, s := range c.Services {
		for dep, d := range s.DependsOn {
			if d.Condition == "service_completed_successfully" {
				oneShot[dep] = true
			}
			if d.Condition == "service_healthy" && len(c.Services[dep].Healthcheck.Test) == 0 {
				t.Errorf("a service waits for %s to be healthy, which has no healthcheck", dep)
			}
		}
	}
	gateways := 0
	for name, s := range c.Services {
		img, ours := strings.CutPrefix(s.Image, "ghcr.io/quotaplane/")
		if ours {
			target, tag, _ := strings.Cut(img, ":")
			if !targets[target] || tag != "0.1.0" {
				t.Errorf("service %s: image %s is no Dockerfile target at tag 0.1.0", name, s.Image)
			}
			if s.Build.Context != "." || s.Build.Target != target {
				t.Errorf("service %s: build %+v, want context . and target %s (an unpublished image must build)", name, s.Build, target)
			}
		}
		hc := s.Healthcheck.Test
		switch {
		case oneShot[name] || slices.Contains(s.Profiles, "tools"):
		case len(hc) < 2 || hc[0] != "CMD":
			t.Errorf("service %s runs on but has no healthcheck [\"CMD\", ...] (test %q)", name, hc)
		case ours:
			// A FROM scratch image has no shell or curl: the binary checks itself.
			target, _, _ := strings.Cut(img, ":")
			if len(hc) != 4 || hc[1] != "/usr/local/bin/"+target || hc[2] != "healthcheck" || !strings.HasSuffix(hc[3], "/readyz") {
				t.Errorf("service %s: healthcheck %q, want /usr/local/bin/%s healthcheck http://127.0.0.1:PORT/readyz", name, hc, target)
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
	// setup runs on every `up`: it must add what is missing and never change or delete
	// what ratectl changed since (a plain apply changes what differs from the file).
	if cmd := c.Services["setup"].Command; !slices.Contains(cmd, "--only-missing") || !slices.Contains(cmd, "--apply") {
		t.Errorf("setup runs %v: want apply --only-missing --apply", cmd)
	}
	// The gateways' healthchecks ask the admin port their config listens on.
	for _, region := range []string{"us-east", "eu-west"} {
		cfg, err := gateway.LoadConfig(filepath.Join(root, "deploy", "compose", "gateway-"+region+".yaml"), gateway.Overrides{DatabaseURL: "postgres://x@db.invalid/x", RedisURL: "redis://r.invalid:6379/0"})
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := strings.Cut(cfg.AdminListen, ":")
		if hc := c.Services["gateway-"+region].Healthcheck.Test; len(hc) != 4 || hc[3] != "http://127.0.0.1:"+port+"/readyz" {
			t.Errorf("gateway-%s healthcheck %q, want http://127.0.0.1:%s/readyz (admin_listen %s)", region, hc, port, cfg.AdminListen)
		}
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
		mounted := 0
		for _, v := range c.Services["prometheus-"+region].Volumes {
			src, dst, _ := strings.Cut(strings.TrimSuffix(v, ":ro"), ":")
			name, ok := strings.CutPrefix(dst, "/etc/prometheus/rules/")
			if !ok {
				continue
			}
			rules, err := os.ReadFile(filepath.Join(root, src))
			if err != nil {
				t.Fatal(err)
			}
			_ = os.WriteFile(filepath.Join(dir, "rules", name), rules, 0o644)
			mounted++
		}
		// The rebalancer's rules fire when it is absent: only where it is scraped.
		scrapes := strings.Contains(string(cfg), "job_name: rebalancer")
		if hasRules := slices.Contains(c.Services["prometheus-"+region].Volumes, "./deploy/prometheus/rebalancer-rules.yml:/etc/prometheus/rules/rebalancer-rules.yml:ro"); hasRules != scrapes {
			t.Errorf("prometheus-%s: scrapes the rebalancer %v but mounts its rules %v", region, scrapes, hasRules)
		}
		_ = os.WriteFile(filepath.Join(dir, "prometheus.yml"), cfg, 0o644)
		out, err := exec.Command(promtool(t), "check", "config", filepath.Join(dir, "prometheus.yml")).CombinedOutput()
		if err != nil {
			t.Errorf("promtool check config prometheus-%s.yml: %v\n%s", region, err, out)
		}
		if n := strings.Count(string(out), "rules found"); n != mounted || n == 0 {
			t.Errorf("prometheus-%s: promtool checked %d rule files, %d are mounted:\n%s", region, n, mounted, out)
		}
	}
}

// TestMakeTargetsNamed: every `make TARGET` that the deployment files and docs name is a
// target of the Makefile (the Dockerfile once named a make builder-image that was not).
func TestMakeTargetsNamed(t *testing.T) {
	root := filepath.Join(DeployDir(), "..")
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(mk), -1) {
		targets[m[1]] = true
	}
	named := regexp.MustCompile("(?:^|[\\s`(])make ([a-z][a-z0-9-]*)")
	english := map[string]bool{"a": true, "an": true, "the": true, "it": true, "its": true, "them": true, "this": true, "that": true, "sure": true, "every": true}
	for _, f := range []string{"Dockerfile", "compose.yaml", "docs/operations.md", "deploy/base/README.md", "deploy/image/build.sh", "deploy/image/builder.sh"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllStringSubmatch(string(data), -1) {
			if !targets[m[1]] && !english[m[1]] {
				t.Errorf("%s names `make %s`, which the Makefile does not define", f, m[1])
			}
		}
	}
}
