-- The raise markers of migration 00008, marked once per statement instead of once per
-- row (issue 25: a 100k-rule INSERT spent most of its time in the row triggers). The
-- triggers read the statement's rows from transition tables and write the same
-- limit_raise rows as the row triggers did: each changed row is compared with the table
-- as the statement left it minus that row (what a row trigger, fired at the end of the
-- statement, saw), and the marks of one (region, tenant, route) within one statement
-- compound as consecutive marks did (their ratios multiply).
--
-- Rules, the bulk case, are marked set-based: one INSERT into limit_raise per statement.
-- Shares (a statement changes a few rows: regions x scopes) walk the transition table with
-- the row trigger's logic, now limit_raise_share_row.
--
-- An UPDATE's old and new rows are paired by primary key; a row whose key changed marks
-- its old and its new key as the row trigger did (anything may be larger).

-- +goose Up
CREATE AGGREGATE limit_raise_product(double precision) (SFUNC = float8mul, STYPE = double precision, INITCOND = '1');

-- limit_raise_mark for many (tenant, route) pairs of one region at once; pairs that are
-- not raises (new <= old) are left out, the others of one key compound.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_mark_many(p_region text, p_tenants text[], p_routes text[],
    p_old double precision[], p_new double precision[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO limit_raise (region, tenant, route, raised_at, ratio, gate_ratio)
    SELECT p_region, m.tenant, m.route, now(), limit_raise_product(m.ratio), limit_raise_product(m.ratio)
    FROM (SELECT t AS tenant, r AS route, CASE WHEN n > 0 THEN greatest(0, least(1, o / n)) ELSE 0 END AS ratio
          FROM unnest(p_tenants, p_routes, p_old, p_new) AS u(t, r, o, n)
          WHERE n > o) m
    GROUP BY m.tenant, m.route
    ON CONFLICT (region, tenant, route) DO UPDATE SET
        ratio = CASE WHEN limit_raise.raised_at > now() - interval '1 hour'
                     THEN limit_raise.ratio * EXCLUDED.ratio ELSE EXCLUDED.ratio END,
        gate_ratio = CASE WHEN limit_raise_acked(limit_raise.region, limit_raise.xid)
                          THEN EXCLUDED.ratio ELSE limit_raise.gate_ratio * EXCLUDED.ratio END,
        raised_at = greatest(limit_raise.raised_at, EXCLUDED.raised_at),
        xid = pg_current_xact_id()
$$;
-- +goose StatementEnd

-- A rule added or removed changes the capacity of its own (tenant, route) and, for a
-- tenant's rule of every route (tenant, *), of each route that has a rule for every
-- tenant (*, route) and none of the tenant's. An inserted row is the rule that applies
-- to each of those pairs afterwards (its own pair, or a route with no rule of the
-- tenant's, for which (tenant, *) wins over (*, route)): the new capacity is its own.
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
            -- More shards of the same capacity: the limiter starts every shard but shard 0
            -- from its refill anyway; the mark says when.
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
    -- DELETE: before, the row won for every pair; now the best remaining rule applies.
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

DROP TRIGGER rate_limit_rule_raise ON rate_limit_rule;
CREATE TRIGGER rate_limit_rule_raise_insert AFTER INSERT ON rate_limit_rule
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_rule();
CREATE TRIGGER rate_limit_rule_raise_update AFTER UPDATE ON rate_limit_rule
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_rule();
CREATE TRIGGER rate_limit_rule_raise_delete AFTER DELETE ON rate_limit_rule
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_rule();

-- One changed share row (p_op INSERT, UPDATE or DELETE; o the old row, n the new):
-- the row trigger of 00008, unchanged but for its arguments. A share row changes the
-- share of its own scope and of every scope below it that has rows of its own in the
-- region (any source: an override of a tenant wins over the rebalancer's share of one of
-- its routes), each compared before and after.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_share_row(p_op text, o region_share, n region_share) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r       region_share;
    v_scope text;
    tenant  text;
    route   text;
    before  double precision;
BEGIN
    IF p_op = 'UPDATE' AND (n.scope <> o.scope OR n.region <> o.region OR n.source <> o.source) THEN
        PERFORM limit_raise_mark(o.region, '*', '*', 0, 1); -- a row moved: anything may be larger
        PERFORM limit_raise_mark(n.region, '*', '*', 0, 1);
        RETURN;
    END IF;
    IF p_op = 'DELETE' THEN r := o; ELSE r := n; END IF;
    FOR v_scope IN SELECT r.scope UNION
        SELECT s.scope FROM region_share s
        WHERE s.region = r.region AND (r.scope = '*' OR starts_with(s.scope, r.scope || '/'))
    LOOP
        tenant := split_part(v_scope, '/', 1);
        route := coalesce(nullif(split_part(v_scope, '/', 2), ''), '*');
        before := CASE
            -- An update of an expired override: the old row was no longer in force.
            WHEN p_op = 'INSERT' OR (p_op = 'UPDATE' AND o.expires_at <= now())
                THEN limit_raise_share_of(r.region, tenant, route, r.scope, r.source, '', '', 0)
            WHEN p_op = 'DELETE' THEN limit_raise_share_of(r.region, tenant, route, '', '', r.scope, r.source, r.share)
            ELSE limit_raise_share_of(r.region, tenant, route, '', '', o.scope, o.source, o.share) END;
        PERFORM limit_raise_mark(r.region, tenant, route, before,
            limit_raise_share_of(r.region, tenant, route, '', '', '', '', 0),
            -- An override deleted after it expired (the rebalancer cleans them up) stopped
            -- counting at its expiry: the raise dates from then.
            CASE WHEN p_op = 'DELETE' AND r.expires_at <= now() THEN r.expires_at ELSE now() END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_share() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    x record;
BEGIN
    IF TG_OP = 'INSERT' THEN
        FOR x IN SELECT ROW(n.*)::region_share AS n FROM new_rows n LOOP
            PERFORM limit_raise_share_row('INSERT', NULL, x.n);
        END LOOP;
    ELSIF TG_OP = 'DELETE' THEN
        FOR x IN SELECT ROW(o.*)::region_share AS o FROM old_rows o LOOP
            PERFORM limit_raise_share_row('DELETE', x.o, NULL);
        END LOOP;
    ELSE
        FOR x IN SELECT ROW(o.*)::region_share AS o, ROW(n.*)::region_share AS n
            FROM old_rows o JOIN new_rows n USING (scope, region, source) LOOP
            PERFORM limit_raise_share_row('UPDATE', x.o, x.n);
        END LOOP;
        -- Rows whose key changed: their old and new regions, as the row trigger did.
        FOR x IN SELECT o.region FROM old_rows o
            WHERE NOT EXISTS (SELECT 1 FROM new_rows n WHERE (n.scope, n.region, n.source) = (o.scope, o.region, o.source))
            UNION ALL
            SELECT n.region FROM new_rows n
            WHERE NOT EXISTS (SELECT 1 FROM old_rows o WHERE (n.scope, n.region, n.source) = (o.scope, o.region, o.source)) LOOP
            PERFORM limit_raise_mark(x.region, '*', '*', 0, 1);
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER region_share_raise ON region_share;
CREATE TRIGGER region_share_raise_insert AFTER INSERT ON region_share
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_share();
CREATE TRIGGER region_share_raise_update AFTER UPDATE ON region_share
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_share();
CREATE TRIGGER region_share_raise_delete AFTER DELETE ON region_share
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_share();

-- As 00009 left them: run as the owner with a fixed search_path; helpers not for PUBLIC.
-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['limit_raise_rule()', 'limit_raise_share()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    FOREACH f IN ARRAY ARRAY['limit_raise_mark_many(text, text[], text[], double precision[], double precision[])',
        'limit_raise_share_row(text, region_share, region_share)'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER region_share_raise_delete ON region_share;
DROP TRIGGER region_share_raise_update ON region_share;
DROP TRIGGER region_share_raise_insert ON region_share;
DROP TRIGGER rate_limit_rule_raise_delete ON rate_limit_rule;
DROP TRIGGER rate_limit_rule_raise_update ON rate_limit_rule;
DROP TRIGGER rate_limit_rule_raise_insert ON rate_limit_rule;

-- The row triggers of 00008, as 00009 left them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_rule() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    route text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.tenant_id <> OLD.tenant_id OR NEW.route_id <> OLD.route_id THEN
            PERFORM limit_raise_mark('*', OLD.tenant_id, OLD.route_id, 0, 1);
            PERFORM limit_raise_mark('*', NEW.tenant_id, NEW.route_id, 0, 1);
        ELSIF NEW.capacity > OLD.capacity THEN
            PERFORM limit_raise_mark('*', NEW.tenant_id, NEW.route_id, OLD.capacity, NEW.capacity);
        ELSIF NEW.shards > OLD.shards THEN
            PERFORM limit_raise_mark('*', NEW.tenant_id, NEW.route_id, 1 - 1e-9, 1);
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    FOR route IN SELECT r.route_id UNION
        SELECT o.route_id FROM rate_limit_rule o
        WHERE r.tenant_id <> '*' AND r.route_id = '*' AND o.tenant_id = '*' AND o.route_id <> '*'
          AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = o.route_id)
    LOOP
        IF TG_OP = 'INSERT' THEN
            PERFORM limit_raise_mark('*', r.tenant_id, route,
                coalesce(limit_raise_rule_capacity(r.tenant_id, route, r.tenant_id, r.route_id), 0),
                coalesce(limit_raise_rule_capacity(r.tenant_id, route, '', ''), 0));
        ELSE
            PERFORM limit_raise_mark('*', r.tenant_id, route, r.capacity,
                coalesce(limit_raise_rule_capacity(r.tenant_id, route, '', ''), 0));
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_share() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r       record;
    v_scope text;
    tenant  text;
    route   text;
    before  double precision;
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.scope <> OLD.scope OR NEW.region <> OLD.region OR NEW.source <> OLD.source) THEN
        PERFORM limit_raise_mark(OLD.region, '*', '*', 0, 1);
        PERFORM limit_raise_mark(NEW.region, '*', '*', 0, 1);
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    FOR v_scope IN SELECT r.scope UNION
        SELECT o.scope FROM region_share o
        WHERE o.region = r.region AND (r.scope = '*' OR starts_with(o.scope, r.scope || '/'))
    LOOP
        tenant := split_part(v_scope, '/', 1);
        route := coalesce(nullif(split_part(v_scope, '/', 2), ''), '*');
        before := CASE
            WHEN TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND OLD.expires_at <= now())
                THEN limit_raise_share_of(r.region, tenant, route, r.scope, r.source, '', '', 0)
            WHEN TG_OP = 'DELETE' THEN limit_raise_share_of(r.region, tenant, route, '', '', r.scope, r.source, r.share)
            ELSE limit_raise_share_of(r.region, tenant, route, '', '', OLD.scope, OLD.source, OLD.share) END;
        PERFORM limit_raise_mark(r.region, tenant, route, before,
            limit_raise_share_of(r.region, tenant, route, '', '', '', '', 0),
            CASE WHEN TG_OP = 'DELETE' AND r.expires_at <= now() THEN r.expires_at ELSE now() END);
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_raise AFTER INSERT OR UPDATE OR DELETE ON rate_limit_rule
    FOR EACH ROW EXECUTE FUNCTION limit_raise_rule();
CREATE TRIGGER region_share_raise AFTER INSERT OR UPDATE OR DELETE ON region_share
    FOR EACH ROW EXECUTE FUNCTION limit_raise_share();

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['limit_raise_rule()', 'limit_raise_share()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$$;
-- +goose StatementEnd

DROP FUNCTION limit_raise_share_row(text, region_share, region_share);
DROP FUNCTION limit_raise_mark_many(text, text[], text[], double precision[], double precision[]);
DROP AGGREGATE limit_raise_product(double precision);
