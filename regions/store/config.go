package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/quotaplane/quotaplane/regions"
)

// Regions lists the region names, sorted.
func (s *Store) Regions(ctx context.Context) ([]string, error) {
	rows, _ := s.pool.Query(ctx, `SELECT name FROM region ORDER BY name`)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list regions: %w", err)
	}
	return names, nil
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
	_, err = tx.Exec(ctx, `DELETE FROM region WHERE name = $1`, name)
	return dbErr(err)
}

// KeyPrefix starts every API key secret, so a leaked key is recognisable (secret scanners).
const KeyPrefix = "qp_"

// maxLabel is the longest key label, in characters (the schema's limit).
const maxLabel = 200

// CreateKey makes a new API key for tenant: 256 random bits, returned once as
// KeyPrefix + base64url (no padding). Only HashKey(secret) is stored. The tenant need not
// have rules yet (see TenantExists).
func (s *Store) CreateKey(ctx context.Context, tenant, label string) (string, regions.APIKey, error) {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return "", regions.APIKey{}, fmt.Errorf("create key: %w", err)
	}
	if err := validateLabel(label); err != nil {
		return "", regions.APIKey{}, fmt.Errorf("create key for %s: %w", tenant, err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", regions.APIKey{}, fmt.Errorf("create key for %s: %w", tenant, err)
	}
	secret := KeyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	k := regions.APIKey{Hash: regions.HashKey(secret), Tenant: tenant, Label: label}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		return dbErr(tx.QueryRow(ctx, `INSERT INTO api_key (key_hash, tenant_id, label) VALUES ($1, $2, $3) RETURNING id, created_at`,
			k.Hash[:], tenant, label).Scan(&k.ID, &k.CreatedAt))
	})
	if err != nil {
		return "", regions.APIKey{}, fmt.Errorf("create key for %s: %w", tenant, err)
	}
	return secret, k, nil
}

func validateLabel(label string) error {
	if !utf8.ValidString(label) {
		return fmt.Errorf("%w label: not UTF-8", regions.ErrInvalid)
	}
	if n := utf8.RuneCountInString(label); n > maxLabel {
		return fmt.Errorf("%w label: %d characters, at most %d", regions.ErrInvalid, n, maxLabel)
	}
	for _, r := range label {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w label %q: control characters are not allowed", regions.ErrInvalid, label)
		}
	}
	return nil
}

// Keys lists the keys of tenant ("" = every tenant), revoked ones included, by id.
func (s *Store) Keys(ctx context.Context, tenant string) ([]regions.APIKey, error) {
	if tenant != "" {
		if err := regions.ValidateID("tenant", tenant); err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
	}
	rows, _ := s.pool.Query(ctx, `SELECT id, key_hash, tenant_id, label, created_at, revoked_at FROM api_key
		WHERE $1 = '' OR tenant_id = $1 ORDER BY id`, tenant)
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (regions.APIKey, error) {
		var (
			k       regions.APIKey
			hash    []byte
			revoked *time.Time
		)
		if err := row.Scan(&k.ID, &hash, &k.Tenant, &k.Label, &k.CreatedAt, &revoked); err != nil {
			return regions.APIKey{}, err
		}
		copy(k.Hash[:], hash)
		if revoked != nil {
			k.RevokedAt = *revoked
		}
		return k, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return keys, nil
}

// RevokeKey revokes the key with id; gateways refuse it after their next reload. Revoking a
// revoked key changes nothing; ErrNotFound if there is no such key.
func (s *Store) RevokeKey(ctx context.Context, id int64) error {
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE api_key SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL`, id)
		if err != nil || tag.RowsAffected() == 1 {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM api_key WHERE id = $1)`, id).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return ErrNotFound
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("revoke key %d: %w", id, err)
	}
	return nil
}

