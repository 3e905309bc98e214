// Package job runs the rebalancer: one tick reads the control-plane snapshot (shares,
// rules, live gateways) from the store and offered demand from Prometheus, allocates
// per-region shares for the region totals ("*") and every capped tenant/route pair with
// the pure rebalancer package, and writes the changed shares through the store —
// decreases first, then, one gateway reload period later, increases — with history rows
// holding the inputs. It owns the schedule (gocron v2: the full run every interval and the
// cheap fast-path check every check interval), leader election (a PostgreSQL advisory lock
// as gocron's distributed elector) and the rebalancer's metrics.
//
// A tenant/route pair is one bucket, water-filled. The "*" scope bounds many buckets at
// once and is split in proportion to the offered traffic it governs (the region totals
// minus the pairs with a scope of their own); see docs/rebalancer.md.
// Requests a shadow rule would have rejected were forwarded: they are offered demand and
// count as allowed, never as throttling.
//
// A pair that is not rebalanced (no demand, or not among the capped busiest) for
// Config.ExpireAfterRuns full runs loses its rebalancer rows, with history, and falls back
// to its tenant's or "*"'s share.
//
// A failed read (PostgreSQL or Prometheus down, or the leader lock's PostgreSQL) skips the
// tick and counts it; shares stay as they are until the next tick succeeds.
//
// It imports regions, rebalancer and rebalancer/demand; never gateway or cmd.
package job
