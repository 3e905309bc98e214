# Every target runs on a fresh Debian machine with Go: missing servers are installed first.
GO       ?= go
DURATION ?=
TIMEOUT  ?= 20m
# Seconds each fuzz target runs: short in `make test`, longer with `make fuzz`.
FUZZTIME ?= 20s
# Everything but the fault-injection suite runs under -race; the fault suite measures
# latency and admission across real processes, which -race would only slow down.
RACE_PKGS = $(shell $(GO) list ./... | grep -v -e /e2e/faults -e /e2e/image -e /e2e/torture)
# Seeds `make torture` runs (each about 1.5 min).
SEEDS ?= 20
# make image: the registry, tag and build-stage image (see deploy/image/build.sh).
REGISTRY ?= ghcr.io/quotaplane
TAG      ?= 0.1.0
GO_IMAGE ?=

.PHONY: test demo bench bench-rls bench-render lint deps unit faults reliability-figures torture soak fuzz fuzz-run image image-test build

# Version stamp of `make build` (the images stamp the same in the Dockerfile).
VERSION_PKG = github.com/quotaplane/quotaplane/internal/version
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  = -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(shell git rev-parse HEAD 2>/dev/null) -X $(VERSION_PKG).date=$(shell date -u +%Y-%m-%dT%H:%M:%SZ)

## build: the gateway, rebalancer and ratectl binaries in bin/, static and version-stamped.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/ ./cmd/gateway ./cmd/rebalancer ./cmd/ratectl

deps:
	@./deploy/install-deps.sh

## test: lint, every test against real servers (-race), the render test, the fault
## suite, the torture checker (its fixed scenarios and two seeds, about 5.5 min), and every
## fuzz target for a few seconds.
test: deps lint
	$(GO) test -race -count=1 -timeout $(TIMEOUT) $(RACE_PKGS)
	cd deploy/render && $(GO) test -count=1 ./...
	$(GO) test -count=1 -timeout 15m ./e2e/faults/
	$(GO) test -count=1 -timeout 10m ./e2e/torture/ -seeds 2
	$(MAKE) --no-print-directory fuzz-run FUZZTIME=3s
	$(MAKE) --no-print-directory image-test

## image: the gateway, rebalancer and ratectl images ($(REGISTRY)/NAME:$(TAG)) with docker,
## podman or buildah, whichever is present; GO_IMAGE=local builds without registry access.
image:
	REGISTRY=$(REGISTRY) TAG=$(TAG) GO_IMAGE=$(GO_IMAGE) ./deploy/image/build.sh

## image-test: build the gateway image with buildah (from the local Go toolchain, so no
## registry is needed) and run it against a test Redis and PostgreSQL (about 4 min: a cold
## build each time, on a buildah storage of its own that is removed, images, build stage
## and caches with it, so it leaves nothing behind). The Go modules come from GOPROXY.
image-test: deps
	$(GO) test -count=1 -timeout 20m ./e2e/image/

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
	$(GO) test -count=1 -timeout 15m ./e2e/faults/

## reliability-figures: rerun the faults and rewrite the table in docs/reliability.md.
reliability-figures: deps
	$(GO) test -count=1 -timeout 15m -run TestFaults ./e2e/faults/ -update

## torture: the randomized fault-and-change checker over SEEDS seeds (default 20, about
## 1.5 min each) and its eight fixed scenarios (about 3 min); rewrites its table in
## docs/reliability.md.
## One seed: go test -count=1 -run 'TestTorture/seed=N$$' ./e2e/torture/ -seed N
torture: deps
	$(GO) test -count=1 -timeout $$(( $(SEEDS) * 3 + 10 ))m -run TestTorture ./e2e/torture/ -seeds $(SEEDS) -update

## soak: 10 minutes at a fixed rate with periodic faults (not in CI).
soak: deps
	$(GO) run ./cmd/soak -duration 10m

## fuzz: every fuzz target for FUZZTIME each (default 20s).
fuzz: deps fuzz-run

fuzz-run:
	$(GO) test -run '^$$' -fuzz '^FuzzAPIKeyHeader$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzClientAddr$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzRLSDescriptor$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzCheckRequest$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalPath$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzLimitByValue$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzLuaArguments$$' -fuzztime $(FUZZTIME) ./lua/
	$(GO) test -run '^$$' -fuzz '^FuzzConvertAtTheChange$$' -fuzztime $(FUZZTIME) ./lua/
	$(GO) test -run '^$$' -fuzz '^FuzzValidateID$$' -fuzztime $(FUZZTIME) ./regions/
	$(GO) test -run '^$$' -fuzz '^FuzzParseScope$$' -fuzztime $(FUZZTIME) ./regions/
	$(GO) test -run '^$$' -fuzz '^FuzzParseShares$$' -fuzztime $(FUZZTIME) ./cmd/ratectl/
	$(GO) test -run '^$$' -fuzz '^FuzzParseTrace$$' -fuzztime $(FUZZTIME) ./rebalancer/sim/
	$(GO) test -run '^$$' -fuzz '^FuzzAllocate$$' -fuzztime $(FUZZTIME) ./rebalancer/
	$(GO) test -run '^$$' -fuzz '^FuzzShardLimit$$' -fuzztime $(FUZZTIME) ./gateway/limiter/
	$(GO) test -run '^$$' -fuzz '^FuzzURL$$' -fuzztime $(FUZZTIME) ./internal/redact/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLimits$$' -fuzztime $(FUZZTIME) ./regions/store/

## bench: the benchmark suite (about 14 min): writes docs/bench/results.json, renders
## docs/BENCHMARKS.md, the README headline and docs/proxies.md from it, then runs bench-rls.
bench: deps
	$(GO) run ./cmd/bench -runs 3
	$(MAKE) --no-print-directory bench-rls

## bench-rls: the gateway's RLS door vs envoyproxy/ratelimit, and nginx + /v1/check (about 2 min,
## after waiting up to 2 min for a quiet machine): writes docs/bench/rls.json and renders the documents.
bench-rls: deps
	$(GO) run ./cmd/rlsbench

## bench-render: render the benchmark documents again from docs/bench/*.json alone (after a template change).
bench-render:
	$(GO) run ./cmd/bench -render

## demo: the local two-region stack (see README); DURATION=60s runs unattended. Built, then
## run (not `go run`, which exits 1 when interrupted): Ctrl-C stops it with exit status 0.
demo: deps
	@$(GO) build -o bin/demo ./cmd/demo
	@./bin/demo $(if $(DURATION),--duration $(DURATION))
