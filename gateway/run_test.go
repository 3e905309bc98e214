package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// TestRunStopsCleanly runs a database-mode gateway in process, serves a request, cancels
// and checks that Run returns and leaves no goroutine behind.
func TestRunStopsCleanly(t *testing.T) {
	up := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t), "us-east")
	db.setRule(t, regions.Rule{Tenant: "shop-a", Route: "create-order", Capacity: 2, RefillPerSecond: 0.5})
	key, _ := db.createKey(t, "shop-a")
	rp := testenv.Redis(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	lp, _ := testenv.FreePort()
	ap, _ := testenv.FreePort()
	cfg := articleConfig("us-east", up.URL, testenv.RedisURL(rp))
	cfg.Tenants = nil
	cfg.DatabaseURL = db.url
	cfg.Listen = fmt.Sprintf("127.0.0.1:%d", lp)
	cfg.AdminListen = fmt.Sprintf("127.0.0.1:%d", ap)
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.Metrics.TenantInterval = 50 * time.Millisecond
	// This test is about the lifecycle: a generous timeout keeps a CPU-starved CI box's
	// stalls from sending the article's third request to the fallback bucket.
	cfg.Redis.Timeout = 250 * time.Millisecond
	g, err := New(cfg, Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- g.Run(ctx) }()
	waitFor(t, 10*time.Second, "ready", g.Ready)
	checkArticle(t, "http://"+cfg.Listen, key)
	waitFor(t, 5*time.Second, "heartbeat row", func() bool {
		list, err := db.store.Instances(context.Background())
		return err == nil && len(list) == 1 && list[0].ID == g.InstanceID()
	})
	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if g.Ready() {
		t.Error("still ready after Run returned")
	}
	list, err := db.store.Instances(context.Background())
	if err != nil || len(list) != 0 {
		t.Errorf("heartbeat rows after stop: %v (%v), want none", list, err)
	}
}

// TestRunFailsOnBusyPort: a listen address in use is Run's error, not a hang.
func TestRunFailsOnBusyPort(t *testing.T) {
	up := newUpstream(t, 0)
	srv := newInProcess(t, articleConfig("us-east", up.URL, ""))
	cfg := articleConfig("us-east", up.URL, "")
	cfg.Listen = srv.srv.Listener.Addr().String()
	g, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background()); err == nil {
		t.Fatal("Run on a busy port returned nil")
	}
}

// TestRotateTenantsLoop: the rotation loop runs every tenant_interval and stops with ctx.
func TestRotateTenantsLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := articleConfig("us-east", "http://127.0.0.1:1", "")
		cfg.Metrics.MaxTenants = 1
		cfg.Metrics.TenantInterval = time.Minute
		g, err := New(cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		g.tenants.count("quiet", "create-order", decAllowed)
		g.tenants.count("busy", "create-order", decAllowed)
		g.tenants.count("busy", "create-order", decAllowed)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { g.rotateTenants(ctx); close(done) }()
		time.Sleep(59 * time.Second)
		synctest.Wait()
		g.tenants.mu.RLock()
		_, quiet := g.tenants.tracked[pairKey{"quiet", "create-order"}]
		g.tenants.mu.RUnlock()
		if !quiet {
			t.Fatal("rotated before tenant_interval")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		g.tenants.mu.RLock()
		_, busy := g.tenants.tracked[pairKey{"busy", "create-order"}]
		g.tenants.mu.RUnlock()
		if !busy {
			t.Fatal("busy pair not tracked after one tenant_interval")
		}
		cancel()
		<-done
	})
}

// failingListener's Accept fails at once with a permanent error, so Serve returns it.
type failingListener struct{ net.Listener }

func (failingListener) Accept() (net.Conn, error) { return nil, errors.New("accept: broken listener") }

// TestRunReturnsWhenServeFails: a server whose Serve fails ends Run with that error,
// promptly, with every goroutine gone (it used to wait for a third server result).
func TestRunReturnsWhenServeFails(t *testing.T) {
	for _, which := range []string{"proxy", "admin"} {
		t.Run(which, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			cfg := articleConfig("us-east", "http://127.0.0.1:1", "")
			cfg.DrainTimeout = time.Second
			g, err := New(cfg, Options{})
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			aln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			if which == "proxy" {
				ln = failingListener{ln}
			} else {
				aln = failingListener{aln}
			}
			done := make(chan error, 1)
			go func() { done <- g.run(t.Context(), ln, aln, nil) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "broken listener") {
					t.Fatalf("Run = %v, want the serve error", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after a serve failure")
			}
			_ = ln.Close()
			_ = aln.Close()
		})
	}
}
