-- Plans (issue 24): a plan is a named set of per-route rules (free, pro) that many
-- tenants share. A tenant is assigned at most one plan (tenant_plan); a tenant's own
-- rule wins over its plan's. The gateways resolve a request's rule in this order:
--   tenant+route, tenant+*, plan+route, plan+*, *+route, *+*
-- (regions.Snapshot.Rule; limit_raise_rule_capacity below resolves it the same way). A
-- plan is a template, not a bucket: every tenant of a plan keeps buckets of its own (the
-- bucket key is the request's tenant and route, never the plan).
--
-- Changing a plan's rule is one row: all its tenants resolve through it, so one UPDATE
-- changes them all in one transaction and leaves one audit row.
--
-- Deleting: a plan's rules go with it (plan_rule ON DELETE CASCADE: the plan is their
-- owner, and each rule deleted is audited), but a plan assigned to a tenant cannot be
-- deleted (tenant_plan ON DELETE RESTRICT): unassign its tenants first, so no tenant
-- falls back to the defaults by accident.
--
-- Raise markers (00008, 00010; docs/reliability.md "rule changes and expiry"): every
-- change that may raise a tenant's capacity marks, per tenant, conservatively:
--   * a plan rule added, changed or removed: each tenant of the plan, for the rule's
--     route (and, for route *, each route with a rule for every tenant), the capacity
--     before (the plan's rules as the statement found them) against after;
--   * a tenant assigned, moved or unassigned: the tenant, for route *, each route with a
--     rule for every tenant, and each route of its old and new plan's rules;
--   * a tenant's own rule added or deleted (limit_raise_rule): now compared with the rule
--     that applies with plans, and for tenant+* the routes of its plan's rules too.
-- A pair whose rule did not change (a tenant's own rule still wins) compares equal and
-- is not marked. Where the capacity is not raised but the rule that applies has more
-- shards, the pair is marked 1 - 1e-9 over 1 (limit_raise_pair), as 00010 marks a rule
-- updated to more shards: the new shards start from their refill, not full.
--
-- Like the other configuration tables: audited (audit_log), notified, TRUNCATE refused;
-- the gateway and the rebalancer read them, the operator writes them.

-- +goose Up
CREATE TABLE plan (
    name       text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT plan_name_syntax CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$')
);

CREATE TABLE plan_rule (
    plan              text             NOT NULL REFERENCES plan (name) ON DELETE CASCADE,
    route_id          text             NOT NULL,
    capacity          bigint           NOT NULL,
    refill_per_second double precision NOT NULL,
    shadow            boolean          NOT NULL DEFAULT false,
    shards            integer          NOT NULL DEFAULT 1,
    updated_at        timestamptz      NOT NULL DEFAULT now(),
    CONSTRAINT plan_rule_pkey PRIMARY KEY (plan, route_id),
    CONSTRAINT plan_rule_route_syntax CHECK (route_id = '*' OR route_id ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT plan_rule_route_reserved CHECK (route_id <> '_other'),
    CONSTRAINT plan_rule_capacity_positive CHECK (capacity > 0),
    CONSTRAINT plan_rule_capacity_bound CHECK (capacity <= 1000000000000000),
    CONSTRAINT plan_rule_refill_positive CHECK (refill_per_second > 0 AND refill_per_second < 'Infinity'),
    CONSTRAINT plan_rule_refill_bound CHECK (refill_per_second <= 1000000000000),
    CONSTRAINT plan_rule_shards_range CHECK (shards BETWEEN 1 AND 1024)
);

CREATE TABLE tenant_plan (
    tenant_id  text        PRIMARY KEY,
    plan       text        NOT NULL REFERENCES plan (name) ON DELETE RESTRICT,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tenant_plan_tenant_syntax CHECK (tenant_id ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT tenant_plan_tenant_reserved CHECK (tenant_id <> '_other')
);
CREATE INDEX tenant_plan_plan_idx ON tenant_plan (plan);

CREATE TRIGGER plan_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON plan
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_notify();
CREATE TRIGGER plan_rule_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON plan_rule
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_notify();
CREATE TRIGGER tenant_plan_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tenant_plan
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_notify();

CREATE TRIGGER plan_audit AFTER INSERT OR UPDATE OR DELETE ON plan
    FOR EACH ROW EXECUTE FUNCTION audit_write();
CREATE TRIGGER plan_rule_audit AFTER INSERT OR UPDATE OR DELETE ON plan_rule
    FOR EACH ROW EXECUTE FUNCTION audit_write();
CREATE TRIGGER tenant_plan_audit AFTER INSERT OR UPDATE OR DELETE ON tenant_plan
    FOR EACH ROW EXECUTE FUNCTION audit_write();

CREATE TRIGGER plan_refuse_truncate BEFORE TRUNCATE ON plan
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_refuse_truncate();
CREATE TRIGGER plan_rule_refuse_truncate BEFORE TRUNCATE ON plan_rule
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_refuse_truncate();
CREATE TRIGGER tenant_plan_refuse_truncate BEFORE TRUNCATE ON tenant_plan
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_refuse_truncate();

-- The capacity of the rule that applies to (tenant, route), as the gateways resolve it
-- (plans included), with the tenant's own row (drop_tenant, drop_route) left out.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_rule_capacity(p_tenant text, p_route text, p_drop_tenant text, p_drop_route text)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT c.cap FROM (
        SELECT CASE WHEN r.tenant_id = p_tenant AND r.route_id = p_route THEN 0
                    WHEN r.tenant_id = p_tenant THEN 1 WHEN r.route_id = p_route THEN 4 ELSE 5 END AS o,
               r.capacity::double precision AS cap
            FROM rate_limit_rule r
            WHERE (r.tenant_id, r.route_id) IN ((p_tenant, p_route), (p_tenant, '*'), ('*', p_route), ('*', '*'))
              AND NOT (r.tenant_id = p_drop_tenant AND r.route_id = p_drop_route)
        UNION ALL
        SELECT CASE WHEN pr.route_id = p_route THEN 2 ELSE 3 END, pr.capacity::double precision
            FROM tenant_plan tp JOIN plan_rule pr ON pr.plan = tp.plan
            WHERE tp.tenant_id = p_tenant AND pr.route_id IN (p_route, '*')
    ) c ORDER BY c.o LIMIT 1
$$;
-- +goose StatementEnd

-- The capacity and shards of the rule that applies to (tenant, route) were the tenant on
-- plan p_plan (NULL: none) and the plans' rules p_rules: how a statement found the plans,
-- or left them. No row: no rule applies.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_plan_capacity(p_tenant text, p_route text, p_plan text, p_rules plan_rule[])
RETURNS TABLE (capacity double precision, shards integer) LANGUAGE sql STABLE AS $$
    SELECT c.cap, c.shards FROM (
        SELECT CASE WHEN r.tenant_id = p_tenant AND r.route_id = p_route THEN 0
                    WHEN r.tenant_id = p_tenant THEN 1 WHEN r.route_id = p_route THEN 4 ELSE 5 END AS o,
               r.capacity::double precision AS cap, r.shards
            FROM rate_limit_rule r
            WHERE (r.tenant_id, r.route_id) IN ((p_tenant, p_route), (p_tenant, '*'), ('*', p_route), ('*', '*'))
        UNION ALL
        SELECT CASE WHEN pr.route_id = p_route THEN 2 ELSE 3 END, pr.capacity::double precision, pr.shards
            FROM unnest(p_rules) pr
            WHERE pr.plan = p_plan AND pr.route_id IN (p_route, '*')
    ) c ORDER BY c.o LIMIT 1
$$;
-- +goose StatementEnd

-- The pair limit_raise_mark_many is given for a rule that applied before (capacity
-- p_bcap, p_bshards; NULL: none) and one after: the capacities, or where the capacity is
-- not raised but the shards grow, 1 - 1e-9 over 1 (as limit_raise_rule's UPDATE: the
-- new shards start from their refill). Inlined by the planner (one SELECT, no FROM).
-- +goose StatementBegin
CREATE FUNCTION limit_raise_pair(p_bcap double precision, p_bshards integer, p_acap double precision, p_ashards integer)
RETURNS double precision[] LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN coalesce(p_acap, 0) <= coalesce(p_bcap, 0) AND p_ashards > p_bshards
                THEN ARRAY[1 - 1e-9, 1]::double precision[]
                ELSE ARRAY[coalesce(p_bcap, 0), coalesce(p_acap, 0)] END
$$;
-- +goose StatementEnd

-- A tenant's own rule added or removed (00010's statement trigger): the rule that applies
-- before an insert, or after a delete, now includes the tenant's plan (resolved inline as
-- limit_raise_rule_capacity does: a function call per row would re-plan it per row); a
-- tenant's rule of every route (tenant, *) also covers the routes of its plan's rules it
-- has no rule for.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_rule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        PERFORM limit_raise_mark_many('*', array_agg(tenant), array_agg(route), array_agg(o), array_agg(n))
        FROM (
            SELECT o.tenant_id AS tenant, o.route_id AS route, 0::double precision AS o, 1::double precision AS n
                FROM old_rows o
                WHERE NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.tenant_id = o.tenant_id AND n.route_id = o.route_id)
            UNION ALL
            SELECT n.tenant_id, n.route_id, 0, 1
                FROM new_rows n
                WHERE NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.tenant_id = n.tenant_id AND o.route_id = n.route_id)
            UNION ALL
            SELECT n.tenant_id, n.route_id,
                   CASE WHEN n.capacity > o.capacity THEN o.capacity ELSE 1 - 1e-9 END,
                   CASE WHEN n.capacity > o.capacity THEN n.capacity ELSE 1 END
                FROM old_rows o JOIN new_rows n ON n.tenant_id = o.tenant_id AND n.route_id = o.route_id
                WHERE n.capacity > o.capacity OR n.shards > o.shards
        ) m;
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM limit_raise_mark_many('*', array_agg(m.tenant), array_agg(m.route), array_agg(m.pair[1]), array_agg(m.pair[2]))
        FROM (
            SELECT p.tenant, p.route, limit_raise_pair(b.cap, b.shards, p.capacity::double precision, p.shards) AS pair
            FROM (
                SELECT r.tenant_id AS tenant, r.route_id AS route, r.route_id AS own_route, r.capacity, r.shards FROM new_rows r
                UNION ALL
                SELECT r.tenant_id, o.route_id, r.route_id, r.capacity, r.shards
                    FROM new_rows r JOIN rate_limit_rule o ON o.tenant_id = '*' AND o.route_id <> '*'
                    WHERE r.tenant_id <> '*' AND r.route_id = '*'
                      AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = o.route_id)
                UNION ALL
                -- The plan's routes the branch above has not listed already.
                SELECT r.tenant_id, pr.route_id, r.route_id, r.capacity, r.shards
                    FROM new_rows r JOIN tenant_plan tp ON tp.tenant_id = r.tenant_id
                    JOIN plan_rule pr ON pr.plan = tp.plan AND pr.route_id <> '*'
                    WHERE r.route_id = '*'
                      AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = pr.route_id)
                      AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = '*' AND m.route_id = pr.route_id)
            ) p
            LEFT JOIN LATERAL (
                SELECT c.cap, c.shards FROM (
                    SELECT CASE WHEN r.tenant_id = p.tenant AND r.route_id = p.route THEN 0
                                WHEN r.tenant_id = p.tenant THEN 1 WHEN r.route_id = p.route THEN 4 ELSE 5 END AS o,
                           r.capacity::double precision AS cap, r.shards
                        FROM rate_limit_rule r
                        WHERE (r.tenant_id, r.route_id) IN ((p.tenant, p.route), (p.tenant, '*'), ('*', p.route), ('*', '*'))
                          AND NOT (r.tenant_id = p.tenant AND r.route_id = p.own_route)
                    UNION ALL
                    SELECT CASE WHEN pr.route_id = p.route THEN 2 ELSE 3 END, pr.capacity::double precision, pr.shards
                        FROM tenant_plan tp JOIN plan_rule pr ON pr.plan = tp.plan
                        WHERE tp.tenant_id = p.tenant AND pr.route_id IN (p.route, '*')
                ) c ORDER BY c.o LIMIT 1
            ) b ON true
        ) m;
        RETURN NULL;
    END IF;
    -- DELETE: before, the row won for every pair; now the best remaining rule applies.
    PERFORM limit_raise_mark_many('*', array_agg(m.tenant), array_agg(m.route), array_agg(m.pair[1]), array_agg(m.pair[2]))
    FROM (
        SELECT p.tenant, p.route, limit_raise_pair(p.capacity::double precision, p.shards, b.cap, b.shards) AS pair
        FROM (
            SELECT r.tenant_id AS tenant, r.route_id AS route, r.capacity, r.shards FROM old_rows r
            UNION ALL
            SELECT r.tenant_id, o.route_id, r.capacity, r.shards
                FROM old_rows r JOIN rate_limit_rule o ON o.tenant_id = '*' AND o.route_id <> '*'
                WHERE r.tenant_id <> '*' AND r.route_id = '*'
                  AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = o.route_id)
            UNION ALL
            SELECT r.tenant_id, pr.route_id, r.capacity, r.shards
                FROM old_rows r JOIN tenant_plan tp ON tp.tenant_id = r.tenant_id
                JOIN plan_rule pr ON pr.plan = tp.plan AND pr.route_id <> '*'
                WHERE r.route_id = '*'
                  AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = pr.route_id)
                  AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = '*' AND m.route_id = pr.route_id)
        ) p
        LEFT JOIN LATERAL (
            SELECT c.cap, c.shards FROM (
                SELECT CASE WHEN r.tenant_id = p.tenant AND r.route_id = p.route THEN 0
                            WHEN r.tenant_id = p.tenant THEN 1 WHEN r.route_id = p.route THEN 4 ELSE 5 END AS o,
                       r.capacity::double precision AS cap, r.shards
                    FROM rate_limit_rule r
                    WHERE (r.tenant_id, r.route_id) IN ((p.tenant, p.route), (p.tenant, '*'), ('*', p.route), ('*', '*'))
                UNION ALL
                SELECT CASE WHEN pr.route_id = p.route THEN 2 ELSE 3 END, pr.capacity::double precision, pr.shards
                    FROM tenant_plan tp JOIN plan_rule pr ON pr.plan = tp.plan
                    WHERE tp.tenant_id = p.tenant AND pr.route_id IN (p.route, '*')
            ) c ORDER BY c.o LIMIT 1
        ) b ON true
    ) m;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- A plan's rules changed: every tenant of the plans touched, for each changed route (and
