// Package figures reads the live per-region figures that the rebalancer's status page
// and `ratectl status` show, from the gateways' metrics in Prometheus: the offered
// request rates (allowed, throttled, shadow_throttled), whether a gateway decides on its
// local fallback, the live gateways as they count themselves, the age of the oldest
// successful rule reload and the share the gateways enforce; and it names a region's
// state from them (State). Both readers use it, so they show the same figures.
//
// It owns the PromQL of those figures and of the page's charts; the offered rates are
// rebalancer/demand's own query. A regional source (one Prometheus per region) is asked
// for its region's series only. It says nothing about liveness: "no-data" means
// Prometheus holds no series of a region; a dark region is decided by its heartbeats
// alone (store.RegionDark).
//
// It imports rebalancer/demand and the Prometheus HTTP API client only; never the store,
// the status page, gateway or cmd.
package figures
