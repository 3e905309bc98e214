-- The database accepts exactly the ids regions.ValidateID accepts: "_other" is reserved
-- for metrics (the series that folds untracked tenants and routes), so it is no tenant or
-- route id. Before this migration the CHECKs accepted it, and one such row made every
-- snapshot load fail. The character set and length were already the same
-- ([A-Za-z0-9._-]{1,64}, ASCII only, so characters and bytes agree).
--
-- Existing offending rows stop the migration with an error naming every one of them:
-- delete them first (ratectl rules delete / keys revoke / shares clear --raw-scope accept
-- any id the database holds), then migrate again. Until then the loader skips them.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(what, '; ' ORDER BY what) INTO bad FROM (
        SELECT format('rate_limit_rule tenant=%s route=%s', tenant_id, route_id) AS what
            FROM rate_limit_rule WHERE tenant_id = '_other' OR route_id = '_other'
        UNION ALL
        SELECT format('api_key id=%s tenant=%s', id, tenant_id)
            FROM api_key WHERE tenant_id = '_other'
        UNION ALL
        SELECT format('region_share scope=%s region=%s source=%s', scope, region, source)
            FROM region_share WHERE split_part(scope, '/', 1) = '_other' OR split_part(scope, '/', 2) = '_other'
    ) b;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'rows use the reserved id _other; delete them and migrate again: %', bad
            USING ERRCODE = 'check_violation';
    END IF;
END
$$;
-- +goose StatementEnd

ALTER TABLE rate_limit_rule
    ADD CONSTRAINT rate_limit_rule_tenant_reserved CHECK (tenant_id <> '_other'),
    ADD CONSTRAINT rate_limit_rule_route_reserved CHECK (route_id <> '_other');
ALTER TABLE api_key
    ADD CONSTRAINT api_key_tenant_reserved CHECK (tenant_id <> '_other');
ALTER TABLE region_share
    ADD CONSTRAINT region_share_scope_reserved
        CHECK (split_part(scope, '/', 1) <> '_other' AND split_part(scope, '/', 2) <> '_other');

-- +goose Down
ALTER TABLE region_share DROP CONSTRAINT region_share_scope_reserved;
ALTER TABLE api_key DROP CONSTRAINT api_key_tenant_reserved;
ALTER TABLE rate_limit_rule
    DROP CONSTRAINT rate_limit_rule_route_reserved,
    DROP CONSTRAINT rate_limit_rule_tenant_reserved;