-- for route * each route with a rule for every tenant), before against after (more
-- shards of the same capacity mark as in limit_raise_rule: limit_raise_pair).
-- +goose StatementBegin
CREATE FUNCTION limit_raise_plan_rule() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_old    plan_rule[] := '{}';
    v_new    plan_rule[] := '{}';
    v_after  plan_rule[];
    v_before plan_rule[];
BEGIN
    IF TG_OP <> 'INSERT' THEN
        v_old := ARRAY(SELECT ROW(o.*)::plan_rule FROM old_rows o);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        v_new := ARRAY(SELECT ROW(n.*)::plan_rule FROM new_rows n);
    END IF;
    v_after := ARRAY(SELECT ROW(p.*)::plan_rule FROM plan_rule p
        WHERE p.plan IN (SELECT c.plan FROM unnest(v_old || v_new) c));
    v_before := ARRAY(SELECT ROW(a.*)::plan_rule FROM unnest(v_after) a
        WHERE NOT EXISTS (SELECT 1 FROM unnest(v_new) n WHERE n.plan = a.plan AND n.route_id = a.route_id)) || v_old;
    PERFORM limit_raise_mark_many('*', array_agg(m.tenant), array_agg(m.route), array_agg(m.pair[1]), array_agg(m.pair[2]))
    FROM (
        SELECT q.tenant, q.route, limit_raise_pair(b.capacity, b.shards, a.capacity, a.shards) AS pair
        FROM (
            SELECT DISTINCT tp.tenant_id AS tenant, tp.plan, x.route
            FROM (SELECT DISTINCT c.plan, c.route_id FROM unnest(v_old || v_new) c) ch
            JOIN tenant_plan tp ON tp.plan = ch.plan
            CROSS JOIN LATERAL (
                SELECT ch.route_id AS route
                UNION
                SELECT r.route_id FROM rate_limit_rule r WHERE ch.route_id = '*' AND r.tenant_id = '*' AND r.route_id <> '*'
            ) x
        ) q
        LEFT JOIN LATERAL limit_raise_plan_capacity(q.tenant, q.route, q.plan, v_before) b ON true
        LEFT JOIN LATERAL limit_raise_plan_capacity(q.tenant, q.route, q.plan, v_after) a ON true
    ) m;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER plan_rule_raise_insert AFTER INSERT ON plan_rule
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_plan_rule();
CREATE TRIGGER plan_rule_raise_update AFTER UPDATE ON plan_rule
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_plan_rule();
CREATE TRIGGER plan_rule_raise_delete AFTER DELETE ON plan_rule
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_plan_rule();