// TenantExists reports whether tenant has a rule or a key.
func (s *Store) TenantExists(ctx context.Context, tenant string) (bool, error) {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return false, fmt.Errorf("find tenant: %w", err)
	}
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM rate_limit_rule WHERE tenant_id = $1)
		OR EXISTS (SELECT 1 FROM api_key WHERE tenant_id = $1)`, tenant).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("find tenant %s: %w", tenant, err)
	}
	return ok, nil
}

// Rules lists the rules matching tenant and route exactly ("" = any; "*" = the wildcard
// rules), sorted by tenant then route.
func (s *Store) Rules(ctx context.Context, tenant, route string) ([]regions.Rule, error) {
	if tenant != "" {
		if err := regions.ValidateIDOrWildcard("tenant", tenant); err != nil {
			return nil, fmt.Errorf("list rules: %w", err)
		}
	}
	if route != "" {
		if err := regions.ValidateIDOrWildcard("route", route); err != nil {
			return nil, fmt.Errorf("list rules: %w", err)
		}
	}
	rows, _ := s.pool.Query(ctx, `SELECT tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at
		FROM rate_limit_rule WHERE ($1 = '' OR tenant_id = $1) AND ($2 = '' OR route_id = $2)
		ORDER BY tenant_id, route_id`, tenant, route)
	rules, err := pgx.CollectRows(rows, pgx.RowToStructByPos[regions.Rule])
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	return rules, nil
}

// SetRule creates or replaces the rule for r.Tenant and r.Route. Shards 0 means 1;
// UpdatedAt is ignored (the database sets it).
func (s *Store) SetRule(ctx context.Context, r regions.Rule) error {
	if r.Shards == 0 {
		r.Shards = 1
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("set rule: %w", err)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, now())
			ON CONFLICT (tenant_id, route_id) DO UPDATE SET capacity = EXCLUDED.capacity,
				refill_per_second = EXCLUDED.refill_per_second, shadow = EXCLUDED.shadow,
				shards = EXCLUDED.shards, updated_at = now()`,
			r.Tenant, r.Route, r.Capacity, r.RefillPerSecond, r.Shadow, r.Shards)
		return dbErr(err)
	})
	if err != nil {
		return fmt.Errorf("set rule %s/%s: %w", r.Tenant, r.Route, err)
	}
	return nil
}

// DeleteRule deletes the rule for tenant and route; ErrNotFound if there is none. The
// default rule (*, *) cannot be deleted (ErrInvalid): set it instead. Any id the database
// may hold is accepted (RawID), so a row written with plain SQL that ValidateID refuses
// (a reserved name) can be deleted too.
func (s *Store) DeleteRule(ctx context.Context, tenant, route string) error {
	if err := RawID("tenant", tenant); err != nil {
		return fmt.Errorf("delete rule: %w", err)
	}
	if err := RawID("route", route); err != nil {
		return fmt.Errorf("delete rule: %w", err)
	}
	if tenant == regions.Wildcard && route == regions.Wildcard {
		return fmt.Errorf("delete rule */*: %w: the default rule cannot be deleted; set it instead", regions.ErrInvalid)
	}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM rate_limit_rule WHERE tenant_id = $1 AND route_id = $2`, tenant, route)
		if err != nil {
			return dbErr(err)
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete rule %s/%s: %w", tenant, route, err)
	}
	return nil
}

// InstanceHorizon is how long a gateway_instance row may go unseen before a heartbeat of
// its region deletes it. Rows of crashed and stopped gateways (a clean stop marks its own
// row stopped, and the default instance id is new at every start) would otherwise pile
// up forever. It is
// far longer than any instance TTL, so a live instance is never pruned; one cut off from
// the database for longer simply comes back with its next heartbeat.
const InstanceHorizon = time.Hour

// pruneEvery: one heartbeat in pruneEvery also deletes the region's rows unseen for
// InstanceHorizon, so the DELETE does not run on every heartbeat of every gateway.
const pruneEvery = 20

// DefaultHeartbeatInterval is how often a gateway records itself alive by default.
const DefaultHeartbeatInterval = 5 * time.Second

// MissedHeartbeats is how many heartbeat intervals an instance may miss before it no
// longer counts as live.
const MissedHeartbeats = 3

// InstanceTTL is how long after its last heartbeat an instance that beats every interval
// counts as live: MissedHeartbeats intervals.
func InstanceTTL(interval time.Duration) time.Duration { return MissedHeartbeats * interval }

// DefaultInstanceTTL is InstanceTTL of DefaultHeartbeatInterval, what the rebalancer and
// the status page assume of the gateways by default.
const DefaultInstanceTTL = MissedHeartbeats * DefaultHeartbeatInterval

// Heartbeat records that gateway instance id of region is alive (last_seen = the
// database's now()). About one call in 20 also deletes, in the same statement, the rows of
// region unseen for InstanceHorizon (PruneInstances). It does not notify gateways; they
// count instances on their timer reload.
func (s *Store) Heartbeat(ctx context.Context, id, region string) error {
	return s.HeartbeatAt(ctx, id, region, 0)
}

// HeartbeatAt is Heartbeat that also records the transaction horizon of the snapshot
// the instance enforces (regions.Snapshot.Xmin): its acknowledgment of every change
// committed before it, which a share increase of another region waits for
// (regions.Snapshot.Pending). Zero records none.
func (s *Store) HeartbeatAt(ctx context.Context, id, region string, xmin int64) error {
	if err := regions.ValidateID("instance", id); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	if err := regions.ValidateID("region", region); err != nil {
		return fmt.Errorf("heartbeat %s: %w", id, err)
	}
	var at *int64
	if xmin > 0 {
		at = &xmin
	}
	const upsert = `INSERT INTO gateway_instance (id, region, last_seen, snapshot_xmin) VALUES ($1, $2, now(), $3)
		ON CONFLICT (id) DO UPDATE SET region = EXCLUDED.region, last_seen = now(), stopped_at = NULL, snapshot_xmin = EXCLUDED.snapshot_xmin`
	var err error
	if mrand.IntN(pruneEvery) == 0 {
		_, err = s.pool.Exec(ctx, `WITH pruned AS (
			DELETE FROM gateway_instance
			WHERE region = $2 AND id <> $1 AND last_seen < now() - make_interval(secs => $4)
		) `+upsert, id, region, at, InstanceHorizon.Seconds())
	} else {
		_, err = s.pool.Exec(ctx, upsert, id, region, at)
	}
	if err != nil {
		return fmt.Errorf("heartbeat %s in %s: %w", id, region, dbErr(err))
	}
	return nil
}

// PruneInstances deletes the gateway_instance rows of region last seen more than
// olderThan ago (the database's clock) and returns how many it deleted. Heartbeat does
// this now and then with InstanceHorizon.
func (s *Store) PruneInstances(ctx context.Context, region string, olderThan time.Duration) (int64, error) {
	if err := regions.ValidateID("region", region); err != nil {
		return 0, fmt.Errorf("prune instances: %w", err)
	}
	if olderThan <= 0 {
		return 0, fmt.Errorf("prune instances of %s: %w: olderThan must be > 0, got %s", region, regions.ErrInvalid, olderThan)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM gateway_instance WHERE region = $1 AND last_seen < now() - make_interval(secs => $2)`,
		region, olderThan.Seconds())
	if err != nil {
		return 0, fmt.Errorf("prune instances of %s: %w", region, dbErr(err))
	}
	return tag.RowsAffected(), nil
}

