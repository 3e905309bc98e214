package store

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// Regions lists the region names, sorted.
func (s *Store) Regions(ctx context.Context) ([]string, error) {
	names, err := regionNames(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("list regions: %w", err)
	}
	return names, nil
}

// regionNames reads the region names, sorted: the one read of the region set (Regions,
// the loader, Export and Apply, the share writers under their region lock).
func regionNames(ctx context.Context, q querier) ([]string, error) {
	rows, _ := q.Query(ctx, `SELECT name FROM region ORDER BY name`)
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// NewRegionShare is the share a region added to n regions (itself included) starts with
// in every scope that has rebalancer rows: the rebalancer's floor, min(0.05, 0.5/n)
// (rebalancer.DefaultConfig; a test in rebalancer/job holds them equal), or all of it
// when it is the only region.
func NewRegionShare(n int) float64 {
	if n <= 1 {
		return 1
	}
	return math.Min(0.05, 0.5/float64(n))
}

// AddRegion adds a region (ErrExists if it exists), and gives it a row in every scope
// that has rows, in the same transaction, so each scope's rows keep naming every region
// and summing to 1 while no live region loses more than the floor (issue 22: a region
// added with 1/N cut every advertised limit by a third until the next run):
//   - rebalancer rows: the new region starts at NewRegionShare (the floor), and the
//     existing rows are scaled to sum to the rest, keeping their proportions (equally, if
//     they summed to 0). "*" gets rebalancer rows first when it has none (its equal
//     split over the old regions), so every tenant that follows "*" or the equal split
//     keeps its share but for the floor too (once the rebalancer writes: on a database
//     without rebalancer rows, being set up, the regions split equally). The rebalancer gives the new region
//     demand-based shares once its gateways report (until then it is dark, or unknown:
//     its share is kept).
//   - override rows: the new region gets 0 and the operator's split stays as set (an
//     override is an instruction); the override keeps its expiry. Change the override
//     to give the new region traffic.
//
// It serialises with every share write (lockRegions). ratectl apply -f adds regions the
// same way (addRegionTx).
func (s *Store) AddRegion(ctx context.Context, name string) error {
	if err := regions.ValidateID("region", name); err != nil {
		return fmt.Errorf("add region: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		if err := lockRegionsExclusive(ctx, tx); err != nil {
			return err
		}
		return addRegionTx(ctx, tx, name)
	})
	if err != nil {
		return fmt.Errorf("add region %s: %w", name, err)
	}
	return nil
}

