package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// countingTracer counts the statements sent to the server.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// tracedStore is a migrated store on a new database whose statements tr counts.
func tracedStore(t *testing.T, tr *countingTracer) *Store {
	t.Helper()
	url := testenv.PostgresDB(t)
	ctx := context.Background()
	s, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s.Close()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &Store{pool: pool, fail: func(op string, err error) error { return fmt.Errorf("%s: %w", op, err) }}
}

// TestApplyManyRules: a file of thousands of rules is written in a few statements, not
// one per rule (a 100k-rule apply sent 100k and hit the timeout), and exactly as planned:
// adds, changes and deletes, one audit row each.
func TestApplyManyRules(t *testing.T) {
	t.Parallel()
	tr := &countingTracer{}
	s := tracedStore(t, tr)
	ctx := context.Background()
	const n = 3000
	rules := func(capacity int64, from, to int) *[]regions.Rule {
		rs := []regions.Rule{defaultRule()}
		for i := from; i < to; i++ {
			rs = append(rs, regions.Rule{Tenant: fmt.Sprintf("t%05d", i), Route: "r", Capacity: capacity, RefillPerSecond: 1, Shards: 1})
		}
		return &rs
	}
	before := tr.n.Load()
	changes, err := s.Apply(ctx, Config{Rules: rules(5, 0, n)}, "alice", "bulk")
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != n {
		t.Errorf("applied %d changes, want %d", len(changes), n)
	}
	if sent := tr.n.Load() - before; sent > 20 {
		t.Errorf("adding %d rules sent %d statements, want a handful", n, sent)
	}
	// Change the first half's capacity, drop the last third, add as many.
	before = tr.n.Load()
	next := rules(7, 0, n/2)
	*next = append(*next, (*rules(5, n/2, 2*n/3))[1:]...)
	*next = append(*next, (*rules(9, n, n+n/3))[1:]...)
	changes, err = s.Apply(ctx, Config{Rules: next, Prune: Prune{Rules: true}}, "alice", "bulk 2")
	if err != nil {
		t.Fatal(err)
	}
	if want := n/2 + (n - 2*n/3) + n/3; len(changes) != want {
		t.Errorf("applied %d changes, want %d", len(changes), want)
	}
	if sent := tr.n.Load() - before; sent > 20 {
		t.Errorf("changing %d rules sent %d statements, want a handful", len(changes), sent)
	}
	for q, want := range map[string]int{
		`SELECT count(*) FROM rate_limit_rule`:                                       1 + 2*n/3 + n/3,
		`SELECT count(*) FROM rate_limit_rule WHERE capacity = 7`:                    n / 2,
		`SELECT count(*) FROM rate_limit_rule WHERE capacity = 9`:                    n / 3,
		`SELECT count(*) FROM audit_log WHERE reason = 'bulk 2'`:                     len(changes),
		`SELECT count(*) FROM audit_log WHERE reason = 'bulk 2' AND actor = 'alice'`: len(changes),
	} {
		if got := count(t, s, q); got != want {
			t.Errorf("%s = %d, want %d", q, got, want)
		}
	}
	if p, err := s.Plan(ctx, Config{Rules: next, Prune: Prune{Rules: true}}); err != nil || len(p) != 0 {
		t.Errorf("plan after apply: %d changes, %v; want none", len(p), err)
	}
}
