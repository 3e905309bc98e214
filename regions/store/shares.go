package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions"
)

// Shares lists every stored share row, expired overrides included, by scope, region and
// source. ExpiresAt is zero for rows that never expire.
func (s *Store) Shares(ctx context.Context) ([]regions.Share, error) {
	rows, _ := s.pool.Query(ctx, `SELECT scope, region, share, source, expires_at, updated_at, reason
		FROM region_share ORDER BY scope, region, source`)
	shares, err := pgx.CollectRows(rows, scanShare)
	if err != nil {
		return nil, fmt.Errorf("list shares: %w", err)
	}
	return shares, nil
}

// SetOverride replaces the operator override of scope with shares (region -> share), in
// one transaction: the shares must name every region exactly once and sum to 1
// (ValidateShares, checked against the regions as they are inside the transaction);
// override rows of the scope for other regions are deleted. ttl > 0 makes the override
// expire ttl after the database's now(); ttl 0 never expires. actor and reason are
// required and recorded in the history, one row per changed region.
func (s *Store) SetOverride(ctx context.Context, scope regions.Scope, shares map[string]float64, actor, reason string, ttl time.Duration) error {
	if err := validateOverride(scope, actor, reason); err != nil {
		return fmt.Errorf("set override: %w", err)
	}
	if ttl < 0 {
		return fmt.Errorf("set override %s: %w ttl %v: must be >= 0", scope, regions.ErrInvalid, ttl)
	}
	for r, v := range shares {
		if err := regions.ValidateID("region", r); err != nil {
			return fmt.Errorf("set override %s: %w", scope, err)
		}
		if math.IsNaN(v) || v < 0 || v > 1 {
			return fmt.Errorf("set override %s: %w share %v of region %s: must be between 0 and 1", scope, regions.ErrInvalid, v, r)
		}
	}
	var expires *int64 // microseconds from now()
	if ttl > 0 {
		us := ttl.Microseconds()
		expires = &us
	}
	err := s.write(ctx, audit{actor, reason}, func(tx pgx.Tx) error {
		// FOR SHARE: no region is added or removed until we commit.
		rows, _ := tx.Query(ctx, `SELECT name FROM region ORDER BY name FOR SHARE`)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if err := regions.ValidateShares(shares, names); err != nil {
			return err
		}
		for _, r := range names {
			_, err := tx.Exec(ctx, `INSERT INTO region_share (scope, region, share, source, expires_at, updated_at, reason)
				VALUES ($1, $2, $3, 'override', now() + $4::double precision * interval '1 microsecond', now(), $5)
				ON CONFLICT (scope, region, source) DO UPDATE SET share = EXCLUDED.share,
					expires_at = EXCLUDED.expires_at, updated_at = now(), reason = EXCLUDED.reason`,
				scope.String(), r, shares[r], expires, reason)
			if err != nil {
				return dbErr(err)
			}
		}
		_, err = tx.Exec(ctx, `DELETE FROM region_share WHERE scope = $1 AND source = 'override' AND NOT (region = ANY($2))`,
			scope.String(), names)
		return err
	})
	if err != nil {
		return fmt.Errorf("set override %s: %w", scope, err)
	}
	return nil
}

