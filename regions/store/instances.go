package store

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

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
