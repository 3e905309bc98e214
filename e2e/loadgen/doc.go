// Package loadgen drives open-loop, fixed-rate HTTP load (vegeta as a library) at
// gateways on this machine, for the demo, the end-to-end tests and the benchmarks. It
// refuses any target that is not a loopback address, and every run is bounded in time.
//
// It must not import other packages of this module.
package loadgen
