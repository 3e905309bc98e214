package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/migrations"
)

// TestDownChecked (issue 25): rolling back refuses while gateways are live, when a step
// would drop data, and when it would remove the audit protections or the default rule,
// unless each is overridden; a refused roll back changes nothing.
func TestDownChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	if _, err := migrations.PlanDown(ctx, db, migrations.DownOptions{}); !errors.Is(err, migrations.ErrNothingApplied) {
		t.Fatalf("plan on an empty database: %v, want ErrNothingApplied", err)
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	exec := func(q string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	version := func() int64 {
		t.Helper()
		v, err := migrations.Version(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	latest := migrations.Latest()
	p, err := migrations.PlanDown(ctx, db, migrations.DownOptions{})
	if err != nil || p.Version != latest || len(p.Refusals) != 0 {
		t.Fatalf("plan of a fresh schema: %+v, %v; want migration %d with nothing refused", p, err, latest)
	}

	// refused checks that a roll back with o is refused for exactly kinds, each detail
	// naming its want, and that nothing changed.
	refused := func(o migrations.DownOptions, want map[migrations.RefusalKind]string) {
		t.Helper()
		before := version()
		p, err := migrations.DownChecked(ctx, db, o)
		if !errors.Is(err, migrations.ErrDownRefused) {
			t.Fatalf("roll back of %d with %+v: %v, want ErrDownRefused", before, o, err)
		}
		got := map[migrations.RefusalKind]string{}
		for _, r := range p.Blocking(o) {
			got[r.Kind] = r.Detail
		}
		for k, w := range want {
			if !strings.Contains(got[k], w) || !strings.Contains(err.Error(), w) {
				t.Errorf("roll back of %d: refusal %s %q (error %v), want it to name %q", before, k, got[k], err, w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("roll back of %d: refused for %v, want %v", before, got, want)
		}
		if v := version(); v != before {
			t.Fatalf("a refused roll back changed the version from %d to %d", before, v)
		}
	}
	ok := func(o migrations.DownOptions) {
		t.Helper()
		before := version()
		if _, err := migrations.DownChecked(ctx, db, o); err != nil {
			t.Fatalf("roll back of %d with %+v: %v", before, o, err)
		}
		if v := version(); v != before-1 {
			t.Fatalf("roll back of %d: version %d", before, v)
		}
	}

	exec(`INSERT INTO gateway_instance (id, region) VALUES ('gw-1', 'us-east')`)
	exec(`INSERT INTO gateway_instance (id, region, stopped_at) VALUES ('gw-2', 'us-east', now())`)
	exec(`INSERT INTO plan (name) VALUES ('pro')`)
	exec(`INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second, bands) VALUES ('pro', '*', 200, 100, '[{"name": "hour", "capacity": 10000, "refill_per_second": 2.5}]')`)
	exec(`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, bands) VALUES ('q', 'r', 10, 1,
		'[{"name": "hour", "capacity": 100, "refill_per_second": 1}, {"name": "month", "capacity": 1000, "refill_per_second": 0, "period": "month", "zone": "Europe/Berlin"}]')`)
	exec(`INSERT INTO quota_usage (tenant, route, band, period_start, region, used) VALUES ('q', 'r', 'month', '2026-12-01T00:00:00+01:00', 'us-east', 5)`)
	// 13: the quota band and its usage would go; the token-bucket bands stay.
	refused(migrations.DownOptions{AllowLiveGateways: true}, map[migrations.RefusalKind]string{
		migrations.RefusalDataLoss: "losing 1 rules with quota bands, 1 quota usage rows",
	})
	ok(migrations.DownOptions{AllowLiveGateways: true, AllowDataLoss: true})
	var left string
	if err := db.QueryRowContext(ctx, `SELECT bands::text FROM rate_limit_rule WHERE tenant_id = 'q'`).Scan(&left); err != nil ||
		left != `[{"name": "hour", "capacity": 100, "refill_per_second": 1}]` {
		t.Fatalf("bands of q/r after rolling back 13: %s, %v; want the hour band only", left, err)
	}
	exec(`DELETE FROM rate_limit_rule WHERE tenant_id = 'q'`)
	// 12: the bands would go.
	refused(migrations.DownOptions{}, map[migrations.RefusalKind]string{
		migrations.RefusalLiveGateways: "gw-1 (us-east)",
		migrations.RefusalDataLoss:     "losing 1 plan rules with bands",
	})
	ok(migrations.DownOptions{AllowLiveGateways: true, AllowDataLoss: true})
	refused(migrations.DownOptions{}, map[migrations.RefusalKind]string{
		migrations.RefusalLiveGateways: "gw-1 (us-east)",
		migrations.RefusalDataLoss:     "1 plans, 1 plan rules",
	})
	exec(`UPDATE gateway_instance SET last_seen = now() - interval '1 minute' WHERE id = 'gw-1'`)
	// 11: the plans would go.
	refused(migrations.DownOptions{}, map[migrations.RefusalKind]string{migrations.RefusalDataLoss: "drops plan, plan_rule and tenant_plan"})
	ok(migrations.DownOptions{AllowDataLoss: true})
	ok(migrations.DownOptions{}) // 10: gw-1 is older than the TTL, gw-2 stopped
	exec(`UPDATE gateway_instance SET last_seen = now() WHERE id = 'gw-1'`)

	// 9: an audit row names on_behalf_of; the append-only triggers would go.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `SELECT set_config('quotaplane.actor', 'alice', true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO region (name) VALUES ('us-east')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	live := migrations.DownOptions{AllowLiveGateways: true}
	refused(live, map[migrations.RefusalKind]string{
		migrations.RefusalDataLoss:   "1 audit rows naming on_behalf_of",
		migrations.RefusalProtection: "append-only",
	})
	if _, err := db.ExecContext(ctx, `DELETE FROM audit_log`); err == nil {
		t.Fatal("the append-only trigger is gone after a refused roll back")
	}
	ok(migrations.DownOptions{AllowLiveGateways: true, AllowDataLoss: true, AllowUnprotected: true})

	// 8 .. 4 drop data (overridden) but no protection; 3 drops the audit triggers.
	for version() > 3 {
		ok(migrations.DownOptions{AllowLiveGateways: true, AllowDataLoss: true})
	}
	refused(migrations.DownOptions{AllowLiveGateways: true, AllowDataLoss: true},
		map[migrations.RefusalKind]string{migrations.RefusalProtection: "drops the audit"})
	ok(migrations.DownOptions{AllowLiveGateways: true, AllowUnprotected: true})
	refused(migrations.DownOptions{AllowLiveGateways: true, AllowDataLoss: true},
		map[migrations.RefusalKind]string{migrations.RefusalProtection: "deletes the default rule"})
	ok(migrations.DownOptions{AllowLiveGateways: true, AllowUnprotected: true})
	refused(migrations.DownOptions{AllowLiveGateways: true},
		map[migrations.RefusalKind]string{migrations.RefusalDataLoss: "1 regions"})
	ok(migrations.DownOptions{AllowLiveGateways: true, AllowDataLoss: true})
	if v := version(); v != 0 {
		t.Fatalf("version %d after rolling everything back, want 0", v)
	}
}
