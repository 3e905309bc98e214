package store

import (
	"context"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

func TestMain(m *testing.M) {
	code := testenv.RunTests(m)
	if code == 0 {
		// Every Reloader.Run and Store must have cleaned up after itself.
		// internal/testenv keeps one OS-thread-locked goroutine that starts servers.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/quotaplane/quotaplane/internal/testenv.spawn.func1.1")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newStore opens a migrated store on a new empty database.
func newStore(t *testing.T) (*Store, string) {
	t.Helper()
	url := testenv.PostgresDB(t)
	ctx := context.Background()
	s, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s, url
}

// exec runs SQL directly, as an operator with psql would.
func exec(t *testing.T, s *Store, sql string, args ...any) {
	t.Helper()
	if _, err := s.Pool().Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, s *Store, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func defaultRule() regions.Rule {
	return regions.Rule{Tenant: "*", Route: "*", Capacity: 20, RefillPerSecond: 10, Shards: 1}
}

func mustSnapshot(t *testing.T, d regions.SnapshotData) *regions.Snapshot {
	t.Helper()
	s, err := regions.NewSnapshot(d)
	if err != nil {
		t.Fatalf("NewSnapshot: %v", err)
	}
	return s
}
