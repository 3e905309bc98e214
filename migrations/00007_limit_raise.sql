-- Raise markers: when a change that may have raised a tenant's regional capacity was
-- made, so a gateway can hold a bucket that Redis no longer has (it expired full under
-- the old limit) to the old limit plus the new refill since the change, instead of a
-- full bucket at the new size (docs/reliability.md, "rule changes and expiry"). Every
-- gateway reads the same rows, a new process too, so none hands out a raise early.
--
-- One row per (region, tenant); '*' for every region (a rule change) or every tenant (a
-- default rule, a region-wide share, a region removed). ratio is the old capacity over
-- the new when the change says (a capacity or share raised), 0 when it does not (a row
-- added or removed: another, maybe larger, limit applies). Two raises within an hour
-- compound (their ratios multiply), so a second raise does not forget the first's ramp.
-- A rule or share added for a tenant that has no API key yet raises nothing: it can have
-- no bucket.

-- +goose Up
CREATE TABLE limit_raise (
    region    text NOT NULL,
    tenant    text NOT NULL,
    raised_at timestamptz NOT NULL DEFAULT now(),
    ratio     double precision NOT NULL CHECK (ratio >= 0 AND ratio <= 1),
    PRIMARY KEY (region, tenant)
);

-- +goose StatementBegin
CREATE FUNCTION limit_raise_mark(p_region text, p_tenant text, p_ratio double precision) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_tenant <> '*' AND NOT EXISTS (SELECT 1 FROM api_key WHERE tenant_id = p_tenant) THEN
        RETURN; -- no key, so no bucket: nothing to hold back
    END IF;
    INSERT INTO limit_raise (region, tenant, raised_at, ratio)
    VALUES (p_region, p_tenant, now(), greatest(0, least(1, p_ratio)))
    ON CONFLICT (region, tenant) DO UPDATE SET
        ratio = CASE WHEN limit_raise.raised_at > now() - interval '1 hour'
                     THEN limit_raise.ratio * EXCLUDED.ratio ELSE EXCLUDED.ratio END,
        raised_at = now();
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION limit_raise_rule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM limit_raise_mark('*', NEW.tenant_id, 0);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM limit_raise_mark('*', OLD.tenant_id, 0);
    ELSIF NEW.tenant_id <> OLD.tenant_id OR NEW.route_id <> OLD.route_id THEN
        PERFORM limit_raise_mark('*', OLD.tenant_id, 0);
        PERFORM limit_raise_mark('*', NEW.tenant_id, 0);
    ELSIF NEW.capacity > OLD.capacity OR NEW.shards > OLD.shards THEN
        PERFORM limit_raise_mark('*', NEW.tenant_id, least(1, OLD.capacity::double precision / NEW.capacity));
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_raise AFTER INSERT OR UPDATE OR DELETE ON rate_limit_rule
    FOR EACH ROW EXECUTE FUNCTION limit_raise_rule();

-- +goose StatementBegin
CREATE FUNCTION limit_raise_share() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- scope is '*', 'TENANT' or 'TENANT/ROUTE': the tenant is what precedes the slash.
    IF TG_OP = 'INSERT' THEN
        PERFORM limit_raise_mark(NEW.region, split_part(NEW.scope, '/', 1), 0);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM limit_raise_mark(OLD.region, split_part(OLD.scope, '/', 1), 0);
    ELSIF NEW.scope <> OLD.scope OR NEW.region <> OLD.region OR NEW.source <> OLD.source THEN
        PERFORM limit_raise_mark(OLD.region, split_part(OLD.scope, '/', 1), 0);
        PERFORM limit_raise_mark(NEW.region, split_part(NEW.scope, '/', 1), 0);
    ELSIF NEW.share > OLD.share THEN
        PERFORM limit_raise_mark(NEW.region, split_part(NEW.scope, '/', 1),
            CASE WHEN NEW.share > 0 THEN OLD.share / NEW.share ELSE 0 END);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER region_share_raise AFTER INSERT OR UPDATE OR DELETE ON region_share
    FOR EACH ROW EXECUTE FUNCTION limit_raise_share();

-- +goose StatementBegin
CREATE FUNCTION limit_raise_region() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM limit_raise_mark('*', '*', 0); -- the others' equal split grows
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER region_raise AFTER DELETE ON region
    FOR EACH ROW EXECUTE FUNCTION limit_raise_region();

-- +goose StatementBegin
CREATE FUNCTION limit_raise_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM limit_raise_mark('*', '*', 0); -- whatever applies now may be larger
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
DROP TRIGGER rate_limit_rule_raise ON rate_limit_rule;
DROP FUNCTION limit_raise_rule();
DROP FUNCTION limit_raise_mark(text, text, double precision);
DROP TABLE limit_raise;
