package faults

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
)

// Tables is the control plane's content at one moment, as comparable rows.
type Tables struct {
	Rules     []string // tenant|route|capacity|refill|shadow|shards (updated_at left out)
	Keys      []string // id|hash|tenant|created_at|revoked_at
	Regions   []string
	Overrides []string           // scope|region|share|expires_at
	Shares    map[string]float64 // rebalancer rows: scope|region -> share
	History   []HistoryRow
}

// HistoryRow is one region_share_history row.
type HistoryRow struct {
	ID                 int64
	Scope, Region, Src string
	Old, New           *float64
	At, Actor, Reason  string
	ExpiresAt          string
}

func (h HistoryRow) String() string {
	return fmt.Sprintf("%d %s %s %s %s->%s at %s by %s", h.ID, h.Scope, h.Region, h.Src, f64(h.Old), f64(h.New), h.At, h.Actor)
}

func f64(p *float64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprintf("%.6f", *p)
}

// ReadTables reads every control-plane table in one repeatable-read transaction. It
// first commits a transaction with synchronous_commit on, which flushes the WAL up to
// it: every row read here is durable, so a PostgreSQL kill afterwards cannot take it.
func (e *Env) ReadTables(ctx context.Context) (*Tables, error) {
	pool := e.Store.Pool()
	if _, err := pool.Exec(ctx, `BEGIN; SET LOCAL synchronous_commit = on; SELECT txid_current(); COMMIT`); err != nil {
		return nil, fmt.Errorf("flush wal: %w", err)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("read tables: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	t := &Tables{Shares: map[string]float64{}}
	lists := []struct {
		dst *[]string
		sql string
	}{
		{&t.Rules, `SELECT concat_ws('|', tenant_id, route_id, capacity, refill_per_second, shadow, shards) FROM rate_limit_rule ORDER BY 1`},
		{&t.Keys, `SELECT concat_ws('|', id, encode(key_hash, 'hex'), tenant_id, created_at, coalesce(revoked_at::text, '-')) FROM api_key ORDER BY id`},
		{&t.Regions, `SELECT name FROM region ORDER BY 1`},
		{&t.Overrides, `SELECT concat_ws('|', scope, region, share, coalesce(expires_at::text, '-')) FROM region_share WHERE source = 'override' ORDER BY 1`},
	}
	for _, l := range lists {
		rows, _ := tx.Query(ctx, l.sql)
		v, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read tables: %s: %w", l.sql, err)
		}
		*l.dst = v
	}
	rows, _ := tx.Query(ctx, `SELECT scope || '|' || region, share FROM region_share WHERE source = 'rebalancer'`)
	var k string
	var v float64
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { t.Shares[k] = v; return nil }); err != nil {
		return nil, fmt.Errorf("read tables: shares: %w", err)
	}
	rows, _ = tx.Query(ctx, `SELECT id, scope, region, source, old_share, new_share, at::text, actor, reason, coalesce(expires_at::text, '-')
		FROM region_share_history ORDER BY id`)
	t.History, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (HistoryRow, error) {
		var h HistoryRow
		err := r.Scan(&h.ID, &h.Scope, &h.Region, &h.Src, &h.Old, &h.New, &h.At, &h.Actor, &h.Reason, &h.ExpiresAt)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("read tables: history: %w", err)
	}
	return t, nil
}

// Compare lists what after lost or duplicated relative to before: rules, keys, regions
// and overrides must be equal; no rebalancer share row may disappear; every history
// row of before must be in after unchanged; and after's history must be one unbroken
// chain per (scope, region, source) ending in the current share, which a lost or
// repeated write would break.
func Compare(before, after *Tables) []string {
	var out []string
	eq := func(what string, a, b []string) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			out = append(out, fmt.Sprintf("%s changed:\n  before %q\n  after  %q", what, a, b))
		}
	}
	eq("rate_limit_rule", before.Rules, after.Rules)
	eq("api_key", before.Keys, after.Keys)
	eq("region", before.Regions, after.Regions)
	eq("override shares", before.Overrides, after.Overrides)
	for k := range before.Shares {
		if _, ok := after.Shares[k]; !ok {
			out = append(out, "rebalancer share "+k+" lost")
		}
	}
	byID := map[int64]HistoryRow{}
	for _, h := range after.History {
		if _, dup := byID[h.ID]; dup {
			out = append(out, fmt.Sprintf("history id %d twice", h.ID))
		}
		byID[h.ID] = h
	}
	for _, h := range before.History {
		if a, ok := byID[h.ID]; !ok || a.String() != h.String() || a.Reason != h.Reason {
			out = append(out, "history row lost or changed: "+h.String())
		}
	}
	out = append(out, after.chainProblems()...)
	return out
}

// chainProblems checks that each (scope, region, source) history, in id order, chains:
// every old_share is the previous new_share, and the last new_share is the row in
// region_share now (nil when it was deleted). Overrides are not tracked in Shares, so
// their chains end unchecked.
func (t *Tables) chainProblems() []string {
	type key struct{ scope, region, src string }
	last := map[key]*float64{}
	seen := map[key]bool{}
	var out []string
	for _, h := range t.History {
		k := key{h.Scope, h.Region, h.Src}
		if seen[k] && !sameShare(last[k], h.Old) {
			out = append(out, fmt.Sprintf("history of %s/%s/%s breaks at %s: previous new share %s", h.Scope, h.Region, h.Src, h, f64(last[k])))
		}
		seen[k], last[k] = true, h.New
	}
	keys := make([]key, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
	for _, k := range keys {
		if k.src != "rebalancer" {
			continue
		}
		cur, ok := t.Shares[k.scope+"|"+k.region]
		var now *float64
		if ok {
			now = &cur
		}
		if !sameShare(now, last[k]) {
			out = append(out, fmt.Sprintf("history of %s/%s ends at %s but the share is %s", k.scope, k.region, f64(last[k]), f64(now)))
		}
	}
	return out
}

func sameShare(a, b *float64) bool {
	if a == nil || b == nil {
		return a == b
	}
	d := *a - *b
	return d < 1e-12 && d > -1e-12
}
