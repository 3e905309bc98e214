package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// The usage of calendar quotas (migrations/00013, table quota_usage): one row per
// tenant, route, band, period start and region, holding the most that region's
// counter of the period has shown. A region's gateways report their counters
// (ReportUsage), read back what every region has used (LoadUsage) to compute their
// allowance (regions.Allowance), and the rebalancer deletes periods long over
// (PruneUsage).

// Bounds of a period start, in Unix seconds: the years 1 to 9999, what a timestamptz
// holds and time.Time prints.
const (
	minPeriodStart = -62135596800
	maxPeriodStart = 253402300799
)

// ReportUsage records what region's counters show of rows' quota periods, in one
// statement for the whole batch. A report never lowers a count (used = the greatest
// reported): counters only grow, so reports are idempotent and may arrive in any order,
// from any number of gateways of the region counting the same counter. A key given
// twice counts its larger Used. Bad input (an id, a negative Used, a start out of
// range) wraps regions.ErrInvalid and writes nothing.
func (s *Store) ReportUsage(ctx context.Context, region string, rows []regions.QuotaReport) error {
	if err := regions.ValidateID("region", region); err != nil {
		return fmt.Errorf("report usage: %w", err)
	}
	if len(rows) == 0 {
		return nil
	}
	var (
		tenants, routes, bands = make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows))
		starts, used           = make([]int64, len(rows)), make([]int64, len(rows))
	)
	for i, r := range rows {
		if err := validateQuotaKey(r.QuotaKey); err != nil {
			return fmt.Errorf("report usage of %s: %w", region, err)
		}
		if r.Used < 0 {
			return fmt.Errorf("report usage of %s: %w usage of %s: %d is negative", region, regions.ErrInvalid, quotaKeyString(r.QuotaKey), r.Used)
		}
		tenants[i], routes[i], bands[i], starts[i], used[i] = r.Tenant, r.Route, r.Band, r.Start, r.Used
	}
	// GROUP BY: an upsert may not touch one row twice in a statement.
	_, err := s.pool.Exec(ctx, `INSERT INTO quota_usage AS q (tenant, route, band, period_start, region, used, updated_at)
		SELECT t, r, b, to_timestamp(s), $1, max(u), now()
		FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) AS x(t, r, b, s, u)
		GROUP BY t, r, b, s
		ON CONFLICT (tenant, route, band, period_start, region) DO UPDATE
		SET used = greatest(q.used, EXCLUDED.used), updated_at = now()`,
		region, tenants, routes, bands, starts, used)
	if err != nil {
		return fmt.Errorf("report usage of %s (%d periods): %w", region, len(rows), dbErr(err))
	}
	return nil
}

// LoadUsage is what the store has counted of every quota period that started at or
// after since: for each, region's usage (Mine, 0 if it reported none) and every
// region's together (Total, Mine included; a region removed still counts, its usage
// stays spent).
func (s *Store) LoadUsage(ctx context.Context, region string, since time.Time) (map[regions.QuotaKey]regions.QuotaUsage, error) {
	if err := regions.ValidateID("region", region); err != nil {
		return nil, fmt.Errorf("load usage: %w", err)
	}
	rows, _ := s.pool.Query(ctx, `SELECT tenant, route, band, extract(epoch FROM period_start)::bigint,
			coalesce(sum(used) FILTER (WHERE region = $1), 0)::bigint, least(sum(used), 9223372036854775807)::bigint
		FROM quota_usage WHERE period_start >= $2
		GROUP BY tenant, route, band, period_start`, region, since)
	out := make(map[regions.QuotaKey]regions.QuotaUsage)
	var (
		k regions.QuotaKey
		u regions.QuotaUsage
	)
	if _, err := pgx.ForEachRow(rows, []any{&k.Tenant, &k.Route, &k.Band, &k.Start, &u.Mine, &u.Total}, func() error {
		out[k] = u
		return nil
	}); err != nil {
		return nil, fmt.Errorf("load usage of %s since %s: %w", region, since.UTC().Format(time.RFC3339), err)
	}
	return out, nil
}

// QuotaPeriod is one period of one quota band as the store counted it: every region's
// usage and their sum.
type QuotaPeriod struct {
	regions.QuotaKey
	// Used is each region's usage, by region.
	Used  map[string]int64
	Total int64
	// UpdatedAt is the latest report of the period, the store's clock.
	UpdatedAt time.Time
}

// TopUsage is the n quota periods that started at or after since with the most usage
// (the fleet's), most first: what a status page shows.
func (s *Store) TopUsage(ctx context.Context, since time.Time, n int) ([]QuotaPeriod, error) {
	rows, _ := s.pool.Query(ctx, `WITH top AS (
			SELECT tenant, route, band, period_start, least(sum(used), 9223372036854775807)::bigint AS total,
				max(updated_at) AS updated
			FROM quota_usage WHERE period_start >= $1
			GROUP BY tenant, route, band, period_start
			ORDER BY total DESC, tenant, route, band, period_start LIMIT $2)
		SELECT t.tenant, t.route, t.band, extract(epoch FROM t.period_start)::bigint, t.total, t.updated, u.region, u.used
		FROM top t JOIN quota_usage u USING (tenant, route, band, period_start)
		ORDER BY t.total DESC, t.tenant, t.route, t.band, t.period_start, u.region`, since, n)
	var (
		out     []QuotaPeriod
		p       QuotaPeriod
		region  string
		used    int64
		updated time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&p.Tenant, &p.Route, &p.Band, &p.Start, &p.Total, &updated, &region, &used}, func() error {
		if len(out) == 0 || out[len(out)-1].QuotaKey != p.QuotaKey {
			out = append(out, QuotaPeriod{QuotaKey: p.QuotaKey, Used: map[string]int64{}, Total: p.Total, UpdatedAt: updated})
		}
		out[len(out)-1].Used[region] = used
		return nil
	}); err != nil {
		return nil, fmt.Errorf("top quota usage since %s: %w", since.UTC().Format(time.RFC3339), err)
	}
	return out, nil
}

// PruneUsage deletes the usage of the periods that started before before, and returns
// how many rows it deleted. before must be no later than the start of every period still
// running (for a monthly quota, 31 days and a zone's offset ago at most): a running
// period's count deleted is budget handed out again.
func (s *Store) PruneUsage(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM quota_usage WHERE period_start < $1`, before)
	if err != nil {
		return 0, fmt.Errorf("prune usage before %s: %w", before.UTC().Format(time.RFC3339), dbErr(err))
	}
	return tag.RowsAffected(), nil
}

// validateQuotaKey checks k's ids and start.
func validateQuotaKey(k regions.QuotaKey) error {
	if err := regions.ValidateID("tenant", k.Tenant); err != nil {
		return err
	}
	if err := regions.ValidateID("route", k.Route); err != nil {
		return err
	}
	if err := regions.ValidateID("band", k.Band); err != nil {
		return err
	}
	if k.Start < minPeriodStart || k.Start > maxPeriodStart {
		return fmt.Errorf("%w usage of %s: period start %d is outside the years 1 to 9999", regions.ErrInvalid, quotaKeyString(k), k.Start)
	}
	return nil
}

// quotaKeyString names k in errors: tenant/route#band@start.
func quotaKeyString(k regions.QuotaKey) string {
	return fmt.Sprintf("%s/%s#%s@%d", k.Tenant, k.Route, k.Band, k.Start)
}
