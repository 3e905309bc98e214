package testenv

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { os.Exit(RunTests(m)) }

func TestRedisStopPauseRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := Redis(t)
	opts, err := redis.ParseURL(RedisURL(p))
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries = -1
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}

	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = rdb.Get(tctx, "k").Err()
	cancel()
	if err == nil {
		t.Fatal("a paused server answered")
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}

	if err := p.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if got, err := rdb.Exists(ctx, "k").Result(); err != nil || got != 0 {
		t.Fatalf("after restart: exists=%d err=%v, want an empty server", got, err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if p.Running() {
		t.Fatal("still running after Kill")
	}
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded after Kill")
	}
}

func TestPostgresDBsAreSeparate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := PostgresDB(t), PostgresDB(t)
	if a == b {
		t.Fatalf("two tests got the same database %s", a)
	}
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	if _, err := ca.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("a table created in one test database is visible in another")
	}
}

func TestPostgresServerStopAndRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := PostgresServer(t)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, pg.URL("postgres")); err == nil {
		t.Fatal("connected to a stopped server")
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	c, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatalf("connect after restart: %v", err)
	}
	c.Close(ctx)
}

func TestPrometheusScrapesATarget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := Redis(t) // not an exporter; the up series still appears, with value 0
	prom := Prom(t, PrometheusOptions{Jobs: []ScrapeJob{{Name: "probe", Targets: []string{r.Addr()}, Labels: map[string]string{"region": "test"}}}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		body, err := get(ctx, prom.URL()+`/api/v1/query?query=up{job="probe",region="test"}`)
		if err == nil && strings.Contains(body, `"job":"probe"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no up series after 20s: %v %s", err, body)
		}
		time.Sleep(200 * time.Millisecond) // polling a real server's scrape loop; no clock to inject
	}
}

func TestMissingBinaryNamesThePackage(t *testing.T) {
	t.Parallel()
	_, err := lookBinary("quotaplane-no-such-server", "some-package")
	if err == nil || !strings.Contains(err.Error(), "apt-get install -y some-package") {
		t.Fatalf("error %v does not name the package", err)
	}
}

func get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestPostgresStopsFastWithClientsConnected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := PostgresServer(t)
	c, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	start := time.Now()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	// A smart shutdown would wait for c to disconnect, then be killed after the 10 s grace.
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("Stop with a connected client took %v: not a fast shutdown", d)
	}
}
