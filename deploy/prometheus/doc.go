// Package prometheus holds quotaplane's Prometheus recording rules and alerts (rules.yml)
// and their promtool unit tests (rules_test.yml). It has no Go API: its Go test runs
// `promtool check rules` and `promtool test rules` so that `make test` covers them.
package prometheus
