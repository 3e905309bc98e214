package store

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/regions"
)

// dropReservedChecks removes migration 4's CHECKs, as on a database where the rows were
// written before it (or by a writer that bypassed it).
func dropReservedChecks(t *testing.T, s *Store) {
	t.Helper()
	exec(t, s, `ALTER TABLE rate_limit_rule DROP CONSTRAINT rate_limit_rule_tenant_reserved, DROP CONSTRAINT rate_limit_rule_route_reserved`)
	exec(t, s, `ALTER TABLE api_key DROP CONSTRAINT api_key_tenant_reserved`)
	exec(t, s, `ALTER TABLE region_share DROP CONSTRAINT region_share_scope_reserved`)
}

// TestBadRowsDoNotStopReload: rows with each reserved name, inserted with plain SQL, are
// skipped and counted; the fleet keeps reloading, so a key created afterwards works within
// 2 s.
func TestBadRowsDoNotStopReload(t *testing.T) {
	t.Parallel()
	s, url := newStore(t)
	ctx := context.Background()
	dropReservedChecks(t, s)
	exec(t, s, `INSERT INTO region (name) VALUES ('us-east'), ('eu-west')`)
	exec(t, s, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('_other', 'r', 1, 1), ('t', '_other', 1, 1)`)
	exec(t, s, `INSERT INTO api_key (key_hash, tenant_id) VALUES (sha256('bad'), '_other')`)
	exec(t, s, `INSERT INTO region_share (scope, region, share, source) VALUES ('_other', 'us-east', 1, 'rebalancer'), ('t/_other', 'eu-west', 1, 'override')`)

	reg := prometheus.NewRegistry()
	r := NewReloader(ReloaderOptions{Load: func(ctx context.Context) (*regions.Snapshot, error) { return s.LoadSnapshot(ctx, 0) },
		ListenURL: url, Interval: time.Minute, Debounce: 10 * time.Millisecond, Registerer: reg})
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(rctx) })
	defer wg.Wait()
	defer cancel()
	deadline := time.Now().Add(5 * time.Second)
	for r.Current() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	snap := r.Current()
	if snap == nil {
		t.Fatal("no snapshot: a bad row stopped the load")
	}
	var got []string
	for _, row := range snap.Skipped() {
		got = append(got, row.Table+" "+row.ID)
	}
	slices.Sort(got)
	want := []string{"api_key 1", "rate_limit_rule _other/r", "rate_limit_rule t/_other", "region_share _other us-east rebalancer", "region_share t/_other eu-west override"}
	if !slices.Equal(got, want) {
		t.Fatalf("skipped %q, want %q", got, want)
	}
	for _, table := range []string{TableRule, TableKey, TableShare} {
		if r.SkippedRows(table) < 1 {
			t.Errorf("skipped rows of %s not counted", table)
		}
	}
	if r.SkippedRows(TableRegion) != 0 {
		t.Errorf("region rows counted as skipped")
	}

	secret, _, err := s.CreateKey(ctx, "shop-a", "")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		if _, ok := r.Current().Tenant(regions.HashKey(secret)); ok {
			break
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("a key created after the bad rows is not visible within 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("new key visible after %v", time.Since(start))
}

// TestReloaderReloadsAtExpiry (issue 17, item 5): an override's expiry is decided by the
// database: the snapshot carries it and the Reloader reloads then, with no notification
// and long before its timer, whatever this process's clock says. Its raise ends
// regions.ExpiryGrace before the expiry (the transition, issue 22).
func TestReloaderReloadsAtExpiry(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "alice", "test")
	for _, r := range []string{"us-east", "eu-west"} {
		if err := s.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = regions.ExpiryGrace + 1500*time.Millisecond
	if err := s.SetOverride(ctx, regions.GlobalScope, map[string]float64{"us-east": 0.9, "eu-west": 0.1}, "alice", "pin", ttl); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	// No LISTEN, and a timer far away: only the expiry can reload in time.
	r := NewReloader(ReloaderOptions{Load: func(ctx context.Context) (*regions.Snapshot, error) { return s.LoadSnapshot(ctx, 0) },
		Interval: time.Hour})
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(rctx) })
	defer wg.Wait()
	defer cancel()
	for r.Current() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if v, src := r.Current().Share("us-east", "t", "r"); v != 0.9 || src != regions.SourceOverride {
		t.Fatalf("before expiry: %v %s, want the override's 0.9", v, src)
	}
	if r.Current().NextExpiry().IsZero() {
		t.Fatal("the snapshot does not carry the override's expiry")
	}
	for {
		if _, src := r.Current().Share("us-east", "t", "r"); src != regions.SourceOverride {
			break
		}
		if time.Since(set) > ttl+2*time.Second {
			t.Fatalf("the override still applies %v after it was set with ttl %v", time.Since(set), ttl)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("override gone %v after it was set with ttl %v", time.Since(set), ttl)
	if d := time.Since(set); d < ttl-regions.ExpiryGrace-200*time.Millisecond {
		t.Fatalf("override dropped after %v, before its ttl %v less the grace %v", d, ttl, regions.ExpiryGrace)
	}
}

// TestLoadWithoutKeys: the rebalancer's load (WithoutKeys) reads no API key, and
// everything else as a gateway's does.
func TestLoadWithoutKeys(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := WithAudit(context.Background(), "alice", "test")
	if err := s.AddRegion(ctx, "us-east"); err != nil {
		t.Fatal(err)
	}
	secret, _, err := s.CreateKey(ctx, "shop-a", "")
	if err != nil {
		t.Fatal(err)
	}
	full, err := s.LoadSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	lean, err := s.Load(ctx, LoadOptions{WithoutKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := full.Tenant(regions.HashKey(secret)); !ok {
		t.Fatal("the full load lacks the key")
	}
	if _, ok := lean.Tenant(regions.HashKey(secret)); ok {
		t.Fatal("the load without keys has the key")
	}
	if !slices.Equal(lean.Regions(), full.Regions()) || lean.RuleCount() != full.RuleCount() {
		t.Fatalf("without keys: regions %v rules %d, want %v %d", lean.Regions(), lean.RuleCount(), full.Regions(), full.RuleCount())
	}
}
