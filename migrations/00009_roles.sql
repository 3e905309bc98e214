-- Least privilege (issue 25): one group role per component, granted what that component
-- does and nothing more, and an audit trail nobody connected as one of them can forge or
-- erase. docs/SECURITY.md says which login role each component connects as.
--
--   quotaplane_gateway     reads the snapshot (regions, rules, keys, shares, raise markers,
--                          instances) and writes its own heartbeat row (gateway_instance).
--   quotaplane_rebalancer  reads the snapshot without keys, writes the region_share rows of
--                          source rebalancer (and deletes expired overrides, recording them
--                          in audit_log), takes the lease (rebalancer_lease), reads history.
--   quotaplane_operator    ratectl: rules, keys, regions and shares; reads everything.
--
-- The roles are NOLOGIN groups: each component connects as a login role of its own that
-- is a member of one (deploy/compose/roles.sql). Roles belong to the cluster, not the
-- database, so they may exist already (another database of the cluster, a second run):
-- they are created only when missing, and the down migration revokes this database's
-- grants but leaves the roles.
--
-- Append-only for everyone, the tables' owner included: audit_log and region_share_history
-- refuse UPDATE, DELETE and TRUNCATE by statement triggers, and nobody is granted them.
-- TRUNCATE of rate_limit_rule, api_key, region and region_share is refused too (it fires no
-- row trigger, so it would leave no audit row, and would take the default rule with it).
--
-- The actor of every audit and history row is the role that connected (session_user),
-- stamped by a BEFORE INSERT trigger whatever the writer put there; the name a tool gives
-- (ratectl --actor, the rebalancer's "rebalancer", set as quotaplane.on_behalf_of or the
-- older quotaplane.actor) is kept beside it as on_behalf_of. Only the owner of the schema
-- (the role that runs the migrations) or a superuser, who can disable triggers anyway,
-- may still name the actor: single-role installations keep their audit trail as it was.
--
-- The triggers that write audit_log, region_share_history and limit_raise run as the
-- owner (SECURITY DEFINER, with a fixed search_path), so no caller needs a grant on those
-- tables; the helpers they call are not executable by PUBLIC.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['quotaplane_gateway', 'quotaplane_rebalancer', 'quotaplane_operator'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        EXCEPTION
            -- Another database of the cluster migrating at the same moment created it.
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'role % does not exist and % may not create roles', r, current_user
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'create the group roles once as a role with CREATEROLE (CREATE ROLE quotaplane_gateway NOLOGIN; CREATE ROLE quotaplane_rebalancer NOLOGIN; CREATE ROLE quotaplane_operator NOLOGIN), then migrate again; see docs/SECURITY.md';
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

ALTER TABLE audit_log ADD COLUMN on_behalf_of text;
ALTER TABLE region_share_history ADD COLUMN on_behalf_of text;

-- Every row of audit_log and region_share_history, written by a trigger (audit_write,
-- region_share_history_write: their actor is quotaplane_actor(), as in 00003) or inserted
-- directly (store.ExpireOverrides does), names the connected role and the time of the
-- write; the name the writer gives is on_behalf_of. Only the owner of the table (the
-- migrating role) or a superuser may name the actor. One query per row, no helper calls:
-- this runs for each of the 100k rows of a bulk rule insert.
-- +goose StatementBegin
CREATE FUNCTION quotaplane_stamp_actor() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_for   text := coalesce(nullif(current_setting('quotaplane.on_behalf_of', true), ''),
                             nullif(current_setting('quotaplane.actor', true), ''));
    v_names boolean;
BEGIN
    SELECT r.rolsuper OR r.oid = c.relowner INTO v_names
        FROM pg_roles r, pg_class c WHERE r.rolname = session_user AND c.oid = TG_RELID;
    NEW.on_behalf_of := coalesce(v_for, NEW.on_behalf_of);
    IF coalesce(v_names, false) THEN
        NEW.actor := coalesce(v_for, NEW.actor, session_user::text);
    ELSE
        NEW.actor := session_user::text;
        NEW.at := now();
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER audit_log_stamp_actor BEFORE INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION quotaplane_stamp_actor();
CREATE TRIGGER region_share_history_stamp_actor BEFORE INSERT ON region_share_history
    FOR EACH ROW EXECUTE FUNCTION quotaplane_stamp_actor();

-- +goose StatementBegin
CREATE FUNCTION quotaplane_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'audit and share history rows are never changed or removed (docs/SECURITY.md)';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_append_only();
CREATE TRIGGER region_share_history_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON region_share_history
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_append_only();

-- +goose StatementBegin
CREATE FUNCTION quotaplane_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'TRUNCATE % refused: it would leave no audit or history row%', TG_TABLE_NAME,
        CASE WHEN TG_TABLE_NAME = 'rate_limit_rule' THEN ' and remove the default rule' ELSE '' END
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'DELETE the rows instead (ratectl rules delete, keys revoke, regions remove, shares clear): each is audited';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rate_limit_rule_refuse_truncate BEFORE TRUNCATE ON rate_limit_rule
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_refuse_truncate();
CREATE TRIGGER api_key_refuse_truncate BEFORE TRUNCATE ON api_key
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_refuse_truncate();
CREATE TRIGGER region_refuse_truncate BEFORE TRUNCATE ON region
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_refuse_truncate();
CREATE TRIGGER region_share_refuse_truncate BEFORE TRUNCATE ON region_share
    FOR EACH STATEMENT EXECUTE FUNCTION quotaplane_refuse_truncate();

-- The writing triggers run as the owner, with this schema first and pg_temp last (so a
-- caller's temporary table cannot stand in for one of ours).
-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['audit_write()', 'region_share_history_write()', 'limit_raise_rule()',
        'limit_raise_share()', 'limit_raise_region()', 'limit_raise_truncate()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    -- The stamp runs as the caller, but with this search_path: a caller's own function
    -- or operator earlier in its search_path would forge the actor.
    EXECUTE format('ALTER FUNCTION quotaplane_stamp_actor() SET search_path = %I, pg_temp', current_schema());
    FOREACH f IN ARRAY ARRAY['audit_write()', 'region_share_history_write()', 'limit_raise_rule()',
        'limit_raise_share()', 'limit_raise_region()', 'limit_raise_truncate()', 'quotaplane_notify()',
        'rate_limit_rule_keep_default()', 'quotaplane_stamp_actor()', 'quotaplane_append_only()',
        'quotaplane_refuse_truncate()', 'limit_raise_acked(text, xid8)',
        'limit_raise_mark(text, text, text, double precision, double precision, timestamptz)',
        'limit_raise_rule_capacity(text, text, text, text)'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- Grants. Sequences: api_key ids (operator) and audit_log ids (the direct insert of
-- expired overrides). LOCK TABLE region IN SHARE MODE, which every share writer
-- takes, needs UPDATE, DELETE or TRUNCATE on region: the rebalancer gets TRUNCATE, which
-- the trigger above refuses, rather than a right to change regions.
GRANT SELECT ON region, rate_limit_rule, api_key, region_share, limit_raise, gateway_instance TO quotaplane_gateway;
GRANT INSERT, UPDATE, DELETE ON gateway_instance TO quotaplane_gateway;

GRANT SELECT ON region, rate_limit_rule, region_share, limit_raise, gateway_instance, rebalancer_lease,
    region_share_history TO quotaplane_rebalancer;
GRANT INSERT, UPDATE, DELETE ON region_share TO quotaplane_rebalancer;
GRANT INSERT, UPDATE ON rebalancer_lease TO quotaplane_rebalancer;
GRANT INSERT ON audit_log TO quotaplane_rebalancer;
GRANT USAGE ON SEQUENCE audit_log_id_seq TO quotaplane_rebalancer;
GRANT TRUNCATE ON region TO quotaplane_rebalancer;

GRANT SELECT ON region, rate_limit_rule, api_key, region_share, limit_raise, gateway_instance, rebalancer_lease,
    region_share_history, audit_log, goose_db_version TO quotaplane_operator;
GRANT INSERT, UPDATE, DELETE ON region, rate_limit_rule, api_key, region_share TO quotaplane_operator;
GRANT USAGE ON SEQUENCE api_key_id_seq TO quotaplane_operator;
-- store.ExpireOverrides records the overrides it deletes in audit_log itself; ratectl may
-- run it too. The stamp trigger makes such a row name the connected role, now.
GRANT INSERT ON audit_log TO quotaplane_operator;
GRANT USAGE ON SEQUENCE audit_log_id_seq TO quotaplane_operator;

-- The rebalancer writes its own rows only; it deletes an override only once expired.
ALTER TABLE region_share ENABLE ROW LEVEL SECURITY;
CREATE POLICY region_share_read ON region_share FOR SELECT
    TO quotaplane_gateway, quotaplane_rebalancer, quotaplane_operator USING (true);
CREATE POLICY region_share_operator ON region_share FOR ALL TO quotaplane_operator USING (true) WITH CHECK (true);
CREATE POLICY region_share_rebalancer_insert ON region_share FOR INSERT TO quotaplane_rebalancer
    WITH CHECK (source = 'rebalancer');
CREATE POLICY region_share_rebalancer_update ON region_share FOR UPDATE TO quotaplane_rebalancer
    USING (source = 'rebalancer') WITH CHECK (source = 'rebalancer');
CREATE POLICY region_share_rebalancer_delete ON region_share FOR DELETE TO quotaplane_rebalancer
    USING (source = 'rebalancer' OR (source = 'override' AND expires_at <= now()));

-- +goose Down
DROP POLICY region_share_rebalancer_delete ON region_share;
DROP POLICY region_share_rebalancer_update ON region_share;
DROP POLICY region_share_rebalancer_insert ON region_share;
DROP POLICY region_share_operator ON region_share;
DROP POLICY region_share_read ON region_share;
ALTER TABLE region_share DISABLE ROW LEVEL SECURITY;

-- +goose StatementBegin
DO $$
DECLARE
    r text;
    f text;
BEGIN
    FOREACH r IN ARRAY ARRAY['quotaplane_gateway', 'quotaplane_rebalancer', 'quotaplane_operator'] LOOP
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r);
        EXECUTE format('REVOKE ALL ON region, rate_limit_rule, api_key, region_share, limit_raise, gateway_instance, '
            'rebalancer_lease, region_share_history, audit_log, goose_db_version FROM %I', r);
        EXECUTE format('REVOKE ALL ON SEQUENCE audit_log_id_seq, api_key_id_seq FROM %I', r);
    END LOOP;
    FOREACH f IN ARRAY ARRAY['audit_write()', 'region_share_history_write()', 'limit_raise_rule()',
        'limit_raise_share()', 'limit_raise_region()', 'limit_raise_truncate()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY INVOKER RESET search_path', f);
    END LOOP;
    FOREACH f IN ARRAY ARRAY['audit_write()', 'region_share_history_write()', 'limit_raise_rule()',
        'limit_raise_share()', 'limit_raise_region()', 'limit_raise_truncate()', 'quotaplane_notify()',
        'rate_limit_rule_keep_default()', 'limit_raise_acked(text, xid8)',
        'limit_raise_mark(text, text, text, double precision, double precision, timestamptz)',
        'limit_raise_rule_capacity(text, text, text, text)'] LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

DROP TRIGGER region_share_refuse_truncate ON region_share;
DROP TRIGGER region_refuse_truncate ON region;
DROP TRIGGER api_key_refuse_truncate ON api_key;
DROP TRIGGER rate_limit_rule_refuse_truncate ON rate_limit_rule;
DROP FUNCTION quotaplane_refuse_truncate();
DROP TRIGGER region_share_history_append_only ON region_share_history;
DROP TRIGGER audit_log_append_only ON audit_log;
DROP FUNCTION quotaplane_append_only();
DROP TRIGGER region_share_history_stamp_actor ON region_share_history;
DROP TRIGGER audit_log_stamp_actor ON audit_log;
DROP FUNCTION quotaplane_stamp_actor();


ALTER TABLE region_share_history DROP COLUMN on_behalf_of;
ALTER TABLE audit_log DROP COLUMN on_behalf_of;
