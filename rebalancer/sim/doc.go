// Package sim replays a demand trace against a share policy and measures what one
// global token bucket per tenant would have done differently: the evidence that the
// rebalancer's water-filling beats the obvious policies. It backs `ratectl sim`.
//
// The model: 1 s steps; one token bucket per tenant per region, scaled by the region's
// share with regions.Scale; the policy sees each region's allowed and throttled counters
// through a scrape lag (30 s) and a gateway heartbeat; a write reaches the gateways
// within the apply delay (20 s) — an increase after 1 s, a decrease only at the end of
// the delay, the worst order a fleet can see. The waterfill policy calls the production
// rebalancer.Decide (so Allocate, the fast path, the hysteresis and shrink-before-grow);
// the baselines are proportional-offered, proportional-allowed and static shares.
//
// It imports rebalancer and regions only; it does no I/O beyond the io.Reader and
// io.Writer it is given, and reads no clock.
package sim
