// Package faults injects faults into the two-region stack (e2e/stack) under steady
// load and measures what the contract of DESIGN.md "Failure behaviour" promises: no 5xx,
// decision latency bounded by the Redis timeout, cluster-wide admission within the exact
// token-bucket bound, recovery to Redis decisions within the breaker's interval, and no
// control-plane row lost or duplicated. The faults and measurements are in the package
// so that the tests (faults_test.go, whose figures go to docs/reliability.md) and the
// soak program (cmd/soak) share them.
//
// Everything runs on real servers on loopback addresses, in bounded time. It imports
// e2e/stack, internal/testenv, e2e/loadgen, regions and lua; nothing imports it.
package faults
