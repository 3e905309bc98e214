package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// TestEmptyURLVariablesRefused is issue 16's incident: the production config with an
// empty RATELIMIT_DATABASE_URL must not start as a standalone gateway with no tenants,
// and an empty RATELIMIT_REDIS_URL must not quietly make limits per instance.
func TestEmptyURLVariablesRefused(t *testing.T) {
	const prod = "../deploy/regions/us-east/gateway.yaml"
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"empty database url", map[string]string{EnvDatabaseURL: "", EnvRedisURL: "redis://127.0.0.1:6379/0"},
			"database_url: RATELIMIT_DATABASE_URL is set but empty"},
		{"blank database url", map[string]string{EnvDatabaseURL: "  ", EnvRedisURL: "redis://127.0.0.1:6379/0"},
			"database_url: RATELIMIT_DATABASE_URL is set but empty"},
		{"unset database url", map[string]string{EnvRedisURL: "redis://127.0.0.1:6379/0"},
			"database_url: mode database needs a PostgreSQL URL"},
		{"empty redis url", map[string]string{EnvDatabaseURL: "postgres://gw@127.0.0.1:5432/q", EnvRedisURL: ""},
			"redis.url: RATELIMIT_REDIS_URL is set but empty"},
		{"unset redis url", map[string]string{EnvDatabaseURL: "postgres://gw@127.0.0.1:5432/q"},
			"redis.url: empty, but the redis section sets timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ov := OverridesFromLookupEnv(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			_, err := LoadConfig(prod, ov)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if strings.Count(err.Error(), "\n") != 0 {
				t.Errorf("want one line, got %q", err)
			}
		})
	}
	ov := OverridesFromLookupEnv(func(k string) (string, bool) {
		return map[string]string{EnvDatabaseURL: "postgres://gw@127.0.0.1:5432/q", EnvRedisURL: "redis://127.0.0.1:6379/0"}[k], true
	})
	c, err := LoadConfig(prod, ov)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != ModeDatabase || c.ModeSource() != modeFromConfig || c.Standalone() {
		t.Fatalf("mode %q from %q, want database from config", c.Mode, c.ModeSource())
	}
}

// TestModeInferred: a config without mode is accepted only when its contents say which;
// the log line then says the mode was inferred.
func TestModeInferred(t *testing.T) {
	c, err := LoadConfig("testdata/good-minimal.yaml", Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != ModeStandalone || c.ModeSource() != modeFromTenantsNoDB {
		t.Errorf("good-minimal: mode %q from %q", c.Mode, c.ModeSource())
	}
	cfg := articleConfig("us-east", "http://127.0.0.1:1", "")
	cfg.Tenants = nil
	cfg.DatabaseURL = "postgres://gw@127.0.0.1:5432/q"
	if err := cfg.normalize(); err != nil {
		t.Fatal(err)
	}
	if cfg.Mode != ModeDatabase || cfg.ModeSource() != modeFromDatabaseURL {
		t.Errorf("database url: mode %q from %q", cfg.Mode, cfg.ModeSource())
	}
	// Normalising again (New does) keeps the answer and the reason.
	if err := cfg.normalize(); err != nil || cfg.ModeSource() != modeFromDatabaseURL {
		t.Errorf("normalize twice: %v, source %q", err, cfg.ModeSource())
	}
	cfg.Redis.Timeout = 0
	cfg.DatabaseURL = ""
	cfg.Mode, cfg.modeSource, cfg.normalized = "", "", false
	if err := cfg.normalize(); err == nil || !strings.Contains(err.Error(), "mode: not set") {
		t.Errorf("neither database nor tenants: got %v", err)
	}
}

// TestFallbackDivisor: N is the live heartbeat count, with expected_instances a floor.
func TestFallbackDivisor(t *testing.T) {
	now := time.Now()
	snap := func(live int) *regions.Snapshot {
		d := regions.SnapshotData{
			Regions: []string{"us-east"}, LoadedAt: now, InstanceTTL: time.Minute,
			Rules: []regions.Rule{{Tenant: "*", Route: "*", Capacity: 10, RefillPerSecond: 1, Shards: 1}},
		}
		for i := range live {
			d.Instances = append(d.Instances, regions.Instance{ID: fmt.Sprint("gw-", i), Region: "us-east", LastSeen: now})
		}
		s, err := regions.NewSnapshot(d)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tc := range []struct{ live, floor, want int }{
		{live: 0, floor: 1, want: 1},   // nothing known: the floor
		{live: 3, floor: 1, want: 3},   // a small fleet is not divided by a big default
		{live: 3, floor: 8, want: 8},   // never below the floor
		{live: 12, floor: 8, want: 12}, // scaled out past it
	} {
		g := &Gateway{cfg: Config{Region: "us-east", ExpectedInstances: tc.floor}}
		g.snap.Store(snap(tc.live))
		if got := g.fallbackInstances(); got != tc.want {
			t.Errorf("live %d floor %d: N = %d, want %d", tc.live, tc.floor, got, tc.want)
		}
	}
	if DefaultExpectedInstances != 1 {
		t.Errorf("default floor %d: documented as 1", DefaultExpectedInstances)
	}
}

// TestNotReadyWithoutRegionRows: a database with no region rows (migrated, never set up)
// gives a snapshot, but the gateway must not report ready on it; the first region row
// makes it ready.
func TestNotReadyWithoutRegionRows(t *testing.T) {
	up := newUpstream(t, 0)
	db := newDatabase(t, testenv.PostgresDB(t)) // no regions
	lp, _ := testenv.FreePort()
	ap, _ := testenv.FreePort()
	cfg := articleConfig("us-east", up.URL, "")
	cfg.Tenants = nil
	cfg.Mode = ModeDatabase
	cfg.DatabaseURL = db.url
	cfg.Listen = fmt.Sprintf("127.0.0.1:%d", lp)
	cfg.AdminListen = fmt.Sprintf("127.0.0.1:%d", ap)
	cfg.ReloadInterval = 100 * time.Millisecond
	g, err := New(cfg, Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	readyz := func() int {
		res, err := http.Get("http://" + cfg.AdminListen + "/readyz")
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
	// Several reloads of the empty database, and never ready.
	waitFor(t, 15*time.Second, "three empty snapshots", func() bool { return testutil.ToFloat64(g.m.reloadErrors) >= 3 })
	if g.Ready() || readyz() != http.StatusServiceUnavailable {
		t.Fatalf("ready on a snapshot without region rows (readyz %d)", readyz())
	}
	if err := db.store.AddRegion(context.Background(), "us-east"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "ready after the first region row", func() bool { return readyz() == http.StatusOK })
}
