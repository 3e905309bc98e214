-- Calendar quotas (regions.Band.Period): a band is a token bucket as in 00012, or a
-- quota: an amount per calendar hour, day, ISO week or month in a time zone, one budget
-- for the whole fleet. A quota band is stored in the same bands array, as
-- {"name", "capacity", "refill_per_second": 0, "period"[, "zone"]}, and the CHECK
-- (limit_bands_valid) enforces what regions.Rule.Validate (validateQuota) does: period
-- one of hour, day, week, month; refill_per_second exactly 0; a whole capacity 1..1e15;
-- zone, when given, a time zone the server knows (pg_timezone_names; regions loads it
-- from the zone database Go embeds). Token-bucket bands are checked as before: no period,
-- no zone.
--
-- The zone names are copied into limit_zone_known when this migration runs: reading
-- pg_timezone_names lists the server's whole zone directory, about 30 ms a call, which
-- a CHECK evaluated for every band of a 100,000-rule apply cannot afford; a membership
-- test of a constant array costs microseconds. A zone the server learns later (a newer
-- tzdata) is refused until this function is rebuilt (migrate down and up).
--
-- A quota never gets a raise marker (00008, 00012: route "route#band"): it has no bucket
-- that a raise could hand out at once, and a share change is covered by its allowance
-- (regions.Allowance: usage plus a share of what is left). So the raise triggers leave
-- out the quota bands of the rules they compare (limit_raise_band_pairs, and the key
-- change of limit_raise_rule), and a band turned from a bucket into a quota, or back, is
-- a new limit, as a band added is: no mark.
--
-- quota_usage holds what each region's gateways have counted of each quota period, one
-- row per tenant, route, band, period start and region: the gateways report their
-- counters (store.ReportUsage: counters only grow, so used = greatest(old, new) makes a
-- report idempotent and order-free across the gateways of one region), read the fleet's
-- totals back (store.LoadUsage) to compute their allowance, and the rebalancer prunes
-- periods long past (store.PruneUsage). The gateways write it (SELECT, INSERT, UPDATE);
-- the rebalancer reads and deletes; ratectl reads. region has no foreign key, as
-- gateway_instance's and region_share_history's: what a region spent of a period stays
-- spent after the region is removed (deleting its rows, ON DELETE CASCADE, would hand
-- that much of the fleet's budget out again to the other regions), it must not hold the
-- removal up (RESTRICT), and a gateway may report before its region is added.

-- +goose Up
-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format($f$CREATE FUNCTION limit_zone_known(p_zone text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $b$
    SELECT p_zone = ANY (%L::text[])
$b$$f$, (SELECT array_agg(name ORDER BY name) FROM pg_timezone_names
         WHERE name NOT IN ('localtime', 'posixrules', 'Factory') AND name !~ '^/'));
END
$do$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_bands_valid(p_bands jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN jsonb_typeof(p_bands) IS DISTINCT FROM 'array' THEN false
        WHEN jsonb_array_length(p_bands) > 8 THEN false
        ELSE coalesce((
            SELECT bool_and(CASE
                    WHEN jsonb_typeof(e) <> 'object' THEN false
                    WHEN coalesce((SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(e) k), '{}') NOT IN (
                            ARRAY['capacity', 'name', 'refill_per_second'],
                            ARRAY['capacity', 'name', 'period', 'refill_per_second'],
                            ARRAY['capacity', 'name', 'period', 'refill_per_second', 'zone']) THEN false
                    WHEN jsonb_typeof(e -> 'name') <> 'string' OR jsonb_typeof(e -> 'capacity') <> 'number'
                         OR jsonb_typeof(e -> 'refill_per_second') <> 'number' THEN false
                    WHEN NOT (e ->> 'name' ~ '^[A-Za-z0-9._-]{1,64}$') OR lower(e ->> 'name') = 'rate' THEN false
                    WHEN (e ->> 'capacity')::numeric NOT BETWEEN 1 AND 1000000000000000
                         OR (e ->> 'capacity')::numeric <> trunc((e ->> 'capacity')::numeric) THEN false
                    -- A quota: a period, no refill, a known zone if any.
                    WHEN e ? 'period' THEN jsonb_typeof(e -> 'period') = 'string'
                         AND e ->> 'period' IN ('hour', 'day', 'week', 'month')
                         AND (e ->> 'refill_per_second')::numeric = 0
                         AND (NOT e ? 'zone' OR (jsonb_typeof(e -> 'zone') = 'string' AND limit_zone_known(e ->> 'zone')))
                    -- A token bucket.
                    ELSE (e ->> 'refill_per_second')::numeric > 0
                         AND (e ->> 'refill_per_second')::numeric <= 1000000000000
                         AND (e ->> 'refill_per_second')::double precision > 0
                    END)
                   AND count(DISTINCT e ->> 'name') = count(*)
            FROM jsonb_array_elements(p_bands) e), true)
    END
$$;
-- +goose StatementEnd

-- The grown token-bucket bands of p_before and p_after: 00012's, quotas left out on
-- either side.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_band_pairs(p_before jsonb, p_after jsonb)
RETURNS TABLE (band text, o double precision, n double precision) LANGUAGE sql IMMUTABLE AS $$
    SELECT a.e ->> 'name', (b.e ->> 'capacity')::double precision, (a.e ->> 'capacity')::double precision
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_before) = 'array' THEN p_before ELSE '[]' END) b(e)
    JOIN jsonb_array_elements(CASE WHEN jsonb_typeof(p_after) = 'array' THEN p_after ELSE '[]' END) a(e)
        ON a.e ->> 'name' = b.e ->> 'name'
    WHERE (a.e ->> 'capacity')::double precision > (b.e ->> 'capacity')::double precision
      AND NOT a.e ? 'period' AND NOT b.e ? 'period'
$$;
-- +goose StatementEnd

-- limit_raise_rule of 00012, the key change marking token-bucket bands only.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_rule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        -- A key changed: the old and the new key, and each token-bucket band of the rule
        -- at either, 0 over 1 (a quota has no bucket to hold); a rule updated in place: its own pair as 00011 (1 over 1, no mark, where
        -- only its bands changed) and its grown bands' (limit_raise_marks).
        PERFORM limit_raise_mark_many('*', array_agg(tenant), array_agg(route), array_agg(o), array_agg(n))
        FROM (
            SELECT o.tenant_id AS tenant, k.route, 0::double precision AS o, 1::double precision AS n
                FROM old_rows o CROSS JOIN LATERAL (SELECT o.route_id AS route
                    UNION ALL SELECT o.route_id || '#' || (b.e ->> 'name') FROM jsonb_array_elements(o.bands) b(e)
                        WHERE NOT b.e ? 'period') k
                WHERE NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.tenant_id = o.tenant_id AND n.route_id = o.route_id)
            UNION ALL
            SELECT n.tenant_id, k.route, 0, 1
                FROM new_rows n CROSS JOIN LATERAL (SELECT n.route_id AS route
                    UNION ALL SELECT n.route_id || '#' || (b.e ->> 'name') FROM jsonb_array_elements(n.bands) b(e)
                        WHERE NOT b.e ? 'period') k
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

CREATE TABLE quota_usage (
    tenant       text        NOT NULL,
    route        text        NOT NULL,
    band         text        NOT NULL,
    period_start timestamptz NOT NULL,
    region       text        NOT NULL,
    used         bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT quota_usage_pkey PRIMARY KEY (tenant, route, band, period_start, region),
    CONSTRAINT quota_usage_used_nonnegative CHECK (used >= 0),
    CONSTRAINT quota_usage_tenant_syntax CHECK (tenant ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT quota_usage_route_syntax CHECK (route ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT quota_usage_band_syntax CHECK (band ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT quota_usage_region_syntax CHECK (region ~ '^[A-Za-z0-9._-]{1,64}$')
);
-- LoadUsage reads the periods since a time, PruneUsage deletes those before one.
CREATE INDEX quota_usage_period_start_idx ON quota_usage (period_start);

GRANT SELECT, INSERT, UPDATE ON quota_usage TO quotaplane_gateway;
GRANT SELECT, DELETE ON quota_usage TO quotaplane_rebalancer;
GRANT SELECT ON quota_usage TO quotaplane_operator;

-- CREATE OR REPLACE resets a function's attributes (00012): the trigger runs as the owner
-- with a fixed search_path again; the helpers stay not for PUBLIC.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION limit_raise_rule() SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
    REVOKE EXECUTE ON FUNCTION limit_raise_band_pairs(jsonb, jsonb) FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The quota bands go (ratectl migrate down refuses while a rule has one: data loss), and
-- quota_usage with them; a band removed lifts a restriction, so nothing is marked. The
-- rows are rewritten before the CHECK of 00012 comes back, which would refuse them.
UPDATE rate_limit_rule SET bands = coalesce((SELECT jsonb_agg(e ORDER BY i) FROM jsonb_array_elements(bands) WITH ORDINALITY b(e, i)
    WHERE NOT e ? 'period'), '[]') WHERE jsonb_path_exists(bands, '$[*].period');
UPDATE plan_rule SET bands = coalesce((SELECT jsonb_agg(e ORDER BY i) FROM jsonb_array_elements(bands) WITH ORDINALITY b(e, i)
    WHERE NOT e ? 'period'), '[]') WHERE jsonb_path_exists(bands, '$[*].period');
DROP TABLE quota_usage;
-- The functions as 00012 left them.
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_raise_band_pairs(p_before jsonb, p_after jsonb)
RETURNS TABLE (band text, o double precision, n double precision) LANGUAGE sql IMMUTABLE AS $$
    SELECT a.e ->> 'name', (b.e ->> 'capacity')::double precision, (a.e ->> 'capacity')::double precision
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_before) = 'array' THEN p_before ELSE '[]' END) b(e)
    JOIN jsonb_array_elements(CASE WHEN jsonb_typeof(p_after) = 'array' THEN p_after ELSE '[]' END) a(e)
        ON a.e ->> 'name' = b.e ->> 'name'
    WHERE (a.e ->> 'capacity')::double precision > (b.e ->> 'capacity')::double precision
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION limit_bands_valid(p_bands jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
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
DROP FUNCTION limit_zone_known(text);
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION limit_raise_rule() SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
    REVOKE EXECUTE ON FUNCTION limit_raise_band_pairs(jsonb, jsonb) FROM PUBLIC;
END
$$;
-- +goose StatementEnd