// addRegionTx is AddRegion inside tx, which holds the region lock.
func addRegionTx(ctx context.Context, tx pgx.Tx, name string) error {
	tag, err := tx.Exec(ctx, `INSERT INTO region (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name)
	if err != nil {
		return dbErr(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrExists
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM region`).Scan(&n); err != nil {
		return err
	}
	f := NewRegionShare(n)
	if n > 1 {
		// "*" without rebalancer rows is the equal split of the old regions: write it, so
		// the new region's floor comes out of it as out of any scope. Only once the
		// rebalancer writes (some rebalancer row exists): a database without shares is
		// being set up, and its regions split equally.
		if _, err := tx.Exec(ctx, `
			INSERT INTO region_share (scope, region, share, source, reason)
			SELECT '*', name, 1.0 / ($1 - 1), 'rebalancer', 'region added: ' || $2
			FROM region WHERE name <> $2
			  AND NOT EXISTS (SELECT 1 FROM region_share WHERE scope = '*' AND source = 'rebalancer')
			  AND EXISTS (SELECT 1 FROM region_share WHERE source = 'rebalancer')`, n, name); err != nil {
			return err
		}
	}
	// Rebalancer rows: scale the others to 1 - f.
	if _, err := tx.Exec(ctx, `
		WITH totals AS (
			SELECT scope, sum(share) AS total, count(*) AS k FROM region_share
			WHERE source = 'rebalancer' GROUP BY scope
		)
		UPDATE region_share r
		SET share = CASE WHEN t.total > 0 THEN least(1, r.share / t.total * (1 - $1::float8)) ELSE (1 - $1::float8) / t.k END,
		    updated_at = now(), reason = 'region added: ' || $2
		FROM totals t
		WHERE r.scope = t.scope AND r.source = 'rebalancer'`, f, name); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO region_share (scope, region, share, source, expires_at, reason)
		SELECT scope, $1, CASE WHEN source = 'rebalancer' THEN $2::float8 ELSE 0 END, source, max(expires_at), 'region added'
		FROM region_share GROUP BY scope, source`, name, f)
	return dbErr(err)
}

// RegionRemoval says what RemoveRegion does with a region that shares still name.
type RegionRemoval int

const (
	// RefuseInUse refuses (ErrRegionInUse) while any share names the region.
	RefuseInUse RegionRemoval = iota
	// DropShares deletes those shares and renormalises the rest of each scope.
	DropShares
)

// RemoveRegion removes a region. While any share (of any scope or source) names it, it
// refuses with ErrRegionInUse, unless how is DropShares: then those shares are deleted first and the
// remaining regions' shares of each such scope are scaled up to sum to 1 again (equally,
// if they summed to 0), all in the same transaction, each change leaving a history row.
// ErrNotFound if there is no such region.
func (s *Store) RemoveRegion(ctx context.Context, name string, how RegionRemoval) error {
	if err := regions.ValidateID("region", name); err != nil {
		return fmt.Errorf("remove region: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		if err := lockRegionsExclusive(ctx, tx); err != nil {
			return err
		}
		return removeRegionTx(ctx, tx, name, how)
	})
	if err != nil {
		return fmt.Errorf("remove region %s: %w", name, err)
	}
	return nil
}

// removeRegionTx is RemoveRegion inside tx, which holds the region lock: the region's
// shares go to the others of each scope in the same transaction.
func removeRegionTx(ctx context.Context, tx pgx.Tx, name string, how RegionRemoval) error {
	var locked string
	switch err := tx.QueryRow(ctx, `SELECT name FROM region WHERE name = $1 FOR UPDATE`, name).Scan(&locked); {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return err
	}
	shares, err := sharesInForce(ctx, tx, name)
	if err != nil {
		return err
	}
	if shares > 0 && how != DropShares {
		return fmt.Errorf("%w: %d share rows name it (clear them, or force)", ErrRegionInUse, shares)
	}
	// The rows of expired overrides are over: they go, without rescaling anything.
	if err := deleteExpiredOverrideRows(ctx, tx, name); err != nil {
		return err
	}
	// The (scope, source) sets that named the region, to renormalise after the delete.
	var scopes, sources []string
	rows, _ := tx.Query(ctx, `SELECT DISTINCT scope, source FROM region_share WHERE region = $1`, name)
	var sc, src string
	if _, err := pgx.ForEachRow(rows, []any{&sc, &src}, func() error {
		scopes, sources = append(scopes, sc), append(sources, src)
		return nil
	}); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM region_share WHERE region = $1`, name); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `
		WITH sets AS (SELECT * FROM unnest($1::text[], $2::text[]) AS s(scope, source)),
		totals AS (
			SELECT r.scope, r.source, sum(r.share) AS total, count(*) AS n
			FROM region_share r JOIN sets USING (scope, source)
			GROUP BY r.scope, r.source
		)
		UPDATE region_share r
		SET share = CASE WHEN t.total > 0 THEN r.share / t.total ELSE 1.0 / t.n END,
		    updated_at = now()
		FROM totals t
		WHERE r.scope = t.scope AND r.source = t.source`, scopes, sources); err != nil {
		return err
	}
	return dbErr(deleteRegion(ctx, tx, name))
}

// deleteRegion deletes the row of region name, once no share names it: RemoveRegion and
// Apply (--prune regions) share it.
func deleteRegion(ctx context.Context, tx pgx.Tx, name string) error {
	_, err := tx.Exec(ctx, `DELETE FROM region WHERE name = $1`, name)
	return err
}

// sharesInForce counts the share rows that name region and still apply: every rebalancer
// row, and the override rows not expired (those wait for the rebalancer to delete them,
// and block nothing).
func sharesInForce(ctx context.Context, tx pgx.Tx, region string) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM region_share WHERE region = $1
		AND NOT (source = 'override' AND expires_at IS NOT NULL AND expires_at <= now())`, region).Scan(&n)
	return n, err
}

// deleteExpiredOverrideRows deletes the rows of expired overrides that name region, so it
// can be removed (each leaves a share-history row, as every delete does).
func deleteExpiredOverrideRows(ctx context.Context, tx pgx.Tx, region string) error {
	_, err := tx.Exec(ctx, `DELETE FROM region_share WHERE region = $1
		AND source = 'override' AND expires_at IS NOT NULL AND expires_at <= now()`, region)
	return err
}
