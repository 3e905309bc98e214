package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/internal/cliflag"
	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/demand/demandtest"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m)) }

func noEnv(string) (string, bool) { return "", false }

// TestLeaderTimeout: by default a leader loses its lock session after twice the shorter
// tick period plus the reload wait plus 10 s (the bound in docs/rebalancer.md).
func TestLeaderTimeout(t *testing.T) {
	t.Parallel()
	o := options{interval: 5 * time.Minute, checkInterval: time.Minute, reloadWait: 2 * time.Second}
	if got := o.sessionTimeout(); got != 132*time.Second {
		t.Errorf("default leader timeout %v, want 132s", got)
	}
	o.leaderTimeout = 20 * time.Second
	if got := o.sessionTimeout(); got != 20*time.Second {
		t.Errorf("--leader-timeout 20s gives %v", got)
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	base := []string{"--database-url", "postgres://x@127.0.0.1/db", "--prometheus-url", "http://127.0.0.1:9090"}
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		expire  int // --expire-after-runs, when no error
	}{
		{name: "ok", args: base, expire: job.DefaultExpireAfterRuns},
		{name: "expire after 10 runs", args: append(base, "--expire-after-runs", "10"), expire: 10},
		{name: "never expire", args: append(base, "--expire-after-runs", "-1"), expire: -1},
		{name: "zero expire runs", args: append(base, "--expire-after-runs", "0"), wantErr: "--expire-after-runs 0: must be at least 1, or -1"},
		{name: "negative expire runs", args: append(base, "--expire-after-runs", "-2"), wantErr: "--expire-after-runs -2: must be at least 1, or -1"},
		{name: "malformed expire runs", args: append(base, "--expire-after-runs", "three"), wantErr: `--expire-after-runs "three": want a whole number`},
		{name: "database url from env", args: []string{"--prometheus-url", "http://p"}, env: map[string]string{EnvDatabaseURL: "postgres://e/db"}},
		{name: "no database url", args: []string{"--prometheus-url", "http://p"}, wantErr: "--database-url"},
		{name: "empty database url in env", args: []string{"--prometheus-url", "http://p"}, env: map[string]string{EnvDatabaseURL: ""}, wantErr: "$RATELIMIT_DATABASE_URL is set but empty"},
		{name: "no prometheus", args: []string{"--database-url", "postgres://x/db"}, wantErr: "--prometheus-url (or $RATELIMIT_PROMETHEUS_URL) is required"},
		{name: "prometheus url from env", args: []string{"--database-url", "postgres://x/db"}, env: map[string]string{EnvPrometheusURL: "http://p"}},
		{name: "empty prometheus url in env", args: []string{"--database-url", "postgres://x/db"}, env: map[string]string{EnvPrometheusURL: " "},
			wantErr: "$RATELIMIT_PROMETHEUS_URL is set but empty: give the Prometheus URL (or --prometheus-url)"},
		{name: "flag wins over env", args: base, env: map[string]string{EnvPrometheusURL: "", EnvDatabaseURL: ""}},
		{name: "interval in days", args: append(base, "--interval", "7d", "--instance-ttl", "1d12h")},
		{name: "malformed interval", args: append(base, "--interval", "7x"), wantErr: `invalid argument "7x" for "--interval" flag: "7x": want a duration like 7d, 2w, 36h or 90m`},
		{name: "negative reload wait", args: append(base, "--reload-wait", "-1s"), wantErr: `invalid argument "-1s" for "--reload-wait" flag: "-1s": must not be negative`},
		{name: "interval too short", args: append(base, "--interval", "10ms"), wantErr: "--interval"},
		{name: "zero check interval", args: append(base, "--check-interval", "0s"), wantErr: "--check-interval"},
		{name: "leader timeout too short", args: append(base, "--leader-timeout", "100ms"), wantErr: "--leader-timeout"},
		{name: "leader timeout below the check interval", args: append(base, "--leader-timeout", "30s"),
			wantErr: "--leader-timeout 30s: must be longer than the shorter of --interval and --check-interval (1m0s) plus --reload-wait (2s)"},
		{name: "leader timeout just above a tick", args: append(base, "--check-interval", "5s", "--leader-timeout", "8s")},
		{name: "bad log level", args: append(base, "--log-level", "loud"), wantErr: "--log-level"},
		{name: "stray argument", args: append(base, "extra"), wantErr: "unexpected arguments"},
		{name: "unknown flag", args: append(base, "--nope"), wantErr: "unknown flag: --nope"},
		{name: "one dash reads as two", args: append(base, "-once", "-interval", "2m")},
		{name: "one dash, no such flag", args: append(base, "-nope"), wantErr: "unknown flag -nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, io.Discard)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if o.databaseURL == "" || len(o.prometheus) != 1 {
					t.Errorf("options = %+v", o)
				}
				if tc.expire != 0 && o.expireAfter != tc.expire {
					t.Errorf("expireAfter = %d, want %d", o.expireAfter, tc.expire)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
			}
			if !errors.As(err, new(cliflag.UsageError)) {
				t.Errorf("err = %v is no usage error: it would exit 1, not 2", err)
			}
		})
	}
}

