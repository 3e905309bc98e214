package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
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
	err := s.write(ctx, audit{actor, reason}, func(tx pgx.Tx) error {
		// No region is added or removed until we commit.
		if err := lockRegions(ctx, tx); err != nil {
			return err
		}
		names, err := regionNames(ctx, tx)
		if err != nil {
			return err
		}
		s.at(hookOverrideRead)
		if err := regions.ValidateShares(shares, names); err != nil {
			return err
		}
		return dbErr(setOverrideRows(ctx, tx, scope.String(), shares, overrideExpiry{ttl: ttl}, reason))
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
		if err := lockRegions(ctx, tx); err != nil {
			return err
		}
		return clearOverrideRows(ctx, tx, scope.String())
	})
	if err != nil {
		return fmt.Errorf("clear override %s: %w", scope, err)
	}
	return nil
}

// overrideExpiry is when an override ends: at at, or ttl after the database's now() (both
// zero: never).
type overrideExpiry struct {
	at  time.Time
	ttl time.Duration
}

// setOverrideRows makes the override rows of scope exactly shares (region -> share, each
// region one row), all with expiry and reason, deleting the scope's override rows of
// other regions. SetOverride and Apply share it.
func setOverrideRows(ctx context.Context, tx pgx.Tx, scope string, shares map[string]float64, expiry overrideExpiry, reason string) error {
	var (
		at  *time.Time
		ttl *int64 // microseconds from now()
	)
	if !expiry.at.IsZero() {
		at = &expiry.at
	}
	if expiry.ttl > 0 {
		us := expiry.ttl.Microseconds()
		ttl = &us
	}
	names := slices.Sorted(maps.Keys(shares))
	values := make([]float64, len(names))
	for i, r := range names {
		values[i] = shares[r]
	}
	if _, err := tx.Exec(ctx, `INSERT INTO region_share (scope, region, share, source, expires_at, updated_at, reason)
		SELECT $1, u.region, u.share, 'override', coalesce($4::timestamptz, now() + $5::double precision * interval '1 microsecond'), now(), $6
		FROM unnest($2::text[], $3::float8[]) WITH ORDINALITY AS u(region, share, n) ORDER BY u.n
		ON CONFLICT (scope, region, source) DO UPDATE SET share = EXCLUDED.share,
			expires_at = EXCLUDED.expires_at, updated_at = now(), reason = EXCLUDED.reason`,
		scope, names, values, at, ttl, reason); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM region_share WHERE scope = $1 AND source = 'override' AND NOT (region = ANY($2))`, scope, names)
	return err
}

// clearOverrideRows deletes the override rows of scope: ClearOverride and Apply
// (--prune overrides) share it.
func clearOverrideRows(ctx context.Context, tx pgx.Tx, scope string) error {
	_, err := tx.Exec(ctx, `DELETE FROM region_share WHERE scope = $1 AND source = 'override'`, scope)
	return err
}

// DeleteScopeShares deletes every share row (override and rebalancer) of the scope
// written exactly as scope, which need not be a valid scope: an operator's way to remove a
// row written with plain SQL that the loader skips (a reserved name, say). Each deletion
// leaves a history row naming actor and reason. It returns the number of rows deleted.
func (s *Store) DeleteScopeShares(ctx context.Context, scope, actor, reason string) (int64, error) {
	if scope != regions.Wildcard {
		t, r, _ := strings.Cut(scope, "/")
		if err := RawID("tenant", t); err != nil {
			return 0, fmt.Errorf("delete shares of scope: %w", err)
		}
		if r != "" {
			if err := RawID("route", r); err != nil {
				return 0, fmt.Errorf("delete shares of scope: %w", err)
			}
		}
	}
	if actor == "" || reason == "" {
		return 0, fmt.Errorf("delete shares of scope %q: %w: an actor and a reason are required", scope, regions.ErrInvalid)
	}
	var n int64
	err := s.write(ctx, audit{actor, reason}, func(tx pgx.Tx) error {
		if err := lockRegions(ctx, tx); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM region_share WHERE scope = $1`, scope)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete shares of scope %q: %w", scope, err)
	}
	return n, nil
}

