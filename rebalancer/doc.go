// Package rebalancer owns the allocation: how one scope's global limit is split into
// per-region shares from the demand each region offers. It is pure — no I/O, no clock
// read, no goroutines: every input, including the time and the decaying peak state,
// is passed in, and the new state is returned.
//
// One tick of the rebalancer, for one scope, is
//
//	d, err := rebalancer.Decide(cfg, limit, now, inputs, state, rebalancer.FullRun)
//	state = d.Allocation.State // always keep it, written or not
//	if d.Write {
//		write d.First (the decreases); wait one gateway reload period;
//		write d.Second (the increases)
//	}
//
// where full is true on the interval tick (default 5 min) and false on the cheaper check
// tick (default 1 min), which writes only when [FastPathTrigger] fires. Decide is
// [Allocate], then [FastPathTrigger] (check ticks), [ShouldWrite] (hysteresis) and
// [Plan] (shrink before grow); the parts are exported for callers that need them apart.
// The simulator in rebalancer/sim drives exactly this loop.
//
// Subpackages: demand (the Prometheus source), job (the scheduled job) and sim (the
// trace simulator). This package imports regions only; never gateway, cmd, a database
// or a Prometheus client.
package rebalancer
