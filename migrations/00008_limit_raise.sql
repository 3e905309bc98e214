-- Raise markers: when a change that may have raised a tenant's regional capacity was
-- made, and by how much, so a gateway can hold a bucket that Redis no longer has (it
-- expired full under the old limit) to the old limit plus the new refill since the
-- change, instead of a full bucket at the new size (docs/reliability.md, "rule changes
-- and expiry"). Every gateway reads the same rows, a new process too.
--
-- One row per (region, tenant, route); '*' for every region (a rule), every tenant (a
-- default rule, a region-wide share, the equal split of a region removed) or every route
-- (a tenant's rule or share for all its routes). ratio is the old
-- capacity over the new, resolved as the gateways resolve them (the rule: tenant+route,
-- tenant+*, *+route, *+*; the share: overrides then rebalancer values, tenant/route,
-- tenant, *, else the equal split), so a rebalancer moving a share from 0.5 to 0.6 holds
-- a returning bucket to 0.5 of the rule plus the refill, not to nothing. A rule for
-- tenant+* is compared with the default rule (the routes are the gateways' business). Two
-- raises within an hour compound (their ratios multiply), so the second does not forget
-- the first's ramp; raises of different rows do not compound (a gateway takes the
-- tightest of the rows that apply to a bucket). A tenant without an API key is marked too:
-- an RLS caller trusted with tenant ids (rls_trust_tenant) gives it buckets.
--
-- Acknowledgments (issue 22): a gateway reports with each heartbeat the transaction
-- horizon of the snapshot it enforces (gateway_instance.snapshot_xmin: every transaction
-- below it had finished when the snapshot was read, so its writes are in it; NULL: none
-- reported, nothing acknowledged). A share increase of one region (a marker of that
-- region; xid is its writer's transaction) is enforced only once every gateway of the
-- other regions seen within 5 minutes has acknowledged it (regions.Snapshot.Pending):
-- until then the region enforces its share x gate_ratio, the last acknowledged share
-- over the new one. So a gateway cut off from PostgreSQL, which keeps its old share,
-- never sums with the others' new ones above 1.

-- +goose Up
CREATE TABLE limit_raise (
    region    text NOT NULL,
    tenant    text NOT NULL,
    route     text NOT NULL,
    raised_at timestamptz NOT NULL DEFAULT now(),
    ratio     double precision NOT NULL CHECK (ratio >= 0 AND ratio <= 1),
    -- The transaction that wrote it, and the share in force before the raises the other
    -- regions have not all acknowledged, over the new one (see above).
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    gate_ratio double precision NOT NULL CHECK (gate_ratio >= 0 AND gate_ratio <= 1),
    PRIMARY KEY (region, tenant, route)
);

ALTER TABLE gateway_instance ADD COLUMN snapshot_xmin bigint;

-- Whether every gateway of another region than p_region, seen within 5 minutes, has
-- loaded the writes of transaction p_xid (regions.AckHorizon).
-- +goose StatementBegin
CREATE FUNCTION limit_raise_acked(p_region text, p_xid xid8) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(min(coalesce(snapshot_xmin, 0)), 9223372036854775807) > p_xid::text::bigint
    FROM gateway_instance
    WHERE region <> p_region AND stopped_at IS NULL AND last_seen > now() - interval '5 minutes'
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION limit_raise_mark(p_region text, p_tenant text, p_route text, p_old double precision, p_new double precision,
    p_at timestamptz DEFAULT now()) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ratio double precision;
BEGIN
    IF p_new <= p_old THEN
        RETURN; -- not a raise
    END IF;
    v_ratio := CASE WHEN p_new > 0 THEN greatest(0, least(1, p_old / p_new)) ELSE 0 END;
    INSERT INTO limit_raise (region, tenant, route, raised_at, ratio, gate_ratio) VALUES (p_region, p_tenant, p_route, p_at, v_ratio, v_ratio)
    ON CONFLICT (region, tenant, route) DO UPDATE SET
        ratio = CASE WHEN limit_raise.raised_at > now() - interval '1 hour'
                     THEN limit_raise.ratio * EXCLUDED.ratio ELSE EXCLUDED.ratio END,
        gate_ratio = CASE WHEN limit_raise_acked(limit_raise.region, limit_raise.xid)
                          THEN EXCLUDED.ratio ELSE limit_raise.gate_ratio * EXCLUDED.ratio END,
        raised_at = greatest(limit_raise.raised_at, EXCLUDED.raised_at),
        xid = pg_current_xact_id();
END
$$;
-- +goose StatementEnd

-- The capacity of the rule that applies to (tenant, route), as the gateways resolve it,
-- with the row (drop_tenant, drop_route) left out (the one an INSERT added).
-- +goose StatementBegin
CREATE FUNCTION limit_raise_rule_capacity(p_tenant text, p_route text, p_drop_tenant text, p_drop_route text)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT capacity::double precision FROM rate_limit_rule
    WHERE (tenant_id, route_id) IN ((p_tenant, p_route), (p_tenant, '*'), ('*', p_route), ('*', '*'))
      AND NOT (tenant_id = p_drop_tenant AND route_id = p_drop_route)
    ORDER BY CASE WHEN tenant_id = p_tenant AND route_id = p_route THEN 0
                  WHEN tenant_id = p_tenant THEN 1 WHEN route_id = p_route THEN 2 ELSE 3 END
    LIMIT 1
$$;
-- +goose StatementEnd

-- A rule added or removed changes the capacity of its own (tenant, route) and, for a
-- tenant's rule of every route (tenant, *), of each route that has a rule for every
-- tenant (*, route) and none of the tenant's: (tenant, *) wins over (*, route).
-- +goose StatementBegin
CREATE FUNCTION limit_raise_rule() RETURNS trigger LANGUAGE plpgsql AS $$
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
            -- New shards of the same capacity: the limiter starts every shard but shard 0
            -- from its refill anyway; the mark says when.
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
            -- Before, the row won for every route of the loop.
            PERFORM limit_raise_mark('*', r.tenant_id, route, r.capacity,
                coalesce(limit_raise_rule_capacity(r.tenant_id, route, '', ''), 0));
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_raise AFTER INSERT OR UPDATE OR DELETE ON rate_limit_rule
    FOR EACH ROW EXECUTE FUNCTION limit_raise_rule();

-- The share region holds of tenant's rule for route, as the gateways resolve it, with the
-- row (drop_scope, drop_source) left out and the row (add_scope, add_source, add_share)
-- put in (how the table read before the change being marked).
-- +goose StatementBegin
CREATE FUNCTION limit_raise_share_of(p_region text, p_tenant text, p_route text,
    p_drop_scope text, p_drop_source text, p_add_scope text, p_add_source text, p_add_share double precision)
RETURNS double precision LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_scope  text;
    v_source text;
    v_share  double precision;
BEGIN
    FOREACH v_source IN ARRAY ARRAY['override', 'rebalancer'] LOOP
        FOREACH v_scope IN ARRAY ARRAY[p_tenant || '/' || p_route, p_tenant, '*'] LOOP
            IF v_scope = p_add_scope AND v_source = p_add_source THEN
                RETURN p_add_share;
            END IF;
            CONTINUE WHEN v_scope = p_drop_scope AND v_source = p_drop_source;
            SELECT share INTO v_share FROM region_share
                WHERE region = p_region AND scope = v_scope AND source = v_source
                  AND (expires_at IS NULL OR expires_at > now());
            IF FOUND THEN
                RETURN v_share;
            END IF;
        END LOOP;
    END LOOP;
    RETURN 1.0 / greatest(1, (SELECT count(*) FROM region));
END
$$;
-- +goose StatementEnd

-- A share row changes the share of its own scope and of every scope below it that has
-- rows of its own in the region (any source: an override of a tenant wins over the
-- rebalancer's share of one of its routes), each compared before and after.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_share() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r       record;
    v_scope text;
    tenant  text;
    route   text;
    before  double precision;
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.scope <> OLD.scope OR NEW.region <> OLD.region OR NEW.source <> OLD.source) THEN
        PERFORM limit_raise_mark(OLD.region, '*', '*', 0, 1); -- a row moved: anything may be larger
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
            -- An update of an expired override: the old row was no longer in force.
            WHEN TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND OLD.expires_at <= now())
                THEN limit_raise_share_of(r.region, tenant, route, r.scope, r.source, '', '', 0)
            WHEN TG_OP = 'DELETE' THEN limit_raise_share_of(r.region, tenant, route, '', '', r.scope, r.source, r.share)
            ELSE limit_raise_share_of(r.region, tenant, route, '', '', OLD.scope, OLD.source, OLD.share) END;
        PERFORM limit_raise_mark(r.region, tenant, route, before,
            limit_raise_share_of(r.region, tenant, route, '', '', '', '', 0),
            -- An override deleted after it expired (the rebalancer cleans them up) stopped
            -- counting at its expiry: the raise dates from then.
            CASE WHEN TG_OP = 'DELETE' AND r.expires_at <= now() THEN r.expires_at ELSE now() END);
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER region_share_raise AFTER INSERT OR UPDATE OR DELETE ON region_share
    FOR EACH ROW EXECUTE FUNCTION limit_raise_share();

-- The raises of the overrides that have expired and are not deleted yet: the gateways
-- stopped applying them at expires_at (the loader reads only rows in force), before the
-- rebalancer's cleanup deletes them (which marks the same raise, dated at the expiry).
-- The loader reads these with the table's rows.
-- +goose StatementBegin
CREATE FUNCTION limit_raise_expired() RETURNS TABLE (region text, tenant text, route text, raised_at timestamptz, ratio double precision)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r       record;
    v_scope text;
    v_old   double precision;
    v_new   double precision;
BEGIN
    FOR r IN SELECT * FROM region_share s WHERE s.expires_at <= now() AND s.expires_at > now() - interval '1 day' LOOP
        FOR v_scope IN SELECT r.scope UNION
            SELECT o.scope FROM region_share o
            WHERE o.region = r.region AND (r.scope = '*' OR starts_with(o.scope, r.scope || '/'))
        LOOP
            tenant := split_part(v_scope, '/', 1);
            route := coalesce(nullif(split_part(v_scope, '/', 2), ''), '*');
            v_old := limit_raise_share_of(r.region, tenant, route, '', '', r.scope, r.source, r.share);
            v_new := limit_raise_share_of(r.region, tenant, route, '', '', '', '', 0);
            IF v_new > v_old THEN
                region := r.region;
                raised_at := r.expires_at;
                ratio := v_old / v_new;
                RETURN NEXT;
            END IF;
        END LOOP;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- A region removed: the equal split of the others grows from 1/n to 1/(n-1).
-- +goose StatementBegin
CREATE FUNCTION limit_raise_region() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n double precision := (SELECT count(*) FROM region);
BEGIN
    PERFORM limit_raise_mark('*', '*', '*', 1.0 / (n + 1), 1.0 / greatest(n, 1));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER region_raise AFTER DELETE ON region
    FOR EACH ROW EXECUTE FUNCTION limit_raise_region();

-- +goose StatementBegin
CREATE FUNCTION limit_raise_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM limit_raise_mark('*', '*', '*', 0, 1); -- whatever applies now may be larger
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_raise_truncate AFTER TRUNCATE ON rate_limit_rule
    FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_truncate();
CREATE TRIGGER region_share_raise_truncate AFTER TRUNCATE ON region_share
    FOR EACH STATEMENT EXECUTE FUNCTION limit_raise_truncate();

-- +goose Down
DROP TRIGGER region_share_raise_truncate ON region_share;
DROP TRIGGER rate_limit_rule_raise_truncate ON rate_limit_rule;
DROP FUNCTION limit_raise_truncate();
DROP TRIGGER region_raise ON region;
DROP FUNCTION limit_raise_region();
DROP TRIGGER region_share_raise ON region_share;
DROP FUNCTION limit_raise_share();
DROP FUNCTION limit_raise_share_of(text, text, text, text, text, text, text, double precision);
DROP TRIGGER rate_limit_rule_raise ON rate_limit_rule;
DROP FUNCTION limit_raise_rule();
DROP FUNCTION limit_raise_rule_capacity(text, text, text, text);
DROP FUNCTION limit_raise_expired();
DROP FUNCTION limit_raise_mark(text, text, text, double precision, double precision, timestamptz);
DROP FUNCTION limit_raise_acked(text, xid8);
ALTER TABLE gateway_instance DROP COLUMN snapshot_xmin;
DROP TABLE limit_raise;
