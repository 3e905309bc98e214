-- The rebalancer's fencing token (docs/rebalancer.md "Leadership and fencing").
-- One row. A rebalancer that takes the election lock (a session advisory lock) increments
-- epoch on the same session and remembers the new value; every rebalancer write checks,
-- in its own transaction, that epoch still has that value (reading the row FOR SHARE, so
-- a takeover's increment waits until the write commits). A rebalancer that lost the lock
-- (its session ended, or was ended by idle_session_timeout while its process was stopped)
-- can therefore not write once another has taken over.

-- +goose Up
CREATE TABLE rebalancer_lease (
    id          integer     PRIMARY KEY DEFAULT 1,
    holder      text        NOT NULL DEFAULT '',
    epoch       bigint      NOT NULL DEFAULT 0,
    acquired_at timestamptz,
    CONSTRAINT rebalancer_lease_one_row CHECK (id = 1)
);
INSERT INTO rebalancer_lease (id) VALUES (1);

-- +goose Down
DROP TABLE rebalancer_lease;
