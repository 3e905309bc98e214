-- The default rule (tenant *, route *): every tenant without a rule of its own gets it.
-- A snapshot without it is invalid, so migration 3 forbids deleting it.

-- +goose Up
INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second)
VALUES ('*', '*', 20, 10)
ON CONFLICT (tenant_id, route_id) DO NOTHING;

-- +goose Down
DELETE FROM rate_limit_rule WHERE tenant_id = '*' AND route_id = '*';
