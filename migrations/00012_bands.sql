-- Bands (issue 24, "plan pro: 100/s burst 200, 10,000 per hour"): a rule keeps its own
-- token bucket (the band named "rate": capacity, refill_per_second) and gains up to 8
-- further named buckets (regions.Rule.Bands), each decided with the rule's own in one
-- script call. They are a jsonb array on the row, [{"name", "capacity",
-- "refill_per_second"}], not a table of their own: a rule and its bands are one object
-- (one audit row, one upsert per table, one row read per rule by the gateways), and the
-- order of the bands is the order a client sees them in.
--
-- The CHECKs enforce what regions.Rule.Validate does (limit_bands_valid): an array of at
-- most 8 objects of exactly those keys, names ^[A-Za-z0-9._-]{1,64}$, not "rate" in any case, unique;
-- a whole capacity 1..1e15; refill_per_second > 0 and <= 1e12; and no bands on a rule
-- of more than one shard (a rule's buckets are decided in the tenant's slot). Existing
-- rows get '[]': a rule of one band, as before.
--
-- Raise markers (00008, 00010, 00011): a rule's own mark is 00011's (its capacity and
-- shards; a rule without bands marks exactly the rows it did). Each band marks a row of
-- its own, of route "route#band" (the pair's route, '*' too, a '#' and the band's name;
-- band names never hold '#', so these never meet a pair's row): the bands of the rule
-- that applied before and after are compared by name, and each band in both whose
-- capacity grew is marked old/new through limit_raise_mark_many, so band marks compound
-- and are acknowledged as any. A band added is a new restriction and a band removed lifts
-- one: neither marks. The before and after rules are those 00011 resolves (a rule
-- updated, a rule added or deleted against the rule that applies without it, a plan's
-- rule, a tenant assigned or moved), so every trigger compares the bands of the same two
-- rules it compares the capacities of (limit_raise_marks). An UPDATE that changes a
-- rule's key marks its old and new key 0 over 1, as 00010 did, and each band of the rule
-- at either key too. The gateway holds each bucket to its own row: one ratio for all the
-- buckets of a rule held a month-long band to a tenth of its capacity for a month when
-- the route's default capacity was raised tenfold.

-- +goose Up
-- A band's mark compounds with the one before it whatever its age: a pair's raise an
-- hour old has held its bucket for its fill time (00010: no sane rule takes an hour), a
-- band's (a day, a month) has not, and replacing it would let a second raise, however
-- small, hand out the new capacity at once.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_mark_many(p_region text, p_tenants text[], p_routes text[],
    p_old double precision[], p_new double precision[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO limit_raise (region, tenant, route, raised_at, ratio, gate_ratio)
    SELECT p_region, m.tenant, m.route, now(), limit_raise_product(m.ratio), limit_raise_product(m.ratio)
    FROM (SELECT t AS tenant, r AS route, CASE WHEN n > 0 THEN greatest(0, least(1, o / n)) ELSE 0 END AS ratio
          FROM unnest(p_tenants, p_routes, p_old, p_new) AS u(t, r, o, n)
          WHERE n > o) m
    GROUP BY m.tenant, m.route
    ON CONFLICT (region, tenant, route) DO UPDATE SET
        ratio = CASE WHEN limit_raise.raised_at > now() - interval '1 hour' OR limit_raise.route LIKE '%#%'
                     THEN limit_raise.ratio * EXCLUDED.ratio ELSE EXCLUDED.ratio END,
        gate_ratio = CASE WHEN limit_raise_acked(limit_raise.region, limit_raise.xid)
                          THEN EXCLUDED.ratio ELSE limit_raise.gate_ratio * EXCLUDED.ratio END,
        raised_at = greatest(limit_raise.raised_at, EXCLUDED.raised_at),
        xid = pg_current_xact_id()
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION limit_bands_valid(p_bands jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN jsonb_typeof(p_bands) IS DISTINCT FROM 'array' THEN false
        WHEN jsonb_array_length(p_bands) > 8 THEN false
        ELSE coalesce((
            SELECT bool_and(CASE
                    WHEN jsonb_typeof(e) <> 'object' THEN false
                    WHEN (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(e) k)
                         IS DISTINCT FROM ARRAY['capacity', 'name', 'refill_per_second'] THEN false
                    WHEN jsonb_typeof(e -> 'name') <> 'string' OR jsonb_typeof(e -> 'capacity') <> 'number'
                         OR jsonb_typeof(e -> 'refill_per_second') <> 'number' THEN false
                    WHEN NOT (e ->> 'name' ~ '^[A-Za-z0-9._-]{1,64}$') OR lower(e ->> 'name') = 'rate' THEN false
                    WHEN (e ->> 'capacity')::numeric NOT BETWEEN 1 AND 1000000000000000
                         OR (e ->> 'capacity')::numeric <> trunc((e ->> 'capacity')::numeric) THEN false
                    ELSE (e ->> 'refill_per_second')::numeric > 0
                         AND (e ->> 'refill_per_second')::numeric <= 1000000000000
                         AND (e ->> 'refill_per_second')::double precision > 0
                    END)
                   AND count(DISTINCT e ->> 'name') = count(*)
            FROM jsonb_array_elements(p_bands) e), true)
    END
$$;
-- +goose StatementEnd

ALTER TABLE rate_limit_rule ADD COLUMN bands jsonb NOT NULL DEFAULT '[]',
    ADD CONSTRAINT rate_limit_rule_bands_valid CHECK (limit_bands_valid(bands)),
    ADD CONSTRAINT rate_limit_rule_bands_unsharded CHECK (bands = '[]'::jsonb OR shards = 1);
ALTER TABLE plan_rule ADD COLUMN bands jsonb NOT NULL DEFAULT '[]',
    ADD CONSTRAINT plan_rule_bands_valid CHECK (limit_bands_valid(bands)),
    ADD CONSTRAINT plan_rule_bands_unsharded CHECK (bands = '[]'::jsonb OR shards = 1);

-- The bands of p_before and p_after (arrays as stored; NULL: no rule) that share a name
-- and grew, with their capacity before (o) and after (n). Inlined by the planner.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_band_pairs(p_before jsonb, p_after jsonb)
RETURNS TABLE (band text, o double precision, n double precision) LANGUAGE sql IMMUTABLE AS $$
    SELECT a.e ->> 'name', (b.e ->> 'capacity')::double precision, (a.e ->> 'capacity')::double precision
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_before) = 'array' THEN p_before ELSE '[]' END) b(e)
    JOIN jsonb_array_elements(CASE WHEN jsonb_typeof(p_after) = 'array' THEN p_after ELSE '[]' END) a(e)
        ON a.e ->> 'name' = b.e ->> 'name'
    WHERE (a.e ->> 'capacity')::double precision > (b.e ->> 'capacity')::double precision
$$;
-- +goose StatementEnd

-- The rows limit_raise_mark_many is given for (tenant, p_route), whose rule's own pair is
-- p_pair (old, new) and whose rule had the bands p_before and has p_after: p_pair under
-- p_route, and each grown band's pair under p_route || '#' || its name. Inlined.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_marks(p_route text, p_pair double precision[], p_before jsonb, p_after jsonb)
RETURNS TABLE (route text, o double precision, n double precision) LANGUAGE sql IMMUTABLE AS $$
    SELECT p_route, p_pair[1], p_pair[2]
    UNION ALL
    SELECT p_route || '#' || bp.band, bp.o, bp.n FROM limit_raise_band_pairs(p_before, p_after) bp
$$;
-- +goose StatementEnd

-- limit_raise_plan_capacity of 00011 with the bands of the rule that applies.
DROP FUNCTION limit_raise_plan_capacity(text, text, text, plan_rule[]);
-- +goose StatementBegin
CREATE FUNCTION limit_raise_plan_capacity(p_tenant text, p_route text, p_plan text, p_rules plan_rule[])
RETURNS TABLE (capacity double precision, shards integer, bands jsonb) LANGUAGE sql STABLE AS $$
    SELECT c.cap, c.shards, c.bands FROM (
        SELECT CASE WHEN r.tenant_id = p_tenant AND r.route_id = p_route THEN 0
                    WHEN r.tenant_id = p_tenant THEN 1 WHEN r.route_id = p_route THEN 4 ELSE 5 END AS o,
               r.capacity::double precision AS cap, r.shards, r.bands
            FROM rate_limit_rule r
            WHERE (r.tenant_id, r.route_id) IN ((p_tenant, p_route), (p_tenant, '*'), ('*', p_route), ('*', '*'))
        UNION ALL
        SELECT CASE WHEN pr.route_id = p_route THEN 2 ELSE 3 END, pr.capacity::double precision, pr.shards, pr.bands
            FROM unnest(p_rules) pr
            WHERE pr.plan = p_plan AND pr.route_id IN (p_route, '*')
    ) c ORDER BY c.o LIMIT 1
$$;
-- +goose StatementEnd

-- limit_raise_rule of 00011, comparing the bands too.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_rule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        -- A key changed: the old and the new key, and each band of the rule at either, 0
        -- over 1; a rule updated in place: its own pair as 00011 (1 over 1, no mark, where
        -- only its bands changed) and its grown bands' (limit_raise_marks).
        PERFORM limit_raise_mark_many('*', array_agg(tenant), array_agg(route), array_agg(o), array_agg(n))
        FROM (
            SELECT o.tenant_id AS tenant, k.route, 0::double precision AS o, 1::double precision AS n
                FROM old_rows o CROSS JOIN LATERAL (SELECT o.route_id AS route
                    UNION ALL SELECT o.route_id || '#' || (b.e ->> 'name') FROM jsonb_array_elements(o.bands) b(e)) k
                WHERE NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.tenant_id = o.tenant_id AND n.route_id = o.route_id)
            UNION ALL
            SELECT n.tenant_id, k.route, 0, 1
                FROM new_rows n CROSS JOIN LATERAL (SELECT n.route_id AS route
                    UNION ALL SELECT n.route_id || '#' || (b.e ->> 'name') FROM jsonb_array_elements(n.bands) b(e)) k
                WHERE NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.tenant_id = n.tenant_id AND o.route_id = n.route_id)
            UNION ALL
            SELECT n.tenant_id, k.route, k.o, k.n
                FROM old_rows o JOIN new_rows n ON n.tenant_id = o.tenant_id AND n.route_id = o.route_id
                CROSS JOIN LATERAL limit_raise_marks(n.route_id, ARRAY[
                    CASE WHEN n.capacity > o.capacity THEN o.capacity WHEN n.shards > o.shards THEN 1 - 1e-9 ELSE 1 END,
                    CASE WHEN n.capacity > o.capacity THEN n.capacity ELSE 1 END]::double precision[], o.bands, n.bands) k
                WHERE n.capacity > o.capacity OR n.shards > o.shards OR o.bands <> n.bands
        ) m;
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM limit_raise_mark_many('*', array_agg(m.tenant), array_agg(k.route), array_agg(k.o), array_agg(k.n))
        FROM (
            SELECT p.tenant, p.route, limit_raise_pair(b.cap, b.shards, p.capacity::double precision, p.shards) AS pair,
                   b.bands AS before, p.bands AS after
            FROM (
                SELECT r.tenant_id AS tenant, r.route_id AS route, r.route_id AS own_route, r.capacity, r.shards, r.bands FROM new_rows r
                UNION ALL
                SELECT r.tenant_id, o.route_id, r.route_id, r.capacity, r.shards, r.bands
                    FROM new_rows r JOIN rate_limit_rule o ON o.tenant_id = '*' AND o.route_id <> '*'
                    WHERE r.tenant_id <> '*' AND r.route_id = '*'
                      AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = o.route_id)
                UNION ALL
                -- The plan's routes the branch above has not listed already.
                SELECT r.tenant_id, pr.route_id, r.route_id, r.capacity, r.shards, r.bands
                    FROM new_rows r JOIN tenant_plan tp ON tp.tenant_id = r.tenant_id
                    JOIN plan_rule pr ON pr.plan = tp.plan AND pr.route_id <> '*'
                    WHERE r.route_id = '*'
                      AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = pr.route_id)
                      AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = '*' AND m.route_id = pr.route_id)
            ) p
            LEFT JOIN LATERAL (
                SELECT c.cap, c.shards, c.bands FROM (
                    SELECT CASE WHEN r.tenant_id = p.tenant AND r.route_id = p.route THEN 0
                                WHEN r.tenant_id = p.tenant THEN 1 WHEN r.route_id = p.route THEN 4 ELSE 5 END AS o,
                           r.capacity::double precision AS cap, r.shards, r.bands
                        FROM rate_limit_rule r
                        WHERE (r.tenant_id, r.route_id) IN ((p.tenant, p.route), (p.tenant, '*'), ('*', p.route), ('*', '*'))
                          AND NOT (r.tenant_id = p.tenant AND r.route_id = p.own_route)
                    UNION ALL
                    SELECT CASE WHEN pr.route_id = p.route THEN 2 ELSE 3 END, pr.capacity::double precision, pr.shards, pr.bands
                        FROM tenant_plan tp JOIN plan_rule pr ON pr.plan = tp.plan
                        WHERE tp.tenant_id = p.tenant AND pr.route_id IN (p.route, '*')
                ) c ORDER BY c.o LIMIT 1
            ) b ON true
        ) m CROSS JOIN LATERAL limit_raise_marks(m.route, m.pair, m.before, m.after) k;
        RETURN NULL;
    END IF;
    -- DELETE: before, the row won for every pair; now the best remaining rule applies.
    PERFORM limit_raise_mark_many('*', array_agg(m.tenant), array_agg(k.route), array_agg(k.o), array_agg(k.n))
    FROM (
        SELECT p.tenant, p.route, limit_raise_pair(p.capacity::double precision, p.shards, b.cap, b.shards) AS pair,
               p.bands AS before, b.bands AS after
        FROM (
            SELECT r.tenant_id AS tenant, r.route_id AS route, r.capacity, r.shards, r.bands FROM old_rows r
            UNION ALL
            SELECT r.tenant_id, o.route_id, r.capacity, r.shards, r.bands
                FROM old_rows r JOIN rate_limit_rule o ON o.tenant_id = '*' AND o.route_id <> '*'
                WHERE r.tenant_id <> '*' AND r.route_id = '*'
                  AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = o.route_id)
            UNION ALL
            SELECT r.tenant_id, pr.route_id, r.capacity, r.shards, r.bands
                FROM old_rows r JOIN tenant_plan tp ON tp.tenant_id = r.tenant_id
                JOIN plan_rule pr ON pr.plan = tp.plan AND pr.route_id <> '*'
                WHERE r.route_id = '*'
                  AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = r.tenant_id AND m.route_id = pr.route_id)
                  AND NOT EXISTS (SELECT 1 FROM rate_limit_rule m WHERE m.tenant_id = '*' AND m.route_id = pr.route_id)
        ) p
        LEFT JOIN LATERAL (
            SELECT c.cap, c.shards, c.bands FROM (
                SELECT CASE WHEN r.tenant_id = p.tenant AND r.route_id = p.route THEN 0
                            WHEN r.tenant_id = p.tenant THEN 1 WHEN r.route_id = p.route THEN 4 ELSE 5 END AS o,
                       r.capacity::double precision AS cap, r.shards, r.bands
                    FROM rate_limit_rule r
                    WHERE (r.tenant_id, r.route_id) IN ((p.tenant, p.route), (p.tenant, '*'), ('*', p.route), ('*', '*'))
                UNION ALL
                SELECT CASE WHEN pr.route_id = p.route THEN 2 ELSE 3 END, pr.capacity::double precision, pr.shards, pr.bands
                    FROM tenant_plan tp JOIN plan_rule pr ON pr.plan = tp.plan
                    WHERE tp.tenant_id = p.tenant AND pr.route_id IN (p.route, '*')
            ) c ORDER BY c.o LIMIT 1
        ) b ON true
    ) m CROSS JOIN LATERAL limit_raise_marks(m.route, m.pair, m.before, m.after) k;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- limit_raise_plan_rule and limit_raise_tenant_plan of 00011, comparing the bands too.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_plan_rule() RETURNS trigger LANGUAGE plpgsql AS $$
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
    PERFORM limit_raise_mark_many('*', array_agg(m.tenant), array_agg(k.route), array_agg(k.o), array_agg(k.n))
    FROM (
        SELECT q.tenant, q.route, limit_raise_pair(b.capacity, b.shards, a.capacity, a.shards) AS pair,
               b.bands AS before, a.bands AS after
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
    ) m CROSS JOIN LATERAL limit_raise_marks(m.route, m.pair, m.before, m.after) k;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_tenant_plan() RETURNS trigger LANGUAGE plpgsql AS $$
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
    PERFORM limit_raise_mark_many('*', array_agg(m.tenant), array_agg(k.route), array_agg(k.o), array_agg(k.n))
    FROM (
        SELECT q.tenant, q.route, limit_raise_pair(b.capacity, b.shards, a.capacity, a.shards) AS pair,
               b.bands AS before, a.bands AS after
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
    ) m CROSS JOIN LATERAL limit_raise_marks(m.route, m.pair, m.before, m.after) k;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- CREATE OR REPLACE resets a function's attributes: the writing triggers run as the owner
