// Package stack runs the local multi-region stack: one PostgreSQL, one Redis per region,
// real gateway processes per region, an upstream echo service, Prometheus scraping
// everything and the rebalancer process, all on free loopback ports with throwaway
// data. `make demo` (cmd/demo) and the end-to-end tests run this same code.
//
// It builds and runs the binaries of cmd/, so it needs the Go toolchain and the module's
// source; it must not be imported by gateway, regions or rebalancer.
package stack
