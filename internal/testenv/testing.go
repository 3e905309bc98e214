package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// Redis starts a fresh redis-server for one test and stops it at cleanup. Each test gets
// its own server, so tests may stop, pause or flush it freely.
func Redis(t testing.TB) *Process {
	t.Helper()
	p, err := StartRedis(context.Background(), RedisOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("local.Redis: %v", err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// Prom starts a Prometheus server for one test and stops it at cleanup.
func Prom(t testing.TB, opts PrometheusOptions) *Prometheus {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	p, err := StartPrometheus(context.Background(), opts)
	if err != nil {
		t.Fatalf("local.Prom: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

// PostgresServer starts a PostgreSQL server owned by one test, for tests that stop or
// restart it. Most tests want PostgresDB instead.
func PostgresServer(t testing.TB) *Postgres {
	t.Helper()
	p, err := StartPostgres(context.Background(), PostgresOptions{})
	if err != nil {
		t.Fatalf("local.PostgresServer: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Stop()
		_ = p.Remove()
	})
	return p
}

// EnvPostgresURL names an environment variable: when set to the URL of a reachable
// PostgreSQL server whose user may create databases, PostgresDB creates its databases there
// instead of starting a server of its own.
const EnvPostgresURL = "QUOTAPLANE_TEST_POSTGRES_URL"

var shared struct {
	mu  sync.Mutex
	pg  *Postgres
	err error
	seq atomic.Int64
}

// PostgresDB returns the URL of a new, empty database for one test. The databases of one
// test binary live on one PostgreSQL server, started on first use and stopped by
// RunTests; each test has its own database, so tests and packages run in parallel.
func PostgresDB(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), shared.seq.Add(1))
	if base := os.Getenv(EnvPostgresURL); base != "" {
		u, err := createOn(ctx, base, name)
		if err != nil {
			t.Fatalf("local.PostgresDB: %v", err)
		}
		return u
	}
	shared.mu.Lock()
	if shared.pg == nil && shared.err == nil {
		shared.pg, shared.err = StartPostgres(ctx, PostgresOptions{})
	}
	pg, err := shared.pg, shared.err
	shared.mu.Unlock()
	if err != nil {
		t.Fatalf("local.PostgresDB: %v", err)
	}
	u, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("local.PostgresDB: %v", err)
	}
	return u
}

func createOn(ctx context.Context, base, name string) (string, error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", EnvPostgresURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", EnvPostgresURL, err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// RunTests runs the tests and then stops the shared servers. Use it from TestMain in every
// package that calls PostgresDB:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m)) }
func RunTests(m *testing.M) int {
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.pg != nil {
		_ = shared.pg.Stop()
		_ = shared.pg.Remove()
		shared.pg = nil
	}
	return code
}

// RunTestsNoLeaks is RunTests, and then fails the run when a goroutine outlives the tests
// (goleak), except the one this package keeps for starting servers and any that opts
// ignore. Use it from TestMain in every package that starts goroutines:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.RunTestsNoLeaks(m)) }
func RunTestsNoLeaks(m *testing.M, opts ...goleak.Option) int {
	code := RunTests(m)
	if code != 0 {
		return code
	}
	opts = append(opts, goleak.IgnoreAnyFunction("github.com/quotaplane/quotaplane/internal/testenv.spawn.func1.1"))
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintln(os.Stderr, "goroutine leak:", err)
		return 1
	}
	return 0
}
