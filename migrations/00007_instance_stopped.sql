-- A gateway that stops cleanly marks its heartbeat row stopped instead of deleting it
-- (issue 22). Its region's other gateways stop counting it in their fallback share at
-- once (the loader skips stopped rows), but the region does not look dark to the
-- rebalancer while the stopped row's heartbeat is within the instance TTL: a region whose
-- gateways restart together keeps its shares. The next heartbeat of the same id clears
-- the mark; rows unseen for an hour are pruned as before.

-- +goose Up
ALTER TABLE gateway_instance ADD COLUMN stopped_at timestamptz;

-- +goose Down
DELETE FROM gateway_instance WHERE stopped_at IS NOT NULL;
ALTER TABLE gateway_instance DROP COLUMN stopped_at;
