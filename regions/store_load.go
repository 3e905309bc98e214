package regions

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// LoadSnapshot reads everything a gateway needs in one read-only, repeatable-read
// transaction (one consistent view) and builds a Snapshot: regions, rules, valid keys,
// active shares, and the instances seen within instanceTTL (all when instanceTTL <= 0).
// LoadedAt and instance liveness use the database's clock, so gateway clocks do not matter.
func (s *Store) LoadSnapshot(ctx context.Context, instanceTTL time.Duration) (*Snapshot, error) {
	var d SnapshotData
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return loadData(ctx, tx, instanceTTL, &d)
	})
	if err != nil {
		return nil, fmt.Errorf("load snapshot: %w", err)
	}
	snap, err := NewSnapshot(d)
	if err != nil {
		return nil, fmt.Errorf("load snapshot: %w", err)
	}
	return snap, nil
}

func loadData(ctx context.Context, tx pgx.Tx, instanceTTL time.Duration, d *SnapshotData) error {
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&d.LoadedAt); err != nil {
		return fmt.Errorf("read clock: %w", err)
	}
	d.InstanceTTL = instanceTTL
	// Tenant ids repeat across rules and keys; hold each once.
	intern := make(map[string]string)
	in := func(b []byte) string {
		if s, ok := intern[string(b)]; ok { // no allocation for the lookup
			return s
		}
		s := string(b)
		intern[s] = s
		return s
	}

	rows, _ := tx.Query(ctx, `SELECT name FROM region ORDER BY name`)
	regions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read regions: %w", err)
	}
	d.Regions = regions

	var nRules int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM rate_limit_rule`).Scan(&nRules); err != nil {
		return fmt.Errorf("count rules: %w", err)
	}
	d.Rules = make([]Rule, 0, nRules)
	rows, _ = tx.Query(ctx, `SELECT tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at FROM rate_limit_rule`)
	var (
		tenant, route []byte
		r             Rule
	)
	_, err = pgx.ForEachRow(rows, []any{&tenant, &route, &r.Capacity, &r.RefillPerSecond, &r.Shadow, &r.Shards, &r.UpdatedAt}, func() error {
		r.Tenant, r.Route = in(tenant), in(route)
		d.Rules = append(d.Rules, r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read rules: %w", err)
	}

	if err := loadKeys(ctx, tx, d, in); err != nil {
		return err
	}

	rows, _ = tx.Query(ctx, `SELECT scope, region, share, source, expires_at, updated_at, reason FROM region_share
		WHERE expires_at IS NULL OR expires_at > now()`)
	d.Shares, err = pgx.CollectRows(rows, scanShare)
	if err != nil {
		return fmt.Errorf("read shares: %w", err)
	}

	if instanceTTL > 0 {
		rows, _ = tx.Query(ctx, `SELECT id, region, last_seen FROM gateway_instance WHERE last_seen >= now() - $1::double precision * interval '1 microsecond'`, instanceTTL.Microseconds())
	} else {
		rows, _ = tx.Query(ctx, `SELECT id, region, last_seen FROM gateway_instance`)
	}
	d.Instances, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Instance])
	if err != nil {
		return fmt.Errorf("read instances: %w", err)
	}
	return nil
}

// loadKeys reads the valid keys with the raw wire values (no per-row allocation but the
// slice itself): there may be millions of them.
func loadKeys(ctx context.Context, tx pgx.Tx, d *SnapshotData, in func([]byte) string) error {
	var nKeys int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM api_key WHERE revoked_at IS NULL`).Scan(&nKeys); err != nil {
		return fmt.Errorf("count keys: %w", err)
	}
	d.Keys = make([]APIKey, 0, nKeys)
	rows, err := tx.Query(ctx, `SELECT id, key_hash, tenant_id FROM api_key WHERE revoked_at IS NULL`)
	if err != nil {
		return fmt.Errorf("read keys: %w", err)
	}
	defer rows.Close()
	fd := rows.FieldDescriptions()
	for rows.Next() {
		v := rows.RawValues()
		var k APIKey
		if fd[0].Format == pgx.BinaryFormatCode && len(v[0]) == 8 {
			k.ID = int64(binary.BigEndian.Uint64(v[0]))
		} else if k.ID, err = strconv.ParseInt(string(v[0]), 10, 64); err != nil {
			return fmt.Errorf("read keys: id %q: %w", v[0], err)
		}
		if fd[1].Format != pgx.BinaryFormatCode || len(v[1]) != len(k.Hash) {
			// Not expected from pgx; fall back to the generic decoder.
			var h []byte
			if err := rows.Scan(nil, &h, nil); err != nil || len(h) != len(k.Hash) {
				return fmt.Errorf("read keys: key %d: hash of %d bytes (%v)", k.ID, len(h), err)
			}
			copy(k.Hash[:], h)
		} else {
			copy(k.Hash[:], v[1])
		}
		k.Tenant = in(v[2]) // text is the same in both formats
		d.Keys = append(d.Keys, k)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read keys: %w", err)
	}
	return nil
}

func scanShare(row pgx.CollectableRow) (Share, error) {
	var (
		sh      Share
		scope   string
		source  string
		expires *time.Time
	)
	if err := row.Scan(&scope, &sh.Region, &sh.Share, &source, &expires, &sh.UpdatedAt, &sh.Reason); err != nil {
		return Share{}, err
	}
	sc, err := ParseScope(scope)
	if err != nil {
		return Share{}, err
	}
	sh.Scope, sh.Source = sc, Source(source)
	if expires != nil {
		sh.ExpiresAt = *expires
	}
	return sh, nil
}
