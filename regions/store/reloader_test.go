package store

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// countingLoad returns a Load func that builds a fresh snapshot (or fails while fail is
// set) and counts its calls.
func countingLoad(loads *atomic.Int32, fail *atomic.Bool) func(context.Context) (*regions.Snapshot, error) {
	return func(context.Context) (*regions.Snapshot, error) {
		loads.Add(1)
		if fail.Load() {
			return nil, errors.New("database down")
		}
		return regions.NewSnapshot(regions.SnapshotData{Rules: []regions.Rule{defaultRule()}, LoadedAt: time.Now()})
	}
}

func TestReloaderTimer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var (
			loads, errs, reloads atomic.Int32
			fail                 atomic.Bool
		)
		r := NewReloader(ReloaderOptions{
			Load:     countingLoad(&loads, &fail),
			Interval: 30 * time.Second,
			OnError:  func(error) { errs.Add(1) },
			OnReload: func(*regions.Snapshot) { reloads.Add(1) },
		})
		if r.Current() != nil {
			t.Fatal("Current before any load is not nil")
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		step := func(d time.Duration, wantLoads int32) {
			t.Helper()
			time.Sleep(d)
			synctest.Wait()
			if got := loads.Load(); got != wantLoads {
				t.Fatalf("at %v: %d loads, want %d", d, got, wantLoads)
			}
		}
		step(0, 1) // at once
		if r.Current() == nil {
			t.Fatal("no snapshot after the first load")
		}
		step(29*time.Second, 1)
		step(time.Second, 2) // t=30s
		step(30*time.Second, 3)

		fail.Store(true)
		prev := r.Current()
		step(30*time.Second, 4) // t=90s: fails
		if r.Current() != prev || errs.Load() != 1 {
			t.Fatalf("after a failed load: snapshot replaced=%v, %d errors", r.Current() != prev, errs.Load())
		}
		step(500*time.Millisecond, 5) // retries with backoff
		step(time.Second, 6)
		step(2*time.Second, 7)
		if r.Current() != prev || errs.Load() != 4 {
			t.Fatal("failed retries replaced the snapshot or were not reported")
		}
		fail.Store(false)
		step(4*time.Second, 8) // t=97.5s: succeeds
		if r.Current() == prev || reloads.Load() != 4 {
			t.Fatalf("the recovered load was not swapped in (%d reloads)", reloads.Load())
		}
		step(22*time.Second, 8)       // no more retries
		step(500*time.Millisecond, 9) // t=120s: the timer again
		step(29*time.Second+499*time.Millisecond, 9)

		cancel()
		synctest.Wait()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v, want nil after cancel", err)
		}
	})
}

func TestReloaderDebouncesNotifications(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var (
			loads atomic.Int32
			fail  atomic.Bool
		)
		r := NewReloader(ReloaderOptions{Load: countingLoad(&loads, &fail), Interval: time.Hour})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go r.Run(ctx)
		synctest.Wait()
		for i := range 5 { // a burst over 40 ms
			r.notify()
			if i < 4 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		synctest.Wait()
		if n := loads.Load(); n != 1 {
			t.Fatalf("%d loads during the burst, want 1 (the initial one)", n)
		}
		time.Sleep(60 * time.Millisecond) // 100 ms after the first notification
		synctest.Wait()
		if n := loads.Load(); n != 2 {
			t.Fatalf("%d loads after the burst, want 2", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := loads.Load(); n != 2 {
			t.Fatalf("%d loads a second later, want 2", n)
		}
		r.notify()
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if n := loads.Load(); n != 3 {
			t.Fatalf("%d loads after a lone notification, want 3", n)
		}
	})
}

func TestReloaderKeepsPreviousOnFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	good := mustSnapshot(t, regions.SnapshotData{Rules: []regions.Rule{defaultRule()}})
	results := []func() (*regions.Snapshot, error){
		func() (*regions.Snapshot, error) { return good, nil },
		func() (*regions.Snapshot, error) { return nil, errors.New("boom") },
		func() (*regions.Snapshot, error) { return nil, nil },
		func() (*regions.Snapshot, error) {
			return regions.NewSnapshot(regions.SnapshotData{}) // invalid: no default rule
		},
	}
	var i int
	var errs []error
	r := NewReloader(ReloaderOptions{
		Load:    func(context.Context) (*regions.Snapshot, error) { f := results[i]; i++; return f() },
		OnError: func(err error) { errs = append(errs, err) },
	})
	if err := r.Reload(ctx); err != nil || r.Current() != good {
		t.Fatalf("first Reload = %v", err)
	}
	for range 3 {
		if err := r.Reload(ctx); err == nil {
			t.Fatal("a failed load reported success")
		}
		if r.Current() != good {
			t.Fatal("a failed load replaced the snapshot")
		}
	}
	if len(errs) != 3 {
		t.Fatalf("OnError called %d times, want 3", len(errs))
	}

	static := mustSnapshot(t, regions.SnapshotData{Rules: []regions.Rule{defaultRule()}})
	r.SetStatic(static)
	if r.Current() != static {
		t.Fatal("SetStatic did not take")
	}
	if err := NewReloader(ReloaderOptions{}).Run(ctx); err == nil {
		t.Fatal("Run without Load succeeded")
	}
}

func TestReloaderRunOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var (
			loads atomic.Int32
			fail  atomic.Bool
		)
		r := NewReloader(ReloaderOptions{Load: countingLoad(&loads, &fail)})
		ctx, cancel := context.WithCancel(t.Context())
		go r.Run(ctx)
		synctest.Wait()
		if err := r.Run(ctx); err == nil {
			t.Fatal("a second concurrent Run succeeded")
		}
		cancel()
		synctest.Wait()
	})
}

// waitFor polls cond every 5 ms until it holds or d passes, and returns the time it took.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func TestReloaderFollowsDatabaseChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, url := newStore(t)
	if err := s.AddRegion(ctx, "us-east"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddRegion(ctx, "eu-west"); err != nil {
		t.Fatal(err)
	}
	secret, _, err := s.CreateKey(ctx, "shop-a", "")
	if err != nil {
		t.Fatal(err)
	}
	r := NewReloader(ReloaderOptions{
		Load:      func(ctx context.Context) (*regions.Snapshot, error) { return s.LoadSnapshot(ctx, time.Minute) },
		ListenURL: url,
		Interval:  time.Hour, // only NOTIFY can explain a prompt reload
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	// Run listens before its first load, so every change after that load is notified.
	waitFor(t, 10*time.Second, "first snapshot", func() bool { return r.Current() != nil })

	changes := []struct {
		name string
		sql  string
		seen func(*regions.Snapshot) bool
	}{
		{"rule change", `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('shop-a', 'create-order', 2, 1)`,
			func(s *regions.Snapshot) bool { return s.Rule("shop-a", "create-order").Capacity == 2 }},
		{"share change", `INSERT INTO region_share (scope, region, share, source) VALUES ('shop-a', 'us-east', 0.7, 'rebalancer')`,
			func(s *regions.Snapshot) bool {
				v, _ := s.Share("us-east", "shop-a", "create-order")
				return v == 0.7
			}},
		{"key revoked", `UPDATE api_key SET revoked_at = now()`,
			func(s *regions.Snapshot) bool { _, ok := s.Tenant(regions.HashKey(secret)); return !ok }},
		{"region added", `INSERT INTO region (name) VALUES ('ap-south')`,
			func(s *regions.Snapshot) bool { return len(s.Regions()) == 3 }},
	}
	for _, c := range changes {
		exec(t, s, c.sql)
		took := waitFor(t, time.Second, c.name, func() bool { return c.seen(r.Current()) })
		t.Logf("%s visible after %v", c.name, took)
	}
}

func TestReloaderSurvivesPostgresOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.PostgresServer(t)
	url, err := pg.CreateDatabase(ctx, "quotaplane")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// The test server runs with synchronous_commit=off: without a checkpoint the kill
	// below may lose the last migration's commit, and the loader would then read a schema
	// older than it is built for.
	exec(t, s, `CHECKPOINT`)
	var errs atomic.Int32
	r := NewReloader(ReloaderOptions{
		Load:        func(ctx context.Context) (*regions.Snapshot, error) { return s.LoadSnapshot(ctx, time.Minute) },
		ListenURL:   url,
		Interval:    time.Second,
		LoadTimeout: 2 * time.Second,
		OnError:     func(error) { errs.Add(1) },
		Logger:      slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	waitFor(t, 10*time.Second, "first snapshot", func() bool { return r.Current() != nil })
	prev := r.Current()

	// The test server commits asynchronously (testenv: synchronous_commit=off), so a
	// crash can lose the last migrations' commits; this test is about the reloader, not
	// about durability.
	exec(t, s, `CHECKPOINT`)
	if err := pg.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "failed reloads while PostgreSQL is down", func() bool { return errs.Load() >= 3 })
	if r.Current() != prev {
		t.Fatal("the snapshot changed while PostgreSQL was down")
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned while PostgreSQL was down: %v", err)
	default:
	}

	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The first write may meet a pooled connection that died with the server.
	waitFor(t, 10*time.Second, "write after restart", func() bool {
		return s.SetRule(ctx, regions.Rule{Tenant: "shop-a", Route: "*", Capacity: 7, RefillPerSecond: 1}) == nil
	})
	took := waitFor(t, 10*time.Second, "change after restart", func() bool { return r.Current().Rule("shop-a", "x").Capacity == 7 })
	t.Logf("change after restart visible after %v", took)
}