-- with a fixed search_path again (as 00009 and 00011 left them); helpers not for PUBLIC.
-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['limit_raise_rule()', 'limit_raise_plan_rule()', 'limit_raise_tenant_plan()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    FOREACH f IN ARRAY ARRAY['limit_raise_plan_capacity(text, text, text, plan_rule[])', 'limit_raise_band_pairs(jsonb, jsonb)',
        'limit_raise_marks(text, double precision[], jsonb, jsonb)'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The bands go (ratectl migrate down refuses while a rule has any: data loss); dropping a
-- band lifts a restriction, which is no raise of a capacity, so nothing is marked. The
-- bands' marks go with them (no gateway of 00011 looks a bucket up under route#band).
DELETE FROM limit_raise WHERE route LIKE '%#%';
-- limit_raise_mark_many as 00010 left it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_mark_many(p_region text, p_tenants text[], p_routes text[],
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
-- The functions as 00011 left them.
DROP FUNCTION limit_raise_plan_capacity(text, text, text, plan_rule[]);
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_plan_rule() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_tenant_plan() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['limit_raise_rule()', 'limit_raise_plan_rule()', 'limit_raise_tenant_plan()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    FOREACH f IN ARRAY ARRAY['limit_raise_plan_capacity(text, text, text, plan_rule[])'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

DROP FUNCTION limit_raise_marks(text, double precision[], jsonb, jsonb);
DROP FUNCTION limit_raise_band_pairs(jsonb, jsonb);
ALTER TABLE plan_rule DROP COLUMN bands;
ALTER TABLE rate_limit_rule DROP COLUMN bands;
DROP FUNCTION limit_bands_valid(jsonb);
