package gateway

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// TestSecretsNeverLeak runs gateways at log level debug with passwords in both URLs (one
// gateway reaches its database and Redis, one neither), sends valid and invalid keys,
// and then searches the logs, /metrics and the responses for every secret.
func TestSecretsNeverLeak(t *testing.T) {
	const (
		pgPassword    = "PgCanary-7d1e"
		redisPassword = "RedisCanary-93fa"
		badKey        = "qp_KeyCanary-guessed-0000000000000000000000000000"
	)
	up := newUpstream(t, 0)
	dbURL := testenv.PostgresDB(t)
	db := newDatabase(t, dbURL, "us-east")
	db.setRule(t, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 100, RefillPerSecond: 100})
	goodKey, _ := db.createKey(t, "shop-a")
	rp := testenv.Redis(t)
	acl := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	defer acl.Close()
	if err := acl.Do(context.Background(), "ACL", "SETUSER", "canary-user", "on", ">"+redisPassword, "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}

	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("postgres", pgPassword) // trust authentication ignores it
	withPassword := u.String()
	u.Host = "127.0.0.1:1"
	unreachable := u.String()
	redisURL := fmt.Sprintf("redis://canary-user:%s@%s/0", redisPassword, rp.Addr())
	redisDown := fmt.Sprintf("redis://canary-user:%s@127.0.0.1:1/0", redisPassword)

	cfg := databaseYAML("us-east", up.URL) + "log_level: debug\n"
	ok := startProc(t, cfg, "RATELIMIT_DATABASE_URL="+withPassword, "RATELIMIT_REDIS_URL="+redisURL)
	ok.waitReady(t, 15*time.Second)
	down := startProc(t, cfg, "RATELIMIT_DATABASE_URL="+unreachable, "RATELIMIT_REDIS_URL="+redisDown)

	var bodies strings.Builder
	for _, key := range []string{goodKey, badKey, goodKey + "x", ""} {
		resp, body := call(t, "POST", ok.url+"/orders", key)
		fmt.Fprintf(&bodies, "%d %v %s\n", resp.StatusCode, resp.Header, body)
		resp, body = call(t, "POST", down.url+"/orders", key)
		fmt.Fprintf(&bodies, "%d %v %s\n", resp.StatusCode, resp.Header, body)
	}
	// Let the unreachable database's retries and the Redis failures be logged.
	waitFor(t, 10*time.Second, "reload failures logged", func() bool {
		return len(down.logLines("config reload failed")) > 0
	})
	if resp, _ := call(t, "POST", ok.url+"/orders", goodKey); resp.StatusCode != 200 {
		t.Fatalf("valid key: %d", resp.StatusCode)
	}
	var metrics strings.Builder
	for _, p := range []*proc{ok, down} {
		resp, err := testClient.Get(p.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		metrics.Write(b)
	}
	logs := ok.log() + down.log()
	if !strings.Contains(logs, "redis") || !strings.Contains(logs, "reload") {
		t.Fatalf("the logs do not mention the Redis or database failures, so this test proves nothing:\n%s", logs)
	}
	for name, secret := range map[string]string{
		"database password": pgPassword, "redis password": redisPassword,
		"valid API key": goodKey, "guessed API key": badKey,
	} {
		for where, text := range map[string]string{"logs": logs, "/metrics": metrics.String(), "responses": bodies.String()} {
			if strings.Contains(text, secret) {
				t.Errorf("the %s appears in the %s", name, where)
			}
		}
	}
}

// TestTLSBackends runs a gateway against a TLS-only Redis that verifies clients
// (rediss://, redis.tls with the test CA and a client certificate) and a PostgreSQL with
// ssl=on reached with sslmode=verify-full: decisions come from Redis, and every database
// connection of the gateway (pool and LISTEN) is encrypted. A gateway that trusts another
// CA cannot reach Redis: its call is refused (429), never admitted unchecked.
func TestTLSBackends(t *testing.T) {
	ctx := context.Background()
	files, err := testenv.NewTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pg := testenv.PostgresTLSServer(t, files)
	if _, err := pg.CreateDatabase(ctx, "gw"); err != nil {
		t.Fatal(err)
	}
	dbURL := pg.TLSURL("gw", files.CAFile)
	db := newDatabase(t, dbURL, "us-east")
	db.setRule(t, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 100, RefillPerSecond: 100})
	key, _ := db.createKey(t, "shop-a")
	rp := testenv.RedisTLS(t, files)
	up := newUpstream(t, 0)

	cfg := articleConfig("us-east", up.URL, testenv.RedisTLSURL(rp))
	cfg.Tenants = nil
	cfg.DatabaseURL = dbURL
	cfg.Redis.Timeout = 500 * time.Millisecond
	cfg.Redis.TLS = RedisTLSConfig{CAFile: files.CAFile, CertFile: files.CertFile, KeyFile: files.KeyFile}
	gw := runInProcess(t, cfg, Options{})
	for range 3 {
		if resp, body := call(t, "POST", gw.url+"/orders", key); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	s := scrapeURL(t, gw.admin)
	if got := s.sum("ratelimit_requests_total", "decision", "allowed", "source", "redis"); got != 3 {
		t.Errorf("redis decisions %v, want 3 (TLS to Redis failed?)", got)
	}

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var total, encrypted, listening int
	err = conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE a.query ILIKE 'listen%')
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.datname = 'gw' AND a.pid <> pg_backend_pid() AND a.backend_type = 'client backend'`).Scan(&total, &encrypted, &listening)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gateway connections: %d, encrypted %d, listening %d (the test's own store pool included)", total, encrypted, listening)
	if total == 0 || encrypted != total || listening == 0 {
		t.Errorf("%d connections, %d encrypted, %d LISTEN: want all encrypted, one listening", total, encrypted, listening)
	}

	other, err := testenv.NewTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Redis.TLS.CAFile = other.CAFile
	bad := runInProcess(t, cfg, Options{})
	// Redis refuses this gateway's handshake: a failed call, refused (the breaker is
	// still closed, so no fallback bucket decides) with a 429, not a 5xx.
	if resp, _ := call(t, "POST", bad.url+"/orders", key); resp.StatusCode != 429 {
		t.Fatalf("gateway trusting another CA: %d, want 429 (a failed Redis call is refused)", resp.StatusCode)
	}
	s = scrapeURL(t, bad.admin)
	if got := s.sum("ratelimit_fallback_refused_total", "reason", "breaker_closed"); got != 1 {
		t.Errorf("refusals for an untrusted Redis certificate %v, want 1", got)
	}
	if got := s.sum("ratelimit_requests_total", "source", "redis"); got != 0 {
		t.Errorf("redis decisions %v with an untrusted Redis certificate, want 0", got)
	}
}
