package deploycheck

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/quotaplane/quotaplane/gateway"
)

// The regions that must exist; any other folder with a gateway.yaml is checked too.
var wantRegions = []string{"us-east", "eu-west"}

// regionDirs returns every folder here that holds a gateway.yaml, by region name.
func regionDirs(t *testing.T) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(DeployDir(), "regions", "*", "gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, m := range matches {
		dirs = append(dirs, filepath.Base(filepath.Dir(m)))
	}
	for _, want := range wantRegions {
		found := false
		for _, d := range dirs {
			found = found || d == want
		}
		if !found {
			t.Errorf("region %s: no %s/gateway.yaml", want, want)
		}
	}
	if len(dirs) == 0 {
		t.Fatal("no region folders")
	}
	return dirs
}

func TestGatewayConfigs(t *testing.T) {
	for _, region := range regionDirs(t) {
		t.Run(region, func(t *testing.T) {
			path := filepath.Join(DeployDir(), "regions", region, "gateway.yaml")
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := gateway.ParseConfig(path, data)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			// The mode is written down, so a missing database URL is an error at start
			// rather than a standalone gateway with no tenants (issue 16).
			if raw.Mode != gateway.ModeDatabase {
				t.Errorf("mode: %q, want %q written in the file", raw.Mode, gateway.ModeDatabase)
			}
			if raw.Region != region {
				t.Errorf("region: %q, want the folder's name %q", raw.Region, region)
			}
			// Credentials come from the environment (Secrets), never from the file.
			if raw.DatabaseURL != "" {
				t.Errorf("database_url is set in the file; it must come from %s", gateway.EnvDatabaseURL)
			}
			if raw.Redis.URL != "" {
				t.Errorf("redis.url is set in the file; it must come from %s", gateway.EnvRedisURL)
			}
			for _, secret := range []string{"redis://", "rediss://", "postgres://", "postgresql://", "password"} {
				if bytes.Contains(bytes.ToLower(data), []byte(secret)) {
					t.Errorf("the file contains %q: credentials belong in Secrets", secret)
				}
			}

			// As the pod loads it: with both URLs from the environment, in database mode.
			cfg, err := gateway.LoadConfig(path, gateway.Overrides{
				DatabaseURL: "postgres://quotaplane@db.invalid:5432/quotaplane",
				RedisURL:    "redis://redis.invalid:6379/0",
			})
			if err != nil {
				t.Fatalf("load with the Secrets' URLs: %v", err)
			}
			if cfg.Standalone() {
				t.Error("standalone: want database mode")
			}
			// A pod is reached on its own IP, so loopback listeners would make it unreachable
			// (and its probes fail).
			for key, addr := range map[string]string{"listen": cfg.Listen, "admin_listen": cfg.AdminListen} {
				host, _, err := net.SplitHostPort(addr)
				if err != nil {
					t.Fatalf("%s: %v", key, err)
				}
				if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
					t.Errorf("%s %s: loopback is unreachable from outside the pod", key, addr)
				}
			}
			if cfg.Redis.Timeout > 10*time.Millisecond {
				t.Errorf("redis.timeout %s: more than 10ms added to a request when Redis is slow", cfg.Redis.Timeout)
			}
		})
	}
}

// promConfig is the part of prometheus.yml this test reads.
type promConfig struct {
	Global struct {
		ScrapeInterval string            `yaml:"scrape_interval"`
		ExternalLabels map[string]string `yaml:"external_labels"`
	} `yaml:"global"`
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName        string `yaml:"job_name"`
		HonorLabels    bool   `yaml:"honor_labels"`
		RelabelConfigs []struct {
			TargetLabel string `yaml:"target_label"`
			Replacement string `yaml:"replacement"`
		} `yaml:"relabel_configs"`
	} `yaml:"scrape_configs"`
}

func TestPrometheusConfigs(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install the Debian package prometheus (make deps)")
	}
	for _, region := range regionDirs(t) {
		t.Run(region, func(t *testing.T) {
			path := filepath.Join(DeployDir(), "regions", region, "prometheus.yml")
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var c promConfig
			if err := yaml.Unmarshal(data, &c); err != nil {
				t.Fatal(err)
			}
			// The rule files as deployed under rules/: rules.yml everywhere, and
			// rebalancer-rules.yml where the rebalancer is scraped (it fires elsewhere).
			files := []string{"rules.yml"}
			for _, sc := range c.ScrapeConfigs {
				if sc.JobName == "rebalancer" {
					files = append(files, "rebalancer-rules.yml")
				}
			}

			// promtool resolves rule_files relative to the config: lay it out as deployed.
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "rules"), 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				rules, err := os.ReadFile(filepath.Join(DeployDir(), "prometheus", f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "rules", f), rules, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(promtool, "check", "config", filepath.Join(dir, "prometheus.yml")).CombinedOutput()
			if err != nil {
				t.Fatalf("promtool check config %s: %v\n%s", path, err, out)
			}
			// Every rule file must have been found and checked, not silently matched by nothing.
			if n := len(regexp.MustCompile(`SUCCESS: [1-9][0-9]* rules found`).FindAll(out, -1)); n != len(files) {
				t.Errorf("promtool checked %d rule files through rule_files, want %d (%v):\n%s", n, len(files), files, out)
			}

			if got := c.Global.ExternalLabels["region"]; got != region {
				t.Errorf("global.external_labels.region: %q, want %q", got, region)
			}
			// rate(...[1m]) in the rules and dashboards needs two samples a minute at least.
			if d, err := time.ParseDuration(c.Global.ScrapeInterval); err != nil || d > 30*time.Second {
				t.Errorf("global.scrape_interval %q: want at most 30s", c.Global.ScrapeInterval)
			}
			jobs := map[string]bool{}
			for _, sc := range c.ScrapeConfigs {
				jobs[sc.JobName] = true
				if !sc.HonorLabels {
					t.Errorf("job %s: honor_labels must be true, or the series' own region label becomes exported_region", sc.JobName)
				}
				labelled := false
				for _, rc := range sc.RelabelConfigs {
					if rc.TargetLabel == "region" {
						labelled = true
						if rc.Replacement != region {
							t.Errorf("job %s: region label %q, want %q", sc.JobName, rc.Replacement, region)
						}
					}
				}
				if !labelled {
					t.Errorf("job %s: no relabel_configs entry sets region", sc.JobName)
				}
			}
			// deploy/prometheus/rules.yml selects up{job="gateway"}.
			if !jobs["gateway"] {
				t.Errorf("no job_name gateway; have %v", jobs)
			}
		})
	}
}
