-- The compose stack's login roles, one per component, each a member of the group role
-- migration 00009 created (docs/SECURITY.md). Run by the `roles` service after `migrate`,
-- as the database owner; safe to run again (existing roles keep their passwords).
--
-- The passwords are placeholders, like the owner's in compose.yaml: a local stack whose
-- ports are bound to loopback. In production create the roles with your own passwords (or
-- certificate or IAM authentication) and give each component only its own URL.
\set ON_ERROR_STOP on

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM (VALUES
        ('quotaplane_gateway_login', 'quotaplane_gateway', 'gateway'),
        ('quotaplane_rebalancer_login', 'quotaplane_rebalancer', 'rebalancer'),
        ('quotaplane_ratectl_login', 'quotaplane_operator', 'ratectl')
    ) AS v(login, grp, password) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r.login) THEN
            EXECUTE format('CREATE ROLE %I LOGIN PASSWORD %L', r.login, r.password);
        END IF;
        EXECUTE format('GRANT %I TO %I', r.grp, r.login);
    END LOOP;
END
$$;
