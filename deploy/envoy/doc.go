// Package envoy holds the Envoy example (envoy.yaml) for the gateway's rate-limit service
// and the test that checks it against Envoy's own API types; rlsbench measures that
// service. It is deployment material: nothing imports it.
package envoy
