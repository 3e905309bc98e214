package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/quotaplane/quotaplane/regions"
)

// LoadSnapshot reads everything a gateway needs in one read-only, repeatable-read
// transaction (one consistent view) and builds a Snapshot: regions, rules, valid keys,
// active shares, and the instances seen within instanceTTL (all when instanceTTL <= 0).
// LoadedAt and instance liveness use the database's clock, so gateway clocks do not matter.
// A row the loader cannot accept is left out and listed in the snapshot's Skipped (see
// LoadOptions).
func (s *Store) LoadSnapshot(ctx context.Context, instanceTTL time.Duration) (*regions.Snapshot, error) {
	return s.Load(ctx, LoadOptions{InstanceTTL: instanceTTL})
}

// LoadOptions selects what Load reads.
type LoadOptions struct {
	// InstanceTTL: instances seen within it are live (all when <= 0).
	InstanceTTL time.Duration
	// WithoutKeys leaves the API keys out (the snapshot authenticates nobody): the
	// rebalancer and ratectl never use them, and at a million keys they cost about a
	// second and 170 MB per load.
	WithoutKeys bool
}

// Load is LoadSnapshot with options. Rows the database holds but the model refuses (an
// id ValidateID rejects, a share out of range, a share of a region left out) are skipped,
// not fatal: one such row must not freeze every gateway on its last snapshot. They are
// listed in Snapshot.Skipped for the caller to count and log (the Reloader does).
func (s *Store) Load(ctx context.Context, o LoadOptions) (*regions.Snapshot, error) {
	var (
		d    regions.SnapshotData
		keys map[regions.KeyHash]string
	)
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		d = regions.SnapshotData{}
		keys, err = loadData(ctx, tx, o, &d)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load snapshot: %w", err)
	}
	d.KeyTenants = keys
	snap, err := regions.NewSnapshot(d)
	if err != nil {
		return nil, fmt.Errorf("load snapshot: %w", err)
	}
	return snap, nil
}

// Table names in SkippedRow.Table.
const (
	TableRegion = "region"
	TableRule   = "rate_limit_rule"
	TableKey    = "api_key"
	TableShare  = "region_share"
	// The plans' tables (migration 00011).
	TablePlanRule   = "plan_rule"
	TableTenantPlan = "tenant_plan"
)

// SkippedTables are the tables a load may skip rows of (metric labels).
var SkippedTables = []string{TableRegion, TableRule, TableKey, TableShare, TablePlanRule, TableTenantPlan}

// loadPlans reads the plans' rules and the tenants' plans into d, leaving out (skip) the
// rows the model refuses.
func loadPlans(ctx context.Context, tx pgx.Tx, d *regions.SnapshotData, skip func(table, id string, err error)) error {
	rules, err := readPlanRules(ctx, tx, "")
	if err != nil {
		return err
	}
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			skip(TablePlanRule, r.Plan+"/"+r.Route, err)
			continue
		}
		d.PlanRules = append(d.PlanRules, r)
	}
	tps, err := readTenantPlans(ctx, tx)
	if err != nil {
		return err
	}
	for _, tp := range tps {
		err := regions.ValidateID("tenant", tp.Tenant)
		if err == nil {
			err = regions.ValidateID("plan", tp.Plan)
		}
		if err != nil {
			skip(TableTenantPlan, tp.Tenant, err)
			continue
		}
		d.TenantPlans = append(d.TenantPlans, tp)
	}
	return nil
}