-- Tenants assigned, moved or unassigned: each one, for route *, each route with a rule
-- for every tenant and each route of its old and new plans' rules, with its old plan
-- against its new one.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_tenant_plan() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_old   tenant_plan[] := '{}';
    v_new   tenant_plan[] := '{}';
    v_rules plan_rule[];
BEGIN
    IF TG_OP <> 'INSERT' THEN
        v_old := ARRAY(SELECT ROW(o.*)::tenant_plan FROM old_rows o);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        v_new := ARRAY(SELECT ROW(n.*)::tenant_plan FROM new_rows n);
    END IF;
    v_rules := ARRAY(SELECT ROW(p.*)::plan_rule FROM plan_rule p
        WHERE p.plan IN (SELECT c.plan FROM unnest(v_old || v_new) c));
    PERFORM limit_raise_mark_many('*', array_agg(m.tenant), array_agg(m.route), array_agg(m.pair[1]), array_agg(m.pair[2]))
    FROM (
        SELECT q.tenant, q.route, limit_raise_pair(b.capacity, b.shards, a.capacity, a.shards) AS pair
        FROM (
            SELECT t.tenant, t.before_plan, t.after_plan, x.route
            FROM (
                SELECT tn.tenant,
                       (SELECT o.plan FROM unnest(v_old) o WHERE o.tenant_id = tn.tenant) AS before_plan,
                       (SELECT c.plan FROM tenant_plan c WHERE c.tenant_id = tn.tenant) AS after_plan
                FROM (SELECT o.tenant_id AS tenant FROM unnest(v_old) o UNION SELECT n.tenant_id FROM unnest(v_new) n) tn
            ) t
            CROSS JOIN LATERAL (
                SELECT '*'::text AS route
                UNION
                SELECT r.route_id FROM rate_limit_rule r WHERE r.tenant_id = '*' AND r.route_id <> '*'
                UNION
                SELECT pr.route_id FROM unnest(v_rules) pr WHERE pr.plan IN (t.before_plan, t.after_plan)
            ) x
        ) q
        LEFT JOIN LATERAL limit_raise_plan_capacity(q.tenant, q.route, q.before_plan, v_rules) b ON true
        LEFT JOIN LATERAL limit_raise_plan_capacity(q.tenant, q.route, q.after_plan, v_rules) a ON true
    ) m;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER tenant_plan_raise_insert AFTER INSERT ON tenant_plan
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_tenant_plan();
CREATE TRIGGER tenant_plan_raise_update AFTER UPDATE ON tenant_plan
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_tenant_plan();
CREATE TRIGGER tenant_plan_raise_delete AFTER DELETE ON tenant_plan
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_tenant_plan();