func TestRunRejectsBadPrometheusURL(t *testing.T) {
	t.Parallel()
	err := run(t.Context(), []string{"--database-url", "postgres://x@127.0.0.1:1/db", "--prometheus-url", "127.0.0.1:9090"}, noEnv, io.Discard)
	if !errors.Is(err, regions.ErrInvalid) || !errors.As(err, new(cliflag.UsageError)) {
		t.Fatalf("err = %v, want ErrInvalid naming the URL, a usage error", err)
	}
}

// TestCommandLine: --help ends with the environment the rebalancer reads, --version and
// version print the build on stdout, and a bad command line exits 2 with one line
// naming the flag.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // contained in stdout
		stderr string // the whole of stderr
	}{
		{name: "help", args: []string{"--help"}, stdout: "Environment (a flag wins over its variable; set but empty is refused):\n" +
			"  RATELIMIT_DATABASE_URL     --database-url\n" +
			"  RATELIMIT_PROMETHEUS_URL   --prometheus-url, comma-separated REGION=URL for several\n"},
		{name: "help shows durations", args: []string{"--help"}, stdout: "--interval duration "},
		{name: "version flag", args: []string{"--version"}, stdout: "rebalancer "},
		{name: "version command", args: []string{"version"}, stdout: "\ncommit "},
		{name: "bad duration", args: []string{"--interval", "5 minutes"}, code: 2,
			stderr: "rebalancer: invalid argument \"5 minutes\" for \"--interval\" flag: \"5 minutes\": want a duration like 7d, 2w, 36h or 90m\n"},
		{name: "bad int", args: []string{"--expire-after-runs", "1.5"}, code: 2, stderr: "rebalancer: --expire-after-runs \"1.5\": want a whole number\n"},
		{name: "missing database", args: []string{"--prometheus-url", "http://127.0.0.1:1"}, code: 2,
			stderr: "rebalancer: --database-url (or $RATELIMIT_DATABASE_URL) is required\n"},
		{name: "stray argument", args: []string{"serve"}, code: 2, stderr: "rebalancer: unexpected arguments [\"serve\"] (commands: [healthcheck version])\n"},
		{name: "healthcheck fails", args: []string{"healthcheck", "http://127.0.0.1:1/readyz"}, code: 1,
			stderr: "rebalancer: healthcheck: http://127.0.0.1:1/readyz: dial tcp 127.0.0.1:1: connect: connection refused\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr strings.Builder
			code := cliflag.Exit(&stderr, "rebalancer", execute(t.Context(), tc.args, noEnv, &stdout, &stderr))
			if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || stderr.String() != tc.stderr {
				t.Errorf("exit %d\nstdout %q\nstderr %q\nwant exit %d, stdout containing %q, stderr %q", code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

// world is a database with two live regions and a Prometheus scraping an exporter that
// offers 70/30 demand above the default rule.
type world struct {
	dbURL string
	store *store.Store
	exp   *demandtest.Exporter
	prom  *testenv.Prometheus
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{dbURL: testenv.PostgresDB(t)}
	store, err := store.Open(t.Context(), w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	w.store = store
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"us-east", "eu-west"} {
		if err := store.AddRegion(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		if err := store.Heartbeat(t.Context(), "gw-"+r, r); err != nil {
			t.Fatal(err)
		}
	}
	w.exp = demandtest.New()
	t.Cleanup(w.exp.Close)
	w.exp.SetRegion("us-east", 5, 65, 0)
	w.exp.SetRegion("eu-west", 5, 25, 0)
	w.prom = testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{{Name: "gateway", Targets: []string{w.exp.Addr()}}}})
	waitSamples(t, w.prom.URL(), 6)
	return w
}

func (w *world) args(extra ...string) []string {
	return append([]string{"--database-url", w.dbURL, "--prometheus-url", w.prom.URL(), "--interval", "4s",
		"--short-window", "2s", "--reload-wait", "200ms", "--instance-ttl", "1h", "--log-level", "warn"}, extra...)
}

func (w *world) globalShares(t *testing.T) map[string]float64 {
	t.Helper()
	all, err := w.store.Shares(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, s := range all {
		if s.Scope == regions.GlobalScope && s.Source == regions.SourceRebalancer {
			out[s.Region] = s.Share
		}
	}
	return out
}

// waitSamples waits until every request series holds n samples.
func waitSamples(t *testing.T, promURL string, n int) {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: promURL})
	if err != nil {
		t.Fatal(err)
	}
	q := fmt.Sprintf("min(count_over_time(%s[1m]))", demand.RequestsMetric)
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		v, _, _, err := v1.NewAPI(c).Query(context.Background(), q, time.Now())
		if vec, ok := v.(model.Vector); err == nil && ok && len(vec) == 1 && int(vec[0].Value) >= n {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("prometheus %s: fewer than %d samples per series after 40s", promURL, n)
}

func TestRunOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)

	if err := run(t.Context(), w.args("--once", "--dry-run"), noEnv, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := w.globalShares(t); len(got) != 0 {
		t.Fatalf("--dry-run wrote %v", got)
	}

	if err := run(t.Context(), w.args("--once"), noEnv, io.Discard); err != nil {
		t.Fatal(err)
	}
	got := w.globalShares(t)
	if d := got["us-east"] - 0.7; d > 0.02 || d < -0.02 || len(got) != 2 {
		t.Fatalf("shares after --once = %v, want us-east ~0.7", got)
	}

	// Prometheus down: the run is skipped, reported as an error, shares stay.
	if err := w.prom.Stop(); err != nil {
		t.Fatal(err)
	}
	err := run(t.Context(), w.args("--once"), noEnv, io.Discard)
	if !errors.Is(err, demand.ErrUnavailable) {
		t.Fatalf("--once with Prometheus down: %v, want ErrUnavailable", err)
	}
	if after := w.globalShares(t); after["us-east"] != got["us-east"] {
		t.Errorf("shares changed on a skipped run: %v -> %v", got, after)
	}
}

func TestRunServesAdmin(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, w.args("--admin-listen", addr), noEnv, io.Discard) }()

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body := get("/metrics")
		if code == http.StatusOK && strings.Contains(body, `ratelimit_rebalancer_runs_total{result="ok"} 1`) {
			if !strings.Contains(body, `ratelimit_rebalancer_leader 1`) {
				t.Errorf("metrics: leader gauge not 1")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful run reported on /metrics within 15 s: %d", code)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if got := w.globalShares(t); len(got) != 2 {
		t.Errorf("shares after the first scheduled run: %v", got)
	}
	// The status page: both regions, the run's share changes, the job's last run.
	if code, body := get("/"); code != http.StatusOK || !strings.Contains(body, "us-east") || !strings.Contains(body, "eu-west") ||
		!strings.Contains(body, "50.0% → 70.0%") || !strings.Contains(body, `class="badge result-ok"`) {
		t.Errorf("GET / = %d, want the status page with both regions, the changes and the last run:\n%s", code, body)
	}
	if code, body := get("/status.json"); code != http.StatusOK || !strings.Contains(body, `"reachable": true`) || !strings.Contains(body, `"name": "us-east"`) {
		t.Errorf("GET /status.json = %d %s", code, body)
	}
	if code, _ := get("/assets/style.css"); code != http.StatusOK {
		t.Errorf("GET /assets/style.css = %d", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return within 20 s of cancel")
	}
}