// RemoveInstance records that gateway instance id stopped cleanly (on shutdown): its row
// is marked stopped, not deleted. The loader leaves stopped rows out (LiveInstances), so
// the region's other gateways stop counting it in their fallback share at once; but its
// region is not dark while the row's last heartbeat is within the instance TTL
// (RegionsSeen), so gateways that restart together do not cost their region its shares
// (issue 22: deleting the row made the region dark until the new processes beat).
// Stopping an unknown instance does nothing.
func (s *Store) RemoveInstance(ctx context.Context, id string) error {
	if err := regions.ValidateID("instance", id); err != nil {
		return fmt.Errorf("remove instance: %w", err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE gateway_instance SET stopped_at = now() WHERE id = $1 AND stopped_at IS NULL`, id); err != nil {
		return fmt.Errorf("remove instance %s: %w", id, err)
	}
	return nil
}

// Instances lists every running instance that ever heartbeated (not stopped cleanly), by
// region and id, with its last heartbeat (the database's clock).
func (s *Store) Instances(ctx context.Context) ([]regions.Instance, error) {
	rows, _ := s.pool.Query(ctx, `SELECT id, region, last_seen, coalesce(snapshot_xmin, 0) FROM gateway_instance WHERE stopped_at IS NULL ORDER BY region, id`)
	in, err := pgx.CollectRows(rows, pgx.RowToStructByPos[regions.Instance])
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	return in, nil
}

// RegionsLastSeen returns, per region, the newest heartbeat of any of its gateway
// instances (the database's clock), cleanly stopped ones included. A region whose newest
// heartbeat is older than the instance TTL, or that has none, is dark (RegionDark): this
// is the one definition of a dark region, for the rebalancer, the status page and
// ratectl. A gateway's fallback counts only running instances (Snapshot.LiveInstances).
func (s *Store) RegionsLastSeen(ctx context.Context) (map[string]time.Time, error) {
	rows, _ := s.pool.Query(ctx, `SELECT region, max(last_seen) FROM gateway_instance GROUP BY region`)
	out := map[string]time.Time{}
	var (
		region string
		at     time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&region, &at}, func() error {
		out[region] = at
		return nil
	}); err != nil {
		return nil, fmt.Errorf("regions last seen: %w", err)
	}
	return out, nil
}

// RegionDark says whether region is dark at now: no heartbeat of any of its gateways in
// lastSeen (RegionsLastSeen) within ttl.
func RegionDark(lastSeen map[string]time.Time, region string, now time.Time, ttl time.Duration) bool {
	at, ok := lastSeen[region]
	return !ok || now.Sub(at) > ttl
}

// RawID accepts any id a row may hold, valid or not: 1 to 64 bytes of printable UTF-8.
// Deletions take it, so an operator can remove any row the database holds; writes that
// create rows validate with regions.ValidateID.
func RawID(kind, id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("%w %s id %.20q: must be 1 to 64 bytes", regions.ErrInvalid, kind, id)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w %s id %q: not UTF-8", regions.ErrInvalid, kind, id)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w %s id %q: control characters", regions.ErrInvalid, kind, id)
		}
	}
	return nil
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
