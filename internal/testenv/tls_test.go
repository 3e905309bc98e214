package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// TestRedisTLS: the server speaks TLS only, verifies clients, and a client that trusts
// another CA or presents no certificate is refused.
func TestRedisTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	files, err := NewTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := RedisTLS(t, files)
	opts, err := redis.ParseURL(RedisTLSURL(p))
	if err != nil {
		t.Fatal(err)
	}
	if opts.TLSConfig, err = files.ClientConfig(); err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries = -1
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set over TLS: %v", err)
	}

	other, err := NewTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(o *redis.Options){
		"plain":          func(o *redis.Options) { o.TLSConfig = nil },
		"other CA":       func(o *redis.Options) { o.TLSConfig, _ = other.ClientConfig() },
		"no client cert": func(o *redis.Options) { o.TLSConfig = o.TLSConfig.Clone(); o.TLSConfig.Certificates = nil },
	} {
		o := *opts
		mutate(&o)
		c := redis.NewClient(&o)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.Ping(cctx).Err()
		cancel()
		c.Close()
		if err == nil {
			t.Errorf("%s: ping succeeded", name)
		}
	}
}

// TestPostgresTLS: verify-full against the test CA connects over TLS; against another
// CA it is refused.
func TestPostgresTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	files, err := NewTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := PostgresTLSServer(t, files)
	conn, err := pgx.Connect(ctx, p.TLSURL("postgres", files.CAFile))
	if err != nil {
		t.Fatalf("connect verify-full: %v", err)
	}
	var ssl bool
	if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Errorf("pg_stat_ssl.ssl = %v (%v), want true", ssl, err)
	}
	conn.Close(ctx)

	other, err := NewTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, p.TLSURL("postgres", other.CAFile)); err == nil {
		c.Close(ctx)
		t.Fatal("verify-full against another CA connected")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("error %v does not mention the certificate", err)
	}
}
