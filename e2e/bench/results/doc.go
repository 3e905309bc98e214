// Package results owns the benchmark figures as data and the documents made from them.
//
// `make bench` (e2e/bench) writes docs/bench/results.json and `make bench-rls`
// (e2e/rlsbench) writes docs/bench/rls.json: every figure, with the median, range and
// per-run values, and what the run was (command, commit, machine, load). From those two
// files alone this package computes every target's verdict (Targets: one row per
// target, its criterion and met / not met / not measured) and renders, with the
// text/templates embedded from templates/, docs/BENCHMARKS.md (whole), the README's
// headline section and docs/proxies.md's RLS section (generated sections,
// internal/gendoc). The prose of those documents lives in the templates, never in Go;
// `go run ./cmd/bench -render` re-renders them, and TestCommittedDocuments checks that
// what is committed is what the committed results render to.
//
// It measures nothing and imports only internal/gendoc, so the programs that measure
// (e2e/bench, e2e/rlsbench) and the test that checks the documents share one model.
package results