-- Writers of the rules, the plans' rules and the plan assignments queue on one
-- transaction-level advisory lock, taken before each statement: a statement's raise
-- markers are computed from the rules as the writer before it committed, not from a
-- snapshot that misses a concurrent change (two writers marking against each other's old
-- rules could each miss the other's raise). The AFTER statement triggers' queries take a
-- new snapshot (READ COMMITTED, the isolation every writer here uses) once the lock is
-- held. Key 1366322290 = 0x51706c72 ("Qplr"); the migrator's lock (migrations.lockID)
-- and the rebalancer's (rebalancer/job.DefaultLockKey) are others.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_lock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1366322290);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_raise_lock BEFORE INSERT OR UPDATE OR DELETE ON rate_limit_rule
    FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_lock();
CREATE TRIGGER plan_raise_lock BEFORE INSERT OR UPDATE OR DELETE ON plan
    FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_lock();
CREATE TRIGGER plan_rule_raise_lock BEFORE INSERT OR UPDATE OR DELETE ON plan_rule
    FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_lock();
CREATE TRIGGER tenant_plan_raise_lock BEFORE INSERT OR UPDATE OR DELETE ON tenant_plan
    FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_lock();

-- As 00009 left the others: the writing triggers run as the owner with a fixed
-- search_path; helpers not for PUBLIC.
-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['limit_raise_rule()', 'limit_raise_plan_rule()', 'limit_raise_tenant_plan()',
        'limit_raise_lock()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    FOREACH f IN ARRAY ARRAY['limit_raise_plan_rule()', 'limit_raise_tenant_plan()', 'limit_raise_lock()',
        'limit_raise_plan_capacity(text, text, text, plan_rule[])', 'limit_raise_rule_capacity(text, text, text, text)',
        'limit_raise_pair(double precision, integer, double precision, integer)'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

GRANT SELECT ON plan, plan_rule, tenant_plan TO quotaplane_gateway, quotaplane_rebalancer, quotaplane_operator;
GRANT INSERT, UPDATE, DELETE ON plan, plan_rule, tenant_plan TO quotaplane_operator;

-- +goose Down
-- Unassign every tenant while the raise triggers are still here: a tenant whose plan was
-- smaller than the rules it falls back to is marked, as an unassignment is.
DELETE FROM tenant_plan;
DROP TRIGGER tenant_plan_raise_lock ON tenant_plan;
DROP TRIGGER plan_rule_raise_lock ON plan_rule;
DROP TRIGGER plan_raise_lock ON plan;
DROP TRIGGER rate_limit_rule_raise_lock ON rate_limit_rule;
DROP FUNCTION limit_raise_lock();
DROP TRIGGER tenant_plan_raise_delete ON tenant_plan;
DROP TRIGGER tenant_plan_raise_update ON tenant_plan;
DROP TRIGGER tenant_plan_raise_insert ON tenant_plan;
DROP TRIGGER plan_rule_raise_delete ON plan_rule;
DROP TRIGGER plan_rule_raise_update ON plan_rule;
DROP TRIGGER plan_rule_raise_insert ON plan_rule;
DROP FUNCTION limit_raise_tenant_plan();
DROP FUNCTION limit_raise_plan_rule();

-- limit_raise_rule and limit_raise_rule_capacity as 00010 left them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_rule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        PERFORM limit_raise_mark_many('*', array_agg(tenant), array_agg(route), array_agg(o), array_agg(n))
        FROM (
            SELECT o.tenant_id AS tenant, o.route_id AS route, 0::double precision AS o, 1::double precision AS n
                FROM old_rows o
                WHERE NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.tenant_id = o.tenant_id AND n.route_id = o.route_id)
            UNION ALL
            SELECT n.tenant_id, n.route_id, 0, 1
                FROM new_rows n
                WHERE NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.tenant_id = n.tenant_id AND o.route_id = n.route_id)
            UNION ALL
            SELECT n.tenant_id, n.route_id,
                   CASE WHEN n.capacity > o.capacity THEN o.capacity ELSE 1 - 1e-9 END,
                   CASE WHEN n.capacity > o.capacity THEN n.capacity ELSE 1 END
                FROM old_rows o JOIN new_rows n ON n.tenant_id = o.tenant_id AND n.route_id = o.route_id
                WHERE n.capacity > o.capacity OR n.shards > o.shards
        ) m;
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM limit_raise_mark_many('*', array_agg(p.tenant), array_agg(p.route),
            array_agg(coalesce((
                SELECT c.capacity::double precision FROM rate_limit_rule c
                WHERE (c.tenant_id, c.route_id) IN ((p.tenant, p.route), (p.tenant, '*'), ('*', p.route), ('*', '*'))
                  AND NOT (c.tenant_id = p.tenant AND c.route_id = p.own_route)
                ORDER BY CASE WHEN c.tenant_id = p.tenant AND c.route_id = p.route THEN 0
                              WHEN c.tenant_id = p.tenant THEN 1 WHEN c.route_id = p.route THEN 2 ELSE 3 END
                LIMIT 1), 0)),
            array_agg(p.capacity::double precision))
        FROM (
            SELECT r.tenant_id AS tenant, r.route_id AS route, r.route_id AS own_route, r.capacity FROM new_rows r
            UNION ALL
            SELECT r.tenant_id, o.route_id, r.route_id, r.capacity
                FROM new_rows r JOIN rate_limit_rule o ON o.tenant_id = '*' AND o.route_id <> '*'
                WHERE r.tenant_id <> '*' AND r.route_id = '*'
                  AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = o.route_id)
        ) p;
        RETURN NULL;
    END IF;
    PERFORM limit_raise_mark_many('*', array_agg(p.tenant), array_agg(p.route), array_agg(p.capacity::double precision),
        array_agg(coalesce((
            SELECT c.capacity::double precision FROM rate_limit_rule c
            WHERE (c.tenant_id, c.route_id) IN ((p.tenant, p.route), (p.tenant, '*'), ('*', p.route), ('*', '*'))
            ORDER BY CASE WHEN c.tenant_id = p.tenant AND c.route_id = p.route THEN 0
                          WHEN c.tenant_id = p.tenant THEN 1 WHEN c.route_id = p.route THEN 2 ELSE 3 END
            LIMIT 1), 0)))
    FROM (
        SELECT r.tenant_id AS tenant, r.route_id AS route, r.capacity FROM old_rows r
        UNION ALL
        SELECT r.tenant_id, o.route_id, r.capacity
            FROM old_rows r JOIN rate_limit_rule o ON o.tenant_id = '*' AND o.route_id <> '*'
            WHERE r.tenant_id <> '*' AND r.route_id = '*'
              AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = o.route_id)
    ) p;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_rule_capacity(p_tenant text, p_route text, p_drop_tenant text, p_drop_route text)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT capacity::double precision FROM rate_limit_rule
    WHERE (tenant_id, route_id) IN ((p_tenant, p_route), (p_tenant, '*'), ('*', p_route), ('*', '*'))
      AND NOT (tenant_id = p_drop_tenant AND route_id = p_drop_route)
    ORDER BY CASE WHEN tenant_id = p_tenant AND route_id = p_route THEN 0
                  WHEN tenant_id = p_tenant THEN 1 WHEN route_id = p_route THEN 2 ELSE 3 END
    LIMIT 1
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION limit_raise_rule() SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
END
$$;
-- +goose StatementEnd

DROP FUNCTION limit_raise_plan_capacity(text, text, text, plan_rule[]);
DROP FUNCTION limit_raise_pair(double precision, integer, double precision, integer);
DROP TABLE tenant_plan;
DROP TABLE plan_rule;
DROP TABLE plan;
