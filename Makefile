# Every target runs on a fresh Debian machine with Go: missing servers are installed first.
GO       ?= go
DURATION ?=
TIMEOUT  ?= 20m
# Seconds each fuzz target runs: short in `make test`, longer with `make fuzz`.
FUZZTIME ?= 20s
# Everything but the fault-injection suite runs under -race; the fault suite measures
# latency and admission across real processes, which -race would only slow down.
RACE_PKGS = $(shell $(GO) list ./... | grep -v -e /deploy/faults -e /deploy/torture)
# Seeds `make torture` runs (each about 2.5 min).
SEEDS ?= 20

.PHONY: test demo bench lint deps unit faults reliability-figures torture soak fuzz fuzz-run

deps:
	@./deploy/install-deps.sh

## test: lint, every test against real servers (-race), the render test, the fault
## suite, the torture checker (its fixed scenarios and two seeds, about 5 min), and every
## fuzz target for a few seconds.
test: deps lint
	$(GO) test -race -count=1 -timeout $(TIMEOUT) $(RACE_PKGS)
	cd deploy/render && $(GO) test -count=1 ./...
	$(GO) test -count=1 -timeout 15m ./deploy/faults/
	$(GO) test -count=1 -timeout 10m ./deploy/torture/ -seeds 2
	$(MAKE) --no-print-directory fuzz-run FUZZTIME=3s

## unit: the pure packages only (no servers): allocation and simulator.
unit:
	$(GO) test -race -count=1 ./rebalancer ./rebalancer/sim

## lint: gofmt, go vet (both modules).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd deploy/render && $(GO) vet ./...

## faults: fault injection over the two-region stack (about 2-3 min, without -race).
faults: deps
	$(GO) test -count=1 -timeout 15m ./deploy/faults/

## reliability-figures: rerun the faults and rewrite the table in docs/reliability.md.
reliability-figures: deps
	$(GO) test -count=1 -timeout 15m -run TestFaults ./deploy/faults/ -update

## torture: the randomized fault-and-change checker over SEEDS seeds (default 20, about
## 2.5 min each) and its fixed scenarios; rewrites its table in docs/reliability.md.
## One seed: go test -count=1 -run 'TestTorture/seed=N$$' ./deploy/torture/ -seed N
torture: deps
	$(GO) test -count=1 -timeout $$(( $(SEEDS) * 3 + 10 ))m -run TestTorture ./deploy/torture/ -seeds $(SEEDS) -update

## soak: 10 minutes at a fixed rate with periodic faults (not in CI).
soak: deps
	$(GO) run ./deploy/faults/soak -duration 10m

## fuzz: every fuzz target for FUZZTIME each (default 20s).
fuzz: deps fuzz-run

fuzz-run:
	$(GO) test -run '^$$' -fuzz '^FuzzAPIKeyHeader$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzClientAddr$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzLuaArguments$$' -fuzztime $(FUZZTIME) ./deploy/faults/
	$(GO) test -run '^$$' -fuzz '^FuzzValidateID$$' -fuzztime $(FUZZTIME) ./regions/
	$(GO) test -run '^$$' -fuzz '^FuzzParseScope$$' -fuzztime $(FUZZTIME) ./regions/
	$(GO) test -run '^$$' -fuzz '^FuzzParseShares$$' -fuzztime $(FUZZTIME) ./cmd/ratectl/
	$(GO) test -run '^$$' -fuzz '^FuzzParseTrace$$' -fuzztime $(FUZZTIME) ./rebalancer/sim/
	$(GO) test -run '^$$' -fuzz '^FuzzAllocate$$' -fuzztime $(FUZZTIME) ./rebalancer/

## bench: the benchmark suite (about 12 min); rewrites docs/BENCHMARKS.md and the README headline.
bench: deps
	$(GO) run ./deploy/bench -runs 3

## demo: the local two-region stack (see README); DURATION=60s runs unattended.
demo: deps
	$(GO) run ./cmd/demo $(if $(DURATION),--duration $(DURATION))
