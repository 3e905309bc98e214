-- The rebalancer's leadership lease and fencing token (docs/rebalancer.md "Leadership").
-- One row. A rebalancer leads while it is the holder and expires_at (the database's clock)
-- is in the future; taking the lease over increments epoch. Every rebalancer write renews
-- the lease in its own transaction with
--   UPDATE rebalancer_lease SET expires_at = ... WHERE epoch = $mine AND expires_at > clock_timestamp()
-- and is refused when that updates no row: a leader that was stopped or cut off past its
-- expiry cannot write once another has taken over (its epoch is stale), nor before (the
-- lease has expired).

-- +goose Up
CREATE TABLE rebalancer_lease (
    id         integer     PRIMARY KEY DEFAULT 1,
    holder     text        NOT NULL DEFAULT '',
    epoch      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    CONSTRAINT rebalancer_lease_one_row CHECK (id = 1)
);
INSERT INTO rebalancer_lease (id) VALUES (1);

-- +goose Down
DROP TABLE rebalancer_lease;