// lockRegions makes the transaction's view of the region set final: it takes the region
// table in SHARE mode, which every share writer takes (so they run concurrently), and
// which conflicts with the SHARE ROW EXCLUSIVE mode AddRegion and RemoveRegion take and
// with any INSERT, UPDATE or DELETE of a region (ROW EXCLUSIVE), plain SQL included. So
// a region is added or removed entirely before or entirely after each share write, and
// the rows a share write reads and writes name every region of the set it commits with.
func lockRegions(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `LOCK TABLE region IN SHARE MODE`); err != nil {
		return fmt.Errorf("lock regions: %w", err)
	}
	return nil
}

// lockRegionsExclusive is AddRegion's and RemoveRegion's lock (see lockRegions).
func lockRegionsExclusive(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `LOCK TABLE region IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return fmt.Errorf("lock regions: %w", err)
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

// ErrFenced: a fenced rebalancer write was refused because its lease epoch is no longer
// current: another rebalancer took the leadership over since the writer took it.
var ErrFenced = errors.New("rebalancer lease lost: not the leader")

// ErrConflict: a compare-and-set rebalancer write was refused because a row it was
// computed from, or the region set, changed since it was read.
var ErrConflict = errors.New("share rows changed since they were read")

// ExpectedShare is a share row a rebalancer write was computed from: Share is the value
// the row must still hold, nil that there must be no such row.
type ExpectedShare struct {
	Scope  regions.Scope
	Region string
	Source regions.Source
	Share  *float64
}

// RebalancerWrite is one write of the rebalancer (WriteRebalancer).
type RebalancerWrite struct {
	Changes []ShareChange
	// Inputs is recorded in each change's history row unless the change has its own.
	Inputs any
	Actor  string
	// Epoch fences the write: it lands only while the rebalancer lease (table
	// rebalancer_lease) has this epoch, else ErrFenced. 0: not fenced (tests, ratectl).
	Epoch int64
	// Regions, when not nil, is the region set the changes were computed for: the write
	// is refused with ErrConflict unless the regions are exactly these.
	Regions []string
	// Expect lists the rows the changes were computed from (compare-and-set): each must
	// still hold its value, else ErrConflict.
	Expect []ExpectedShare
}

// WriteRebalancerShares is WriteRebalancer without fencing or compare-and-set.
func (s *Store) WriteRebalancerShares(ctx context.Context, changes []ShareChange, inputs any, actor string) error {
	return s.WriteRebalancer(ctx, RebalancerWrite{Changes: changes, Inputs: inputs, Actor: actor})
}

// idleInTxTimeout bounds how long a fenced write may sit idle inside its transaction
// (its process stopped, say) while it holds the lease row FOR SHARE: then PostgreSQL ends
// its session, so a takeover waits at most this long.
const idleInTxTimeout = 5 * time.Second

// WriteRebalancer upserts the rebalancer's shares, and deletes the rows of the changes
// marked Delete, in one transaction, in the order given; it first proves the writer
// still leads (Epoch) and that the rows it computed from are unchanged (Regions, Expect),
// under the region lock every share writer takes (lockRegions). Each change that alters a
// stored row leaves a history row with the actor, its reason and the inputs (marshalled
// with encoding/json; nil stores none), so `ratectl shares history` can explain it; the
// history's old value is the value actually replaced. Regions must exist. Shares of a
// scope are not required to sum to 1 here: the rebalancer writes decreases before
// increases. Override rows are never touched.
func (s *Store) WriteRebalancer(ctx context.Context, w RebalancerWrite) error {
	changes := w.Changes
	if w.Actor == "" {
		return fmt.Errorf("write rebalancer shares: %w: an actor is required", regions.ErrInvalid)
	}
	callInputs, err := marshalInputs(w.Inputs)
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
	err = s.write(ctx, audit{actor: w.Actor}, func(tx pgx.Tx) error {
		if w.Epoch != 0 {
			// A stopped writer holding the lease row must not hold a takeover back for
			// long: PostgreSQL ends its session after this.
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL idle_in_transaction_session_timeout = %d`, idleInTxTimeout.Milliseconds())); err != nil {
				return err
			}
			// FOR SHARE: a takeover (which increments epoch) waits until this commits.
			var epoch int64
			err := tx.QueryRow(ctx, `SELECT epoch FROM rebalancer_lease WHERE id = 1 FOR SHARE`).Scan(&epoch)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: the rebalancer_lease row is missing (deleted, or the schema reset)", ErrFenced)
			}
			if err != nil {
				return fmt.Errorf("check lease: %w", err)
			}
			if epoch != w.Epoch {
				return fmt.Errorf("%w: lease epoch is %d, the writer's %d", ErrFenced, epoch, w.Epoch)
			}
		}
		if err := lockRegions(ctx, tx); err != nil {
			return err
		}
		if w.Regions != nil {
			names, err := regionNames(ctx, tx)
			if err != nil {
				return err
			}
			want := slices.Sorted(slices.Values(w.Regions))
			if !slices.Equal(names, want) {
				return fmt.Errorf("%w: regions are %v, the write was computed for %v", ErrConflict, names, want)
			}
		}
		for _, e := range w.Expect {
			src := e.Source
			if src == "" {
				src = regions.SourceRebalancer
			}
			var cur *float64
			err := tx.QueryRow(ctx, `SELECT share FROM region_share WHERE scope = $1 AND region = $2 AND source = $3 FOR UPDATE`,
				e.Scope.String(), e.Region, string(src)).Scan(&cur)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("compare share %s %s: %w", e.Scope, e.Region, err)
			}
			if (cur == nil) != (e.Share == nil) || cur != nil && *cur != *e.Share {
				return fmt.Errorf("%w: %s share of %s in %s is %s, the write was computed from %s", ErrConflict,
					src, e.Scope, e.Region, fmtShare(cur), fmtShare(e.Share))
			}
		}
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

