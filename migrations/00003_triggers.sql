-- Change notification, share history and audit, all enforced by the database so that a
-- change made with plain SQL is announced and recorded like one made through the store.
--
-- Writers name themselves with transaction-local settings:
--   SELECT set_config('quotaplane.actor', 'alice', true),
--          set_config('quotaplane.reason', 'incident 42', true),
--          set_config('quotaplane.inputs', '{"demand": ...}', true);
-- Without them the actor is the database role and the reason is empty.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION quotaplane_actor() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('quotaplane.actor', true), ''), session_user::text)
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION quotaplane_reason() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('quotaplane.reason', true), '')
$$;
-- +goose StatementEnd

-- One channel for every change gateways care about; statement-level, so a bulk change is one
-- notification (PostgreSQL also folds identical notifications of one transaction).
-- gateway_instance has no such trigger: heartbeats would make every gateway reload every few
-- seconds; instance counts are picked up by the timer reload.
-- +goose StatementBegin
CREATE FUNCTION quotaplane_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ratelimit_config', TG_TABLE_NAME);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limit_rule
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_notify();
CREATE TRIGGER api_key_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_key
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_notify();
CREATE TRIGGER region_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON region
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_notify();
CREATE TRIGGER region_share_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON region_share
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_notify();

-- Every change of a share leaves a history row. An update that changes neither the share nor
-- the expiry (a rebalancer rewriting the same value) leaves none.
-- +goose StatementBegin
CREATE FUNCTION region_share_history_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_inputs jsonb := nullif(current_setting('quotaplane.inputs', true), '')::jsonb;
    v_reason text := quotaplane_reason();
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.scope = NEW.scope AND OLD.region = NEW.region AND OLD.source = NEW.source
        AND OLD.share = NEW.share AND OLD.expires_at IS NOT DISTINCT FROM NEW.expires_at THEN
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF TG_OP = 'DELETE' OR OLD.scope <> NEW.scope OR OLD.region <> NEW.region OR OLD.source <> NEW.source THEN
            -- The old row is gone (deleted, or moved to another key).
            INSERT INTO region_share_history (scope, region, source, old_share, new_share, expires_at, actor, reason, inputs)
            VALUES (OLD.scope, OLD.region, OLD.source, OLD.share, NULL, OLD.expires_at, quotaplane_actor(), coalesce(v_reason, ''), v_inputs);
            IF TG_OP = 'DELETE' THEN
                RETURN NULL;
            END IF;
        ELSE
            INSERT INTO region_share_history (scope, region, source, old_share, new_share, expires_at, actor, reason, inputs)
            VALUES (NEW.scope, NEW.region, NEW.source, OLD.share, NEW.share, NEW.expires_at, quotaplane_actor(), coalesce(v_reason, NEW.reason), v_inputs);
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO region_share_history (scope, region, source, old_share, new_share, expires_at, actor, reason, inputs)
    VALUES (NEW.scope, NEW.region, NEW.source, NULL, NEW.share, NEW.expires_at, quotaplane_actor(), coalesce(v_reason, NEW.reason), v_inputs);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER region_share_history AFTER INSERT OR UPDATE OR DELETE ON region_share
    FOR EACH ROW EXECUTE FUNCTION region_share_history_write();

-- Every change of a rule, key or region leaves an audit row (key hashes are left out).
-- +goose StatementBegin
CREATE FUNCTION audit_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_old jsonb;
    v_new jsonb;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        v_old := to_jsonb(OLD) - 'key_hash';
    END IF;
    IF TG_OP <> 'DELETE' THEN
        v_new := to_jsonb(NEW) - 'key_hash';
    END IF;
    IF TG_OP = 'UPDATE' AND v_old = v_new THEN
        RETURN NULL;
    END IF;
    INSERT INTO audit_log (actor, reason, object, action, old, new)
    VALUES (quotaplane_actor(), coalesce(quotaplane_reason(), ''), TG_TABLE_NAME, lower(TG_OP), v_old, v_new);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_audit AFTER INSERT OR UPDATE OR DELETE ON rate_limit_rule
    FOR EACH ROW EXECUTE FUNCTION audit_write();
CREATE TRIGGER api_key_audit AFTER INSERT OR UPDATE OR DELETE ON api_key
    FOR EACH ROW EXECUTE FUNCTION audit_write();
CREATE TRIGGER region_audit AFTER INSERT OR UPDATE OR DELETE ON region
    FOR EACH ROW EXECUTE FUNCTION audit_write();

-- A snapshot without the default rule is invalid (every gateway would keep its old one
-- forever, and a new gateway could not start), so it may be changed but not removed.
-- +goose StatementBegin
CREATE FUNCTION rate_limit_rule_keep_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.tenant_id = '*' AND OLD.route_id = '*'
        AND (TG_OP = 'DELETE' OR NEW.tenant_id <> '*' OR NEW.route_id <> '*') THEN
        RAISE EXCEPTION 'the default rule (tenant *, route *) cannot be removed; change it instead'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'rate_limit_rule_keep_default';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_keep_default BEFORE UPDATE OR DELETE ON rate_limit_rule
    FOR EACH ROW EXECUTE FUNCTION rate_limit_rule_keep_default();

-- +goose Down
DROP TRIGGER rate_limit_rule_keep_default ON rate_limit_rule;
DROP TRIGGER region_audit ON region;
DROP TRIGGER api_key_audit ON api_key;
DROP TRIGGER rate_limit_rule_audit ON rate_limit_rule;
DROP TRIGGER region_share_history ON region_share;
DROP TRIGGER region_share_notify ON region_share;
DROP TRIGGER region_notify ON region;
DROP TRIGGER api_key_notify ON api_key;
DROP TRIGGER rate_limit_rule_notify ON rate_limit_rule;
DROP FUNCTION rate_limit_rule_keep_default();
DROP FUNCTION audit_write();
DROP FUNCTION region_share_history_write();
DROP FUNCTION quotaplane_notify();
DROP FUNCTION quotaplane_reason();
DROP FUNCTION quotaplane_actor();