// loadData reads everything but the keys into d, and returns the valid keys as a map.
func loadData(ctx context.Context, tx pgx.Tx, o LoadOptions, d *regions.SnapshotData) (map[regions.KeyHash]string, error) {
	instanceTTL := o.InstanceTTL
	// The first statement takes the transaction's snapshot (repeatable read): its xmin
	// is the horizon below which every transaction's writes are in this load.
	if err := tx.QueryRow(ctx, `SELECT now(), pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&d.LoadedAt, &d.Xmin); err != nil {
		return nil, fmt.Errorf("read clock: %w", err)
	}
	d.InstanceTTL = instanceTTL
	skip := func(table, id string, err error) {
		d.Skipped = append(d.Skipped, regions.SkippedRow{Table: table, ID: id, Err: err})
	}
	names, err := regionNames(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("read regions: %w", err)
	}
	known := make(map[string]bool, len(names))
	for _, n := range names {
		if err := regions.ValidateID("region", n); err != nil {
			skip(TableRegion, n, err)
			continue
		}
		d.Regions = append(d.Regions, n)
		known[n] = true
	}

	all, err := loadRules(ctx, tx)
	if err != nil {
		return nil, err
	}
	d.Rules = all[:0]
	for _, r := range all {
		if err := r.Validate(); err != nil {
			skip(TableRule, r.Tenant+"/"+r.Route, err)
			continue
		}
		d.Rules = append(d.Rules, r)
	}
	if err := loadPlans(ctx, tx, d, skip); err != nil {
		return nil, err
	}
	var keys map[regions.KeyHash]string
	if !o.WithoutKeys {
		var bad []string
		if keys, bad, err = loadKeys(ctx, tx); err != nil {
			return nil, err
		}
		if len(bad) > 0 {
			rows, _ := tx.Query(ctx, `SELECT id, tenant_id FROM api_key WHERE revoked_at IS NULL AND tenant_id = ANY($1) ORDER BY id`, bad)
			var (
				id     int64
				tenant string
			)
			if _, err := pgx.ForEachRow(rows, []any{&id, &tenant}, func() error {
				skip(TableKey, strconv.FormatInt(id, 10), regions.ValidateID("tenant", tenant))
				return nil
			}); err != nil {
				return nil, fmt.Errorf("read invalid keys: %w", err)
			}
		}
	}

	rows, _ := tx.Query(ctx, `SELECT scope, region, share, source, expires_at, updated_at, reason FROM region_share
		WHERE expires_at IS NULL OR expires_at > now()`)
	var (
		sh            regions.Share
		scope, source string
		expires       *time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&scope, &sh.Region, &sh.Share, &source, &expires, &sh.UpdatedAt, &sh.Reason}, func() error {
		id := scope + " " + sh.Region + " " + source
		sc, err := regions.ParseScope(scope)
		switch {
		case err != nil:
		case !known[sh.Region]:
			err = fmt.Errorf("%w: share for region %q, which is not loaded", regions.ErrInvalid, sh.Region)
		case sh.Share != sh.Share || sh.Share < 0 || sh.Share > 1:
			err = fmt.Errorf("%w: share %v", regions.ErrInvalid, sh.Share)
		case source != string(regions.SourceOverride) && source != string(regions.SourceRebalancer):
			err = fmt.Errorf("%w: share source %q", regions.ErrInvalid, source)
		}
		if err != nil {
			skip(TableShare, id, err)
			return nil
		}
		out := sh
		out.Scope, out.Source = sc, regions.Source(source)
		out.ExpiresAt = time.Time{}
		if expires != nil {
			out.ExpiresAt = *expires
		}
		d.Shares = append(d.Shares, out)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read shares: %w", err)
	}

	// Raise markers (migrations/00008): one row per region, tenant and route (a band's:
	// route#band), and those of overrides expired but not deleted yet. A marker holds a
	// bucket for one fill time of it, so those older than the longest fill time of any
	// rule or band loaded (at least a day, at most MaxRaiseWindow) hold none any more; a
	// monthly band's raise holds its buckets for a month.
	if d.Raises, err = readRaises(ctx, tx, raiseWindow(d.Rules, d.PlanRules)); err != nil {
		return nil, err
	}

	// Instances seen within the TTL count in the fallback's N; those seen within the ack
	// horizon may still enforce an old snapshot (regions.Snapshot.Pending).
	const instances = `SELECT id, region, last_seen, coalesce(snapshot_xmin, 0) FROM gateway_instance WHERE stopped_at IS NULL`
	if instanceTTL > 0 {
		horizon := max(instanceTTL, regions.AckHorizon)
		rows, _ = tx.Query(ctx, instances+` AND last_seen >= now() - $1::double precision * interval '1 microsecond'`, horizon.Microseconds())
	} else {
		rows, _ = tx.Query(ctx, instances)
	}
	if d.Instances, err = pgx.CollectRows(rows, pgx.RowToStructByPos[regions.Instance]); err != nil {
		return nil, fmt.Errorf("read instances: %w", err)
	}
	return keys, nil
}

// The rule and key tables may hold 100k and millions of rows, so they are decoded from
// pgx's raw values (binary wire format) rather than through Scan, about ten times faster;
// a column that arrives in another format falls back to Scan.

// pgEpoch is the zero of PostgreSQL's binary timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func loadRules(ctx context.Context, tx pgx.Tx) ([]regions.Rule, error) {
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM rate_limit_rule`).Scan(&n); err != nil {
		return nil, fmt.Errorf("count rules: %w", err)
	}
	out := make([]regions.Rule, 0, n)
	rows, err := tx.Query(ctx, `SELECT tenant_id, route_id, capacity, refill_per_second, shadow, shards, updated_at, bands FROM rate_limit_rule`)
	if err != nil {
		return nil, fmt.Errorf("read rules: %w", err)
	}
	defer rows.Close()
	raw := rawOK(rows.FieldDescriptions())
	var (
		scanned      regions.Rule // outside the loop: Scan's pointers would move a per-row variable to the heap
		scannedBands []byte
	)
	for rows.Next() {
		var r regions.Rule
		v := rows.RawValues()
		// jsonb's binary form is a version byte (1) and the text.
		if raw && len(v[2]) == 8 && len(v[3]) == 8 && len(v[4]) == 1 && len(v[5]) == 4 && len(v[6]) == 8 && len(v[7]) > 1 && v[7][0] == 1 {
			r = regions.Rule{
				Tenant:          string(v[0]),
				Route:           string(v[1]),
				Capacity:        int64(binary.BigEndian.Uint64(v[2])),
				RefillPerSecond: math.Float64frombits(binary.BigEndian.Uint64(v[3])),
				Shadow:          v[4][0] != 0,
				Shards:          int(int32(binary.BigEndian.Uint32(v[5]))),
				UpdatedAt:       pgEpoch.Add(time.Duration(int64(binary.BigEndian.Uint64(v[6]))) * time.Microsecond).Local(),
			}
			if r.Bands, err = decodeBands(v[7][1:]); err != nil {
				return nil, fmt.Errorf("read rule %s/%s: %w", r.Tenant, r.Route, err)
			}
		} else {
			if err := rows.Scan(&scanned.Tenant, &scanned.Route, &scanned.Capacity, &scanned.RefillPerSecond, &scanned.Shadow, &scanned.Shards, &scanned.UpdatedAt, &scannedBands); err != nil {
				return nil, fmt.Errorf("read rules: %w", err)
			}
			r = scanned
			if r.Bands, err = decodeBands(scannedBands); err != nil {
				return nil, fmt.Errorf("read rule %s/%s: %w", r.Tenant, r.Route, err)
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read rules: %w", err)
	}
	return out, nil
}

// rawOK reports whether the raw values can be decoded by hand: every column that is not
// text arrived in binary format (text columns are the same bytes in both formats, and pgx
// asks for them as text).
func rawOK(fd []pgconn.FieldDescription) bool {
	for _, f := range fd {
		if f.Format != pgx.BinaryFormatCode && f.DataTypeOID != pgtype.TextOID {
			return false
		}
	}
	return true
}

// loadKeys reads the valid keys into a map hash -> tenant (see loadRules on decoding).
// Each distinct tenant id is validated, and held, once; keys of an invalid tenant are
// left out, and the invalid tenants returned.
func loadKeys(ctx context.Context, tx pgx.Tx) (map[regions.KeyHash]string, []string, error) {
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM api_key WHERE revoked_at IS NULL`).Scan(&n); err != nil {
		return nil, nil, fmt.Errorf("count keys: %w", err)
	}
	keys := make(map[regions.KeyHash]string, n)
	tenants := make(map[string]string)
	invalid := make(map[string]bool)
	var bad []string
	tenant := func(b []byte) (string, error) {
		if t, ok := tenants[string(b)]; ok { // the lookup does not allocate
			return t, nil
		}
		if invalid[string(b)] {
			return "", regions.ErrInvalid
		}
		t := string(b)
		if err := regions.ValidateID("tenant", t); err != nil {
			invalid[t] = true
			bad = append(bad, t)
			return "", err
		}
		tenants[t] = t
		return t, nil
	}
	rows, err := tx.Query(ctx, `SELECT key_hash, tenant_id FROM api_key WHERE revoked_at IS NULL`)
	if err != nil {
		return nil, nil, fmt.Errorf("read keys: %w", err)
	}
	defer rows.Close()
	raw := rawOK(rows.FieldDescriptions())
	var ( // outside the loop: Scan's pointers would move per-row variables to the heap
		scannedHash   []byte
		scannedTenant string
	)
	for rows.Next() {
		v := rows.RawValues()
		var (
			h    regions.KeyHash
			hash = v[0]
			name = v[1]
		)
		if !raw {
			if err := rows.Scan(&scannedHash, &scannedTenant); err != nil {
				return nil, nil, fmt.Errorf("read keys: %w", err)
			}
			hash, name = scannedHash, []byte(scannedTenant)
		}
		if len(hash) != len(h) {
			return nil, nil, fmt.Errorf("read keys: %w: hash of %d bytes", regions.ErrInvalid, len(hash))
		}
		copy(h[:], hash)
		t, err := tenant(name)
		if err != nil {
			continue // listed in bad
		}
		keys[h] = t
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read keys: %w", err)
	}
	return keys, bad, nil
}

func scanShare(row pgx.CollectableRow) (regions.Share, error) {
	var (
		sh      regions.Share
		scope   string
		source  string
		expires *time.Time
	)
	if err := row.Scan(&scope, &sh.Region, &sh.Share, &source, &expires, &sh.UpdatedAt, &sh.Reason); err != nil {
		return regions.Share{}, err
	}
	sc, err := regions.ParseScope(scope)
	if err != nil {
		return regions.Share{}, err
	}
	sh.Scope, sh.Source = sc, regions.Source(source)
	if expires != nil {
		sh.ExpiresAt = *expires
	}
	return sh, nil
}

// readRaises reads the raise markers of the last window, and those of overrides expired
// but not deleted yet: the one query of LoadSnapshot and Raises.
func readRaises(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, window time.Duration) ([]regions.Raise, error) {
	rows, _ := q.Query(ctx, `SELECT region, tenant, route, raised_at, ratio, xid::text::bigint, gate_ratio FROM limit_raise WHERE raised_at > now() - make_interval(secs => $1)
		UNION ALL SELECT *, 0::bigint, ratio FROM limit_raise_expired()`, window.Seconds())
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[regions.Raise])
	if err != nil {
		return nil, fmt.Errorf("read raise markers: %w", err)
	}
	return out, nil
}

// Raises are the raise markers that may still hold a bucket of rules (and their bands),
// as a snapshot of them reads them (ratectl bucket inspect shows the hold).
func (s *Store) Raises(ctx context.Context, rules ...[]regions.Rule) ([]regions.Raise, error) {
	return readRaises(ctx, s.pool, raiseWindow(rules...))
}

// MaxRaiseWindow bounds how far back the snapshot reads raise markers: a rule or band
// taking longer to fill (more than a year) is held by a raise for a year only.
const MaxRaiseWindow = 366 * 24 * time.Hour

// raiseWindow is how far back a raise marker may still hold a bucket: the longest fill
// time (capacity / refill) of the rules and plan rules and their token-bucket bands
// (a quota band has no bucket to hold, and would fill in forever), at least a day (the
// window before bands) and at most MaxRaiseWindow.
func raiseWindow(sets ...[]regions.Rule) time.Duration {
	longest := 24 * time.Hour
	for _, rules := range sets {
		for _, r := range rules {
			longest = max(longest, regions.Limit{Capacity: r.Capacity, RefillPerSecond: r.RefillPerSecond}.FillTime())
			for _, b := range r.Bands {
				if b.Quota() {
					continue // no bucket, no marker (migrations/00013); its refill is 0
				}
				longest = max(longest, b.Limit().FillTime())
			}
		}
	}
	return min(longest, MaxRaiseWindow)
}