func fmtShare(v *float64) string {
	if v == nil {
		return "no row"
	}
	return strconv.FormatFloat(*v, 'g', -1, 64)
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

// MarshalJSON writes the entry as `ratectl shares history -o json` prints it (a public
// contract): the scope in its stored form, times in UTC, old and new null for a created
// or deleted row, expires_at null for no expiry, inputs as recorded (null for none).
func (e HistoryEntry) MarshalJSON() ([]byte, error) {
	var expires *time.Time
	if !e.ExpiresAt.IsZero() {
		t := e.ExpiresAt.UTC()
		expires = &t
	}
	return json.Marshal(struct {
		ID        int64           `json:"id"`
		At        time.Time       `json:"at"`
		Scope     string          `json:"scope"`
		Region    string          `json:"region"`
		Source    regions.Source  `json:"source"`
		Old       *float64        `json:"old"`
		New       *float64        `json:"new"`
		ExpiresAt *time.Time      `json:"expires_at"`
		Actor     string          `json:"actor"`
		Reason    string          `json:"reason"`
		Inputs    json.RawMessage `json:"inputs"`
	}{e.ID, e.At.UTC(), e.Scope.String(), e.Region, e.Source, e.Old, e.New, expires, e.Actor, e.Reason, e.Inputs})
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

// ReasonOverrideExpired starts the reason of the history and audit rows ExpireOverrides
// writes.
const ReasonOverrideExpired = "expired: operator override ended"

// ExpireOverrides deletes the override rows whose expiry has passed (the database's
// clock), in one transaction recorded as actor: each leaves a share-history row (old
// share, no new one, reason ReasonOverrideExpired) and an audit_log row (object
// region_share, action delete, the row as it was). Gateways stopped applying them at
// their expiry already (they are not loaded after it); this makes the end visible in
// `ratectl shares history` and `ratectl audit`, where it left no trace before. It
// returns the rows deleted.
func (s *Store) ExpireOverrides(ctx context.Context, actor string) ([]regions.Share, error) {
	if err := regions.ValidateID("actor", actor); err != nil {
		return nil, fmt.Errorf("expire overrides: %w", err)
	}
	var gone []regions.Share
	err := s.write(ctx, audit{actor: actor, reason: ReasonOverrideExpired}, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, `
			WITH gone AS (
				DELETE FROM region_share WHERE source = 'override' AND expires_at IS NOT NULL AND expires_at <= now()
				RETURNING *
			), logged AS (
				INSERT INTO audit_log (actor, reason, object, action, old)
				SELECT $1, $2 || ' at ' || to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
				       'region_share', 'delete', to_jsonb(gone) - 'inputs'
				FROM gone
			)
			SELECT scope, region, share, source, expires_at, updated_at, reason FROM gone ORDER BY scope, region`,
			actor, ReasonOverrideExpired)
		var err error
		gone, err = pgx.CollectRows(rows, scanShare)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("expire overrides: %w", err)
	}
	return gone, nil
}
