-- Capacity and refill have upper bounds, the same as regions.MaxCapacity (1e15 tokens)
-- and regions.MaxRefillPerSecond (1e12 tokens per second): the bucket's Lua maths is
-- exact below them, and the gateway refuses a rule above them (before this migration the
-- database accepted one, which the limiter then could not decide). "Unlimited" is not a
-- number: set a rule at the bound.
--
-- Existing offending rows stop the migration with an error naming every one of them:
-- lower or delete them first (ratectl rules set / rules delete), then migrate again.
-- Until then the loader skips them.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(format('rate_limit_rule tenant=%s route=%s capacity=%s refill_per_second=%s',
            tenant_id, route_id, capacity, refill_per_second), '; ' ORDER BY tenant_id, route_id) INTO bad
        FROM rate_limit_rule
        WHERE capacity > 1000000000000000 OR refill_per_second > 1000000000000;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'rules above the bounds (capacity 1e15, refill_per_second 1e12); lower them and migrate again: %', bad
            USING ERRCODE = 'check_violation';
    END IF;
END
$$;
-- +goose StatementEnd

ALTER TABLE rate_limit_rule
    ADD CONSTRAINT rate_limit_rule_capacity_bound CHECK (capacity <= 1000000000000000),
    ADD CONSTRAINT rate_limit_rule_refill_bound CHECK (refill_per_second <= 1000000000000);

-- +goose Down
ALTER TABLE rate_limit_rule
    DROP CONSTRAINT rate_limit_rule_refill_bound,
    DROP CONSTRAINT rate_limit_rule_capacity_bound;
