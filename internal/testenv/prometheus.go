package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Prometheus is a Prometheus server started by StartPrometheus.
type Prometheus struct {
	*Process
	opts PrometheusOptions
	mu   sync.Mutex
}

// ScrapeJob is one scrape job of the generated configuration.
type ScrapeJob struct {
	Name    string
	Targets []string          // host:port
	Labels  map[string]string // added to every series of Targets
	// Groups are more target groups of the same job, each with labels of its own (for
	// example one group per region).
	Groups []TargetGroup
}

// TargetGroup is a static_configs entry.
type TargetGroup struct {
	Targets []string
	Labels  map[string]string
}

// PrometheusOptions configures StartPrometheus.
type PrometheusOptions struct {
	// Dir is the data directory; empty means a new temporary directory.
	Dir string
	// Port to listen on; 0 picks a free one.
	Port int
	// ScrapeInterval defaults to 1 s, so tests see data quickly.
	ScrapeInterval time.Duration
	Jobs           []ScrapeJob
	// RuleFiles are copied into the configuration as rule_files.
	RuleFiles []string
}

// StartPrometheus writes a configuration, starts prometheus and waits for /-/ready.
func StartPrometheus(ctx context.Context, opts PrometheusOptions) (*Prometheus, error) {
	bin, err := lookBinary("prometheus", "prometheus")
	if err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "quotaplane-prom-*"); err != nil {
			return nil, fmt.Errorf("start prometheus: %w", err)
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("start prometheus: %w", err)
	}
	if opts.Port == 0 {
		if opts.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if opts.ScrapeInterval == 0 {
		opts.ScrapeInterval = time.Second
	}
	p := &Prometheus{Process: &Process{Name: "prometheus", Host: "127.0.0.1", Port: opts.Port, Dir: opts.Dir, bin: bin}, opts: opts}
	if err := p.writeConfig(); err != nil {
		return nil, err
	}
	p.args = []string{
		"--config.file=" + p.configPath(),
		"--storage.tsdb.path=" + filepath.Join(opts.Dir, "data"),
		"--web.listen-address=" + p.Addr(),
		"--web.enable-lifecycle",
		"--log.level=warn",
	}
	p.ready = func(ctx context.Context) error { return httpOK(ctx, http.MethodGet, p.URL()+"/-/ready") }
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// URL is the server's base URL, for the HTTP API.
func (p *Prometheus) URL() string { return "http://" + p.Addr() }

// SetJobs replaces the scrape jobs and reloads the configuration.
func (p *Prometheus) SetJobs(ctx context.Context, jobs []ScrapeJob) error {
	p.mu.Lock()
	p.opts.Jobs = jobs
	err := p.writeConfig()
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return httpOK(ctx, http.MethodPost, p.URL()+"/-/reload")
}

func (p *Prometheus) configPath() string { return filepath.Join(p.opts.Dir, "prometheus.yml") }

// writeConfig renders the configuration; YAML here is JSON-compatible quoted scalars.
func (p *Prometheus) writeConfig() error {
	var b bytes.Buffer
	iv := p.opts.ScrapeInterval.String()
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n", iv, iv)
	if len(p.opts.RuleFiles) > 0 {
		b.WriteString("rule_files:\n")
		for _, f := range p.opts.RuleFiles {
			fmt.Fprintf(&b, "  - %s\n", strconv.Quote(f))
		}
	}
	b.WriteString("scrape_configs:\n")
	for _, j := range p.opts.Jobs {
		fmt.Fprintf(&b, "  - job_name: %s\n    static_configs:\n", strconv.Quote(j.Name))
		groups := j.Groups
		if len(j.Targets) > 0 || len(groups) == 0 {
			groups = append([]TargetGroup{{Targets: j.Targets, Labels: j.Labels}}, groups...)
		}
		for _, g := range groups {
			b.WriteString("      - targets: [")
			for i, t := range g.Targets {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(strconv.Quote(t))
			}
			b.WriteString("]\n")
			if len(g.Labels) > 0 {
				b.WriteString("        labels:\n")
				keys := make([]string, 0, len(g.Labels))
				for k := range g.Labels {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					fmt.Fprintf(&b, "          %s: %s\n", k, strconv.Quote(g.Labels[k]))
				}
			}
		}
	}
	if len(p.opts.Jobs) == 0 {
		b.WriteString("  []\n")
	}
	if err := os.WriteFile(p.configPath(), b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write prometheus config: %w", err)
	}
	return nil
}

func httpOK(ctx context.Context, method, url string) error {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s %s: %s", errNotReady, method, url, resp.Status)
	}
	return nil
}
