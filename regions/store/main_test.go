package store

import (
	"context"
	"os"
	"testing"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTestsNoLeaks(m)) }

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
