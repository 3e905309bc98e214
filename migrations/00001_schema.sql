-- The control-plane data model (docs/architecture.md; the tables are described in regions/store).
-- Ids are [A-Za-z0-9._-]{1,64}; "*" is allowed only where it means "every tenant/route".
-- double precision columns reject NaN and infinity: in PostgreSQL NaN compares greater than
-- every number, so "x > 0" alone would accept it.

-- +goose Up
CREATE TABLE region (
    name       text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT region_name_syntax CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$')
);

CREATE TABLE rate_limit_rule (
    tenant_id         text             NOT NULL,
    route_id          text             NOT NULL,
    capacity          bigint           NOT NULL,
    refill_per_second double precision NOT NULL,
    shadow            boolean          NOT NULL DEFAULT false,
    shards            integer          NOT NULL DEFAULT 1,
    updated_at        timestamptz      NOT NULL DEFAULT now(),
    CONSTRAINT rate_limit_rule_pkey PRIMARY KEY (tenant_id, route_id),
    CONSTRAINT rate_limit_rule_tenant_syntax CHECK (tenant_id = '*' OR tenant_id ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT rate_limit_rule_route_syntax CHECK (route_id = '*' OR route_id ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT rate_limit_rule_capacity_positive CHECK (capacity > 0),
    CONSTRAINT rate_limit_rule_refill_positive CHECK (refill_per_second > 0 AND refill_per_second < 'Infinity'),
    CONSTRAINT rate_limit_rule_shards_range CHECK (shards BETWEEN 1 AND 1024)
);

CREATE TABLE api_key (
    id         bigserial   PRIMARY KEY,
    key_hash   bytea       NOT NULL,
    tenant_id  text        NOT NULL,
    label      text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    CONSTRAINT api_key_hash_unique UNIQUE (key_hash),
    CONSTRAINT api_key_hash_sha256 CHECK (octet_length(key_hash) = 32),
    CONSTRAINT api_key_tenant_syntax CHECK (tenant_id ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT api_key_label_length CHECK (char_length(label) <= 200)
);
CREATE INDEX api_key_tenant_idx ON api_key (tenant_id);

-- scope: '*' (the region-wide default), 'TENANT' or 'TENANT/ROUTE'.
CREATE TABLE region_share (
    scope      text             NOT NULL,
    region     text             NOT NULL REFERENCES region (name),
    share      double precision NOT NULL,
    source     text             NOT NULL,
    expires_at timestamptz,
    updated_at timestamptz      NOT NULL DEFAULT now(),
    reason     text             NOT NULL DEFAULT '',
    CONSTRAINT region_share_pkey PRIMARY KEY (scope, region, source),
    CONSTRAINT region_share_scope_syntax CHECK (scope = '*' OR scope ~ '^[A-Za-z0-9._-]{1,64}(/[A-Za-z0-9._-]{1,64})?$'),
    CONSTRAINT region_share_range CHECK (share >= 0 AND share <= 1),
    CONSTRAINT region_share_source CHECK (source IN ('rebalancer', 'override')),
    CONSTRAINT region_share_expiry_override_only CHECK (expires_at IS NULL OR source = 'override')
);
CREATE INDEX region_share_region_idx ON region_share (region);

-- One row per change of one region_share row, written by a trigger (migration 00003_triggers).
-- old_share is NULL for an insert, new_share NULL for a delete. region has no foreign key:
-- history outlives the regions it mentions.
CREATE TABLE region_share_history (
    id         bigserial        PRIMARY KEY,
    at         timestamptz      NOT NULL DEFAULT now(),
    scope      text             NOT NULL,
    region     text             NOT NULL,
    source     text             NOT NULL,
    old_share  double precision,
    new_share  double precision,
    expires_at timestamptz,
    actor      text             NOT NULL,
    reason     text             NOT NULL DEFAULT '',
    inputs     jsonb,
    CONSTRAINT region_share_history_source CHECK (source IN ('rebalancer', 'override'))
);
CREATE INDEX region_share_history_scope_at_idx ON region_share_history (scope, at);
CREATE INDEX region_share_history_at_idx ON region_share_history (at);

-- Heartbeats. No foreign key to region: a gateway may heartbeat before its region is added,
-- and removing a region must not wait for its gateways to expire.
CREATE TABLE gateway_instance (
    id        text        PRIMARY KEY,
    region    text        NOT NULL,
    last_seen timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT gateway_instance_id_syntax CHECK (id ~ '^[A-Za-z0-9._-]{1,64}$'),
    CONSTRAINT gateway_instance_region_syntax CHECK (region ~ '^[A-Za-z0-9._-]{1,64}$')
);

-- Who changed a rule, key or region, when and why (written by a trigger, migration 00003_triggers).
CREATE TABLE audit_log (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text        NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    object     text        NOT NULL,
    action     text        NOT NULL,
    old        jsonb,
    new        jsonb,
    CONSTRAINT audit_log_action CHECK (action IN ('insert', 'update', 'delete'))
);
CREATE INDEX audit_log_at_idx ON audit_log (at);

-- +goose Down
DROP TABLE audit_log;
DROP TABLE gateway_instance;
DROP TABLE region_share_history;
DROP TABLE region_share;
DROP TABLE api_key;
DROP TABLE rate_limit_rule;
DROP TABLE region;
