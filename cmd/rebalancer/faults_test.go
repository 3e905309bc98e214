package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/demand/demandtest"
	"github.com/quotaplane/quotaplane/regions/store"
)

// syncBuffer is the log sink of an in-process run: slog writes from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func httpGet(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls cond every 100 ms until it holds, failing after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startRun runs the rebalancer in-process until the test ends.
func startRun(t *testing.T, args []string, logs io.Writer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, noEnv, logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("run did not return within 20 s of cancel")
		}
	})
}

// TestRunStartsWithDatabaseDown: PostgreSQL down at start is not fatal. The admin server
// comes up (/healthz 200, the status page 503), the ticks are counted as
// skipped_database; once PostgreSQL is up, a run succeeds and writes.
func TestRunStartsWithDatabaseDown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pg := testenv.PostgresServer(t)
	dbURL, err := pg.CreateDatabase(ctx, "rebalancer")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"us-east", "eu-west"} {
		if err := st.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := st.Heartbeat(ctx, "gw-"+r, r); err != nil {
			t.Fatal(err)
		}
	}
	exp := demandtest.New()
	t.Cleanup(exp.Close)
	exp.SetRegion("us-east", 5, 65, 0)
	exp.SetRegion("eu-west", 5, 25, 0)
	prom := testenv.Prom(t, testenv.PrometheusOptions{Jobs: []testenv.ScrapeJob{{Name: "gateway", Targets: []string{exp.Addr()}}}})
	waitSamples(t, prom.URL(), 6)
	st.Close() // no session left for PostgreSQL's smart shutdown to wait for
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	logs := &syncBuffer{}
	startRun(t, []string{"--database-url", dbURL, "--prometheus-url", prom.URL(), "--interval", "4s",
		"--check-interval", "1s", "--short-window", "2s", "--reload-wait", "200ms", "--instance-ttl", "1h",
		"--admin-listen", addr}, logs)
	metric := func(series string) float64 { return scrapeValue(t, "http://"+addr+"/metrics", series) }

	waitFor(t, 15*time.Second, "/healthz 200 with PostgreSQL down", func() bool {
		code, _ := httpGet(addr, "/healthz")
		return code == http.StatusOK
	})
	if code, body := httpGet(addr, "/"); code != http.StatusServiceUnavailable {
		t.Errorf("status page with PostgreSQL down = %d, want 503:\n%s", code, body)
	}
	waitFor(t, 15*time.Second, "ticks counted as skipped_database", func() bool {
		return metric(`ratelimit_rebalancer_runs_total{result="skipped_database"}`)+
			metric(`ratelimit_rebalancer_checks_total{result="skipped_database"}`) >= 2
	})
	if n := metric(`ratelimit_rebalancer_runs_total{result="not_leader"}`) + metric(`ratelimit_rebalancer_checks_total{result="not_leader"}`); n != 0 {
		t.Errorf("%v ticks counted as not_leader with PostgreSQL down, want skipped_database", n)
	}

	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a successful run after PostgreSQL came back", func() bool {
		return metric(`ratelimit_rebalancer_runs_total{result="ok"}`) >= 1
	})
	reopened, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reopened.Close)
	all, err := reopened.Shares(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Errorf("shares after the first successful run: %v, want the * split of both regions", all)
	}
	if code, _ := httpGet(addr, "/"); code != http.StatusOK {
		t.Errorf("status page after PostgreSQL came back = %d, want 200", code)
	}
	if n := strings.Count(logs.String(), "postgresql unreachable"); n < 1 || n > 2 {
		t.Errorf("the outage was logged %d times, want once by the store (and once by the lock):\n%s", n, logs)
	}
}

// TestRunNeverShowsPrometheusPassword: a --prometheus-url with user:password@ is used,
// but the password appears in no log line, error, metric or status page, whether
// Prometheus answers or not.
func TestRunNeverShowsPrometheusPassword(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const secret = "pr0m-s3cret"
	withPassword := strings.Replace(w.prom.URL(), "http://", "http://user:"+secret+"@", 1)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("http://user:%s@127.0.0.1:%d", secret, port)
	noSecret := func(what, s string) {
		t.Helper()
		if strings.Contains(s, secret) {
			t.Errorf("%s shows the password:\n%s", what, s)
		}
	}

	// Per-region sources: one answers (through the credentials), one does not.
	addr := freeAddr(t)
	logs := &syncBuffer{}
	startRun(t, []string{"--database-url", w.dbURL, "--prometheus-url", "us-east=" + withPassword,
		"--prometheus-url", "eu-west=" + dead, "--interval", "4s", "--check-interval", "1s", "--short-window", "2s",
		"--reload-wait", "200ms", "--instance-ttl", "1h", "--admin-listen", addr, "--log-level", "debug"}, logs)
	waitFor(t, 15*time.Second, "/healthz 200", func() bool {
		code, _ := httpGet(addr, "/healthz")
		return code == http.StatusOK
	})
	waitFor(t, 20*time.Second, "a run with eu-west's Prometheus unreachable", func() bool {
		return scrapeValue(t, "http://"+addr+"/metrics", `ratelimit_rebalancer_runs_total{result="ok"}`) >= 1
	})
	if !strings.Contains(logs.String(), "prometheus of region unreachable") || !strings.Contains(logs.String(), "user:xxxxx@") {
		t.Errorf("logs: want the unreachable region logged and the URLs shown redacted:\n%s", logs)
	}
	for _, path := range []string{"/", "/status.json", "/metrics"} {
		_, body := httpGet(addr, path)
		noSecret("GET "+path, body)
	}

	// Every Prometheus down, --once: the error and the logs.
	onceLogs := &syncBuffer{}
	err = run(t.Context(), []string{"--database-url", w.dbURL, "--prometheus-url", "http://user:" + secret + "@127.0.0.1:bad"}, noEnv, onceLogs)
	if err == nil {
		t.Fatal("a --prometheus-url with a bad port accepted")
	}
	noSecret("flag error", err.Error())
	err = run(t.Context(), []string{"--database-url", w.dbURL, "--prometheus-url", dead, "--once", "--interval", "4s",
		"--log-level", "debug"}, noEnv, onceLogs)
	if err == nil {
		t.Fatal("--once with Prometheus down succeeded")
	}
	noSecret("--once error", err.Error())
	noSecret("logs", logs.String()+onceLogs.String())
}
