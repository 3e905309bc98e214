package migrations_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/migrations"
)

// privileged is a migrated database with one login role per component role, and the
// owner's (the migrating superuser's) URL.
type privileged struct {
	url   string            // the owner
	urls  map[string]string // role ("gateway", "rebalancer", "operator", "owner") -> URL
	names map[string]string // role -> login name (session_user)
}

func newPrivileged(t *testing.T) privileged {
	t.Helper()
	db, dbURL := openDB(t)
	if err := migrations.Up(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	p := privileged{url: dbURL, urls: map[string]string{"owner": dbURL}, names: map[string]string{"owner": "postgres"}}
	for role, group := range map[string]string{
		"gateway": migrations.RoleGateway, "rebalancer": migrations.RoleRebalancer, "operator": migrations.RoleOperator,
	} {
		u := testenv.LoginRole(t, dbURL, group, role[:2])
		p.urls[role] = u
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		p.names[role] = parsed.User.Username()
	}
	return p
}

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx) })
	return c
}

func ownerExec(t *testing.T, p privileged, qs ...string) {
	t.Helper()
	c := connect(t, p.url)
	for _, q := range qs {
		if _, err := c.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// Outcomes of one statement in TestPrivilegeMatrix.
const (
	allowed = "allowed" // succeeds (and, for a write, changes at least one row)
	denied  = "denied"  // fails with insufficient_privilege (42501): a grant, a policy or a trigger
	noRows  = "no rows" // succeeds and changes nothing: row-level security hides the rows
)

// TestPrivilegeMatrix (issue 25, least privilege): each component's role may do what the
// component does and nothing more; nobody, the owner included, may change or remove an
// audit or share-history row, or TRUNCATE a table whose changes are audited.
func TestPrivilegeMatrix(t *testing.T) {
	t.Parallel()
	p := newPrivileged(t)
	ownerExec(t, p,
		`INSERT INTO region (name) VALUES ('us-east'), ('eu-west')`,
		`INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('shop-a', 'r', 10, 1)`,
		`INSERT INTO api_key (key_hash, tenant_id) VALUES (sha256('k1'), 'shop-a')`,
		`INSERT INTO region_share (scope, region, share, source) VALUES ('*', 'us-east', 0.5, 'rebalancer'), ('*', 'eu-west', 0.5, 'rebalancer')`,
		`INSERT INTO region_share (scope, region, share, source) VALUES ('shop-a', 'us-east', 0.7, 'override'), ('shop-a', 'eu-west', 0.3, 'override')`,
		`INSERT INTO region_share (scope, region, share, source, expires_at) VALUES ('shop-b', 'us-east', 0.2, 'override', now() - interval '1 minute')`,
		`INSERT INTO gateway_instance (id, region) VALUES ('gw-1', 'us-east')`,
		`INSERT INTO plan (name) VALUES ('pro'), ('free')`,
		`INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second) VALUES ('pro', '*', 200, 100)`,
		`INSERT INTO tenant_plan (tenant_id, plan) VALUES ('shop-a', 'pro')`,
		`INSERT INTO quota_usage (tenant, route, band, period_start, region, used) VALUES ('shop-a', 'r', 'month', '2026-12-01T00:00:00Z', 'us-east', 10)`,
	)
	report := `INSERT INTO quota_usage (tenant, route, band, period_start, region, used) VALUES ('shop-a', 'r', 'month', '2026-12-01T00:00:00Z', 'us-east', 12), ('shop-a', 'r', 'month', '2026-12-01T00:00:00Z', 'eu-west', 3)
		ON CONFLICT (tenant, route, band, period_start, region) DO UPDATE SET used = greatest(quota_usage.used, EXCLUDED.used), updated_at = now()`
	heartbeat := `INSERT INTO gateway_instance (id, region, last_seen, snapshot_xmin) VALUES ('gw-2', 'eu-west', now(), 5)
		ON CONFLICT (id) DO UPDATE SET region = EXCLUDED.region, last_seen = now(), stopped_at = NULL, snapshot_xmin = EXCLUDED.snapshot_xmin`
	appendOnly := []string{
		`UPDATE audit_log SET actor = 'nobody'`, `DELETE FROM audit_log`, `TRUNCATE audit_log`,
		`UPDATE region_share_history SET actor = 'nobody'`, `DELETE FROM region_share_history`, `TRUNCATE region_share_history`,
		`TRUNCATE rate_limit_rule`, `TRUNCATE api_key`, `TRUNCATE region CASCADE`, `TRUNCATE region_share`,
		`TRUNCATE plan CASCADE`, `TRUNCATE plan_rule`, `TRUNCATE tenant_plan`,
	}
	type step struct{ role, sql, want string }
	var steps []step
	for _, role := range []string{"gateway", "rebalancer", "operator", "owner"} {
		for _, q := range appendOnly {
			steps = append(steps, step{role, q, denied})
		}
	}
	steps = append(steps,
		// The gateway: the snapshot load and its heartbeat.
		step{"gateway", `SELECT count(*) FROM region`, allowed},
		step{"gateway", `SELECT count(*) FROM rate_limit_rule`, allowed},
		step{"gateway", `SELECT count(*) FROM api_key`, allowed},
		step{"gateway", `SELECT count(*) FROM region_share`, allowed},
		step{"gateway", `SELECT count(*) FROM limit_raise`, allowed},
		step{"gateway", `SELECT count(*) FROM limit_raise_expired()`, allowed},
		step{"gateway", `SELECT count(*) FROM gateway_instance WHERE stopped_at IS NULL`, allowed},
		step{"gateway", heartbeat, allowed},
		step{"gateway", `UPDATE gateway_instance SET stopped_at = now() WHERE id = 'gw-1'`, allowed},
		step{"gateway", `DELETE FROM gateway_instance WHERE id = 'gw-1'`, allowed},
		step{"gateway", `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('x', 'r', 1, 1)`, denied},
		step{"gateway", `UPDATE rate_limit_rule SET capacity = 1000`, denied},
		step{"gateway", `UPDATE api_key SET revoked_at = now()`, denied},
		step{"gateway", `INSERT INTO region (name) VALUES ('ap-south')`, denied},
		step{"gateway", `INSERT INTO region_share (scope, region, share, source) VALUES ('x', 'us-east', 1, 'rebalancer')`, denied},
		step{"gateway", `SELECT count(*) FROM audit_log`, denied},
		step{"gateway", `SELECT count(*) FROM region_share_history`, denied},
		step{"gateway", `INSERT INTO audit_log (actor, object, action) VALUES ('x', 'region', 'insert')`, denied},
		step{"gateway", `INSERT INTO limit_raise (region, tenant, route, ratio, gate_ratio) VALUES ('*', 'x', '*', 0, 0)`, denied},
		step{"gateway", `SELECT limit_raise_mark('*', 'x', '*', 0, 1)`, denied},
		step{"gateway", `LOCK TABLE region IN SHARE MODE`, denied},
		step{"gateway", `SELECT count(*) FROM plan`, allowed},
		step{"gateway", `SELECT count(*) FROM plan_rule`, allowed},
		step{"gateway", `SELECT count(*) FROM tenant_plan`, allowed},
		step{"gateway", `INSERT INTO plan (name) VALUES ('x')`, denied},
		step{"gateway", `UPDATE plan_rule SET capacity = 1000`, denied},
		step{"gateway", `INSERT INTO tenant_plan (tenant_id, plan) VALUES ('x', 'pro')`, denied},
		step{"gateway", `DELETE FROM tenant_plan`, denied},
		step{"gateway", report, allowed},
		step{"gateway", `SELECT count(*) FROM quota_usage`, allowed},
		step{"gateway", `DELETE FROM quota_usage`, denied},

		// The rebalancer: its share rows under the lease, expired overrides, the lease.
		step{"rebalancer", `SELECT epoch FROM rebalancer_lease WHERE id = 1 FOR SHARE`, allowed},
		step{"rebalancer", `LOCK TABLE region IN SHARE MODE`, allowed},
		step{"rebalancer", `SELECT count(*) FROM limit_raise_expired()`, allowed},
		step{"rebalancer", `SELECT count(*) FROM region_share_history`, allowed},
		step{"rebalancer", `SELECT share FROM region_share WHERE scope = '*' AND region = 'us-east' AND source = 'rebalancer' FOR UPDATE`, allowed},
		step{"rebalancer", `INSERT INTO region_share (scope, region, share, source, updated_at, reason) VALUES ('*', 'us-east', 0.6, 'rebalancer', now(), 'r')
			ON CONFLICT (scope, region, source) DO UPDATE SET share = EXCLUDED.share, updated_at = now(), reason = EXCLUDED.reason`, allowed},
		step{"rebalancer", `DELETE FROM region_share WHERE scope = '*' AND region = 'eu-west' AND source = 'rebalancer'`, allowed},
		step{"rebalancer", `DELETE FROM region_share WHERE source = 'override' AND expires_at IS NOT NULL AND expires_at <= now()`, allowed},
		step{"rebalancer", `INSERT INTO audit_log (actor, reason, object, action) VALUES ('rebalancer', 'expired', 'region_share', 'delete')`, allowed},
		step{"rebalancer", `INSERT INTO rebalancer_lease (id, holder, epoch, acquired_at) VALUES (1, 'me', 7, now())
			ON CONFLICT (id) DO UPDATE SET epoch = greatest(rebalancer_lease.epoch + 1, EXCLUDED.epoch), holder = EXCLUDED.holder, acquired_at = now()`, allowed},
		step{"rebalancer", `INSERT INTO region_share (scope, region, share, source) VALUES ('shop-c', 'us-east', 1, 'override')`, denied},
		step{"rebalancer", `UPDATE region_share SET share = 1 WHERE source = 'override'`, noRows},
		step{"rebalancer", `UPDATE region_share SET source = 'override' WHERE source = 'rebalancer'`, denied},
		step{"rebalancer", `DELETE FROM region_share WHERE scope = 'shop-a'`, noRows}, // overrides in force
		step{"rebalancer", `SELECT count(*) FROM api_key`, denied},
		step{"rebalancer", `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('x', 'r', 1, 1)`, denied},
		step{"rebalancer", `INSERT INTO region (name) VALUES ('ap-south')`, denied},
		step{"rebalancer", `UPDATE region SET name = 'x'`, denied},
		step{"rebalancer", `DELETE FROM region WHERE name = 'eu-west'`, denied},
		step{"rebalancer", heartbeat, denied},
		step{"rebalancer", `INSERT INTO region_share_history (scope, region, source, actor) VALUES ('*', 'us-east', 'rebalancer', 'x')`, denied},
		step{"rebalancer", `INSERT INTO limit_raise (region, tenant, route, ratio, gate_ratio) VALUES ('*', 'x', '*', 0, 0)`, denied},
		step{"rebalancer", `SELECT count(*) FROM plan`, allowed},
		step{"rebalancer", `SELECT count(*) FROM plan_rule`, allowed},
		step{"rebalancer", `SELECT count(*) FROM tenant_plan`, allowed},
		step{"rebalancer", `INSERT INTO plan (name) VALUES ('x')`, denied},
		step{"rebalancer", `UPDATE plan_rule SET capacity = 1000`, denied},
		step{"rebalancer", `DELETE FROM tenant_plan`, denied},
		step{"rebalancer", `SELECT count(*) FROM quota_usage`, allowed},
		step{"rebalancer", `DELETE FROM quota_usage WHERE period_start < '2027-01-01T00:00:00Z'`, allowed},
		step{"rebalancer", report, denied},

		// The operator: rules, keys, regions, shares; reads everything.
		step{"operator", `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('x', 'r', 1, 1)`, allowed},
		step{"operator", `UPDATE rate_limit_rule SET capacity = 11 WHERE tenant_id = 'shop-a'`, allowed},
		step{"operator", `DELETE FROM rate_limit_rule WHERE tenant_id = 'shop-a'`, allowed},
		step{"operator", `INSERT INTO api_key (key_hash, tenant_id, label) VALUES (sha256('k2'), 'shop-a', 'l') RETURNING id`, allowed},
		step{"operator", `UPDATE api_key SET revoked_at = now() WHERE tenant_id = 'shop-a'`, allowed},
		step{"operator", `INSERT INTO region (name) VALUES ('ap-south')`, allowed},
		step{"operator", `DELETE FROM region_share WHERE region = 'eu-west'`, allowed},
		step{"operator", `INSERT INTO region_share (scope, region, share, source, expires_at) VALUES ('shop-c', 'us-east', 1, 'override', now() + interval '1 hour')`, allowed},
		step{"operator", `UPDATE region_share SET share = 0.4 WHERE scope = 'shop-a' AND region = 'us-east'`, allowed},
		step{"operator", `LOCK TABLE region, rate_limit_rule, api_key, region_share IN EXCLUSIVE MODE`, allowed},
		step{"operator", `SELECT count(*) FROM audit_log`, allowed},
		step{"operator", `SELECT count(*) FROM region_share_history`, allowed},
		step{"operator", `SELECT count(*) FROM gateway_instance`, allowed},
		step{"operator", `SELECT count(*) FROM limit_raise_expired()`, allowed},
		step{"operator", `SELECT count(*) FROM rebalancer_lease`, allowed},
		step{"operator", `SELECT count(*) FROM goose_db_version`, allowed},
		step{"operator", `INSERT INTO audit_log (actor, reason, object, action) VALUES ('rebalancer', 'expired', 'region_share', 'delete')`, allowed}, // stamped as the operator
		step{"operator", `INSERT INTO region_share_history (scope, region, source, actor) VALUES ('*', 'us-east', 'rebalancer', 'x')`, denied},
		step{"operator", heartbeat, denied},
		step{"operator", `UPDATE rebalancer_lease SET epoch = 0`, denied},
		step{"operator", `INSERT INTO limit_raise (region, tenant, route, ratio, gate_ratio) VALUES ('*', 'x', '*', 0, 0)`, denied},
		step{"operator", `SELECT limit_raise_mark('*', 'x', '*', 0, 1)`, denied},
		step{"operator", `SELECT count(*) FROM plan`, allowed},
		step{"operator", `INSERT INTO plan (name) VALUES ('team')`, allowed},
		step{"operator", `INSERT INTO plan_rule (plan, route_id, capacity, refill_per_second) VALUES ('free', 'r', 5, 1)`, allowed},
		step{"operator", `UPDATE plan_rule SET capacity = 300 WHERE plan = 'pro'`, allowed},
		step{"operator", `DELETE FROM plan_rule WHERE plan = 'pro'`, allowed},
		step{"operator", `INSERT INTO tenant_plan (tenant_id, plan) VALUES ('shop-b', 'free')`, allowed},
		step{"operator", `UPDATE tenant_plan SET plan = 'free' WHERE tenant_id = 'shop-a'`, allowed},
		step{"operator", `DELETE FROM tenant_plan WHERE tenant_id = 'shop-a'`, allowed},
		step{"operator", `DELETE FROM plan WHERE name = 'free'`, allowed},
		step{"operator", `SELECT limit_raise_plan_capacity('x', '*', 'pro', '{}')`, denied},
		step{"operator", `SELECT count(*) FROM quota_usage`, allowed},
		step{"operator", report, denied},
		step{"operator", `DELETE FROM quota_usage`, denied},
	)
	conns := map[string]*pgx.Conn{}
	for role, u := range p.urls {
		conns[role] = connect(t, u)
	}
	ctx := context.Background()
	for _, st := range steps {
		t.Run(st.role+": "+st.sql, func(t *testing.T) {
			// Each statement in a transaction rolled back: the steps are independent.
			tx, err := conns[st.role].Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			tag, err := tx.Exec(ctx, st.sql)
			var pgErr *pgconn.PgError
			switch st.want {
			case allowed:
				if err != nil {
					t.Fatalf("refused, want allowed: %v", err)
				}
				if (tag.Insert() || tag.Update() || tag.Delete()) && tag.RowsAffected() == 0 {
					t.Fatalf("changed no row (%s), want a change", tag)
				}
			case noRows:
				if err != nil || tag.RowsAffected() != 0 {
					t.Fatalf("%s, %v; want no row changed and no error", tag, err)
				}
			case denied:
				if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
					t.Fatalf("%s, err %v; want insufficient_privilege (42501)", tag, err)
				}
			}
		})
	}
}

// TestAuditActorIsSessionUser: the actor of an audit or history row is the role that
// connected, whatever the writer names (ratectl --actor becomes on_behalf_of) or writes
// into the row itself; only the owner may name the actor (single-role installations).
func TestAuditActorIsSessionUser(t *testing.T) {
	t.Parallel()
	p := newPrivileged(t)
	ownerExec(t, p, `INSERT INTO region (name) VALUES ('us-east')`)
	ctx := context.Background()
	write := func(role, actor string, qs ...string) {
		t.Helper()
		c := connect(t, p.urls[role])
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config($1, $2, true)`, migrations.SettingActor, actor); err != nil {
				return err
			}
			for _, q := range qs {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
	}
	write("operator", "alice", `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('op', 'r', 1, 1)`)
	// The rebalancer names someone else in a row it inserts itself, and backdates it.
	write("rebalancer", "rebalancer",
		`INSERT INTO audit_log (at, actor, object, action) VALUES ('2001-01-01', 'mallory', 'region_share', 'delete')`,
		`INSERT INTO region_share (scope, region, share, source) VALUES ('*', 'us-east', 1, 'rebalancer')`)
	write("owner", "bob", `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('own', 'r', 1, 1)`)

	c := connect(t, p.url)
	for _, tc := range []struct {
		q, actor, onBehalfOf string
	}{
		{`SELECT actor, coalesce(on_behalf_of, ''), at FROM audit_log WHERE new->>'tenant_id' = 'op'`, p.names["operator"], "alice"},
		{`SELECT actor, coalesce(on_behalf_of, ''), at FROM audit_log WHERE object = 'region_share'`, p.names["rebalancer"], "rebalancer"},
		{`SELECT actor, coalesce(on_behalf_of, ''), at FROM region_share_history WHERE scope = '*'`, p.names["rebalancer"], "rebalancer"},
		{`SELECT actor, coalesce(on_behalf_of, ''), at FROM audit_log WHERE new->>'tenant_id' = 'own'`, "bob", "bob"},
	} {
		var actor, obo string
		var at time.Time
		if err := c.QueryRow(ctx, tc.q).Scan(&actor, &obo, &at); err != nil {
			t.Fatalf("%s: %v", tc.q, err)
		}
		if actor != tc.actor || obo != tc.onBehalfOf {
			t.Errorf("%s: actor %q on behalf of %q, want %q on behalf of %q", tc.q, actor, obo, tc.actor, tc.onBehalfOf)
		}
		if time.Since(at) > time.Hour {
			t.Errorf("%s: at %s, want the time of the write", tc.q, at)
		}
	}
	if p.names["operator"] == "alice" || p.names["rebalancer"] == "rebalancer" {
		t.Fatal("test roles named like the actors: the test proves nothing")
	}
}