// ClearOverride deletes the operator override of scope (expired or not), leaving a
// history row per region. Clearing a scope without an override does nothing.
func (s *Store) ClearOverride(ctx context.Context, scope regions.Scope, actor, reason string) error {
	if err := validateOverride(scope, actor, reason); err != nil {
		return fmt.Errorf("clear override: %w", err)
	}
	err := s.write(ctx, audit{actor, reason}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM region_share WHERE scope = $1 AND source = 'override'`, scope.String())
		return err
	})
	if err != nil {
		return fmt.Errorf("clear override %s: %w", scope, err)
	}
	return nil
}

func validateOverride(scope regions.Scope, actor, reason string) error {
	if err := scope.Validate(); err != nil {
		return err
	}
	if actor == "" {
		return fmt.Errorf("%w: an actor is required", regions.ErrInvalid)
	}
	if reason == "" {
		return fmt.Errorf("%w: a reason is required", regions.ErrInvalid)
	}
	return nil
}

// ShareChange is one rebalancer share to write.
type ShareChange struct {
	Scope  regions.Scope
	Region string
	// Old is the share the rebalancer computed from; the history records the value the
	// write actually replaced.
	Old float64
	New float64
	// Reason says why (optional), e.g. "waterfill" or "fast path: eu-west throttling".
	Reason string
	// Inputs, when not nil, replaces the call's inputs in this change's history row
	// (marshalled with encoding/json).
	Inputs any
	// Delete removes the rebalancer row of (Scope, Region) instead of upserting New (New is
	// ignored); the history row records the removal with Reason and Inputs. A missing row
	// is a no-op.
	Delete bool
}

// WriteRebalancerShares upserts the rebalancer's shares, and deletes the rows of the
// changes marked Delete, in one transaction, in the order given. Each change that alters
// a stored row leaves a history row with actor, its reason and the inputs (marshalled
// with encoding/json; nil stores none), so `ratectl shares history` can explain it; a
// deletion's has no new share. Regions must exist. Shares of a scope are not required to
// sum to 1 here: the rebalancer writes decreases before increases. Override rows are
// never touched.
func (s *Store) WriteRebalancerShares(ctx context.Context, changes []ShareChange, inputs any, actor string) error {
	if actor == "" {
		return fmt.Errorf("write rebalancer shares: %w: an actor is required", regions.ErrInvalid)
	}
	callInputs, err := marshalInputs(inputs)
	if err != nil {
		return fmt.Errorf("write rebalancer shares: %w", err)
	}
	type row struct {
		scope, region, reason, inputs string
		share                         float64
		delete                        bool
	}
	rows := make([]row, 0, len(changes))
	for _, c := range changes {
		if err := c.Scope.Validate(); err != nil {
			return fmt.Errorf("write rebalancer shares: %w", err)
		}
		if err := regions.ValidateID("region", c.Region); err != nil {
			return fmt.Errorf("write rebalancer shares %s: %w", c.Scope, err)
		}
		if !c.Delete && (math.IsNaN(c.New) || c.New < 0 || c.New > 1) {
			return fmt.Errorf("write rebalancer shares %s: %w share %v of region %s: must be between 0 and 1", c.Scope, regions.ErrInvalid, c.New, c.Region)
		}
		in := callInputs
		if c.Inputs != nil {
			if in, err = marshalInputs(c.Inputs); err != nil {
				return fmt.Errorf("write rebalancer shares %s %s: %w", c.Scope, c.Region, err)
			}
		}
		rows = append(rows, row{scope: c.Scope.String(), region: c.Region, reason: c.Reason, inputs: in, share: c.New, delete: c.Delete})
	}
	err = s.write(ctx, audit{actor: actor}, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, r := range rows {
			b.Queue(`SELECT set_config($1, $2, true), set_config($3, $4, true)`,
				migrations.SettingReason, r.reason, migrations.SettingInputs, r.inputs)
			if r.delete {
				b.Queue(`DELETE FROM region_share WHERE scope = $1 AND region = $2 AND source = 'rebalancer'`,
					r.scope, r.region)
				continue
			}
			b.Queue(`INSERT INTO region_share (scope, region, share, source, updated_at, reason)
				VALUES ($1, $2, $3, 'rebalancer', now(), $4)
				ON CONFLICT (scope, region, source) DO UPDATE SET share = EXCLUDED.share,
					updated_at = now(), reason = EXCLUDED.reason`,
				r.scope, r.region, r.share, r.reason)
		}
		return dbErr(tx.SendBatch(ctx, b).Close())
	})
	if err != nil {
		return fmt.Errorf("write %d rebalancer shares: %w", len(changes), err)
	}
	return nil
}

func marshalInputs(v any) (string, error) {
	if v == nil {
		return "", nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("%w inputs: %w", regions.ErrInvalid, err)
	}
	if string(b) == "null" {
		return "", nil
	}
	return string(b), nil
}

// HistoryFilter selects history entries. Zero fields select everything.
type HistoryFilter struct {
	// Scope selects one exact scope.
	Scope *regions.Scope
	// Tenant selects the tenant's scopes: "TENANT" and every "TENANT/ROUTE".
	Tenant string
	// Since selects entries at or after it.
	Since time.Time
	// Limit is the most entries returned (the newest); <= 0 means 1000.
	Limit int
}

// HistoryEntry is one change of one share row.
type HistoryEntry struct {
	ID     int64
	At     time.Time
	Scope  regions.Scope
	Region string
	Source regions.Source
	// Old is nil when the row was created, New nil when it was deleted.
	Old, New *float64
	// ExpiresAt is the override's expiry after the change (before it, for a deletion).
	ExpiresAt time.Time
	Actor     string
	Reason    string
	// Inputs is the JSON the rebalancer recorded (demand, status per region), or nil.
	Inputs json.RawMessage
}

// History lists share changes, newest first.
func (s *Store) History(ctx context.Context, f HistoryFilter) ([]HistoryEntry, error) {
	var scope *string
	if f.Scope != nil {
		if err := f.Scope.Validate(); err != nil {
			return nil, fmt.Errorf("share history: %w", err)
		}
		str := f.Scope.String()
		scope = &str
	}
	if f.Tenant != "" {
		if err := regions.ValidateID("tenant", f.Tenant); err != nil {
			return nil, fmt.Errorf("share history: %w", err)
		}
	}
	var since *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	rows, _ := s.pool.Query(ctx, `SELECT id, at, scope, region, source, old_share, new_share, expires_at, actor, reason, inputs
		FROM region_share_history
		WHERE ($1::text IS NULL OR scope = $1)
		  AND ($2 = '' OR scope = $2 OR starts_with(scope, $2 || '/'))
		  AND ($3::timestamptz IS NULL OR at >= $3)
		ORDER BY at DESC, id DESC LIMIT $4`, scope, f.Tenant, since, limit)
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (HistoryEntry, error) {
		var (
			e             HistoryEntry
			scope, source string
			expires       *time.Time
			inputs        []byte
		)
		if err := row.Scan(&e.ID, &e.At, &scope, &e.Region, &source, &e.Old, &e.New, &expires, &e.Actor, &e.Reason, &inputs); err != nil {
			return HistoryEntry{}, err
		}
		sc, err := regions.ParseScope(scope)
		if err != nil {
			return HistoryEntry{}, err
		}
		e.Scope, e.Source = sc, regions.Source(source)
		if expires != nil {
			e.ExpiresAt = *expires
		}
		if inputs != nil {
			e.Inputs = json.RawMessage(inputs)
		}
		return e, nil
	})
	if err != nil {
		return nil, fmt.Errorf("share history: %w", err)
	}
	return entries, nil
}
