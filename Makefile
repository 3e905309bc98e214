# Every target runs on a fresh Debian machine with Go: missing servers are installed first.
GO       ?= go
DURATION ?=
TIMEOUT  ?= 20m

.PHONY: test demo bench lint deps unit

deps:
	@./deploy/install-deps.sh

## test: everything — lint, then all tests with -race against real servers.
test: deps lint
	$(GO) test -race -count=1 -timeout $(TIMEOUT) ./...
	cd deploy/render && $(GO) test -count=1 ./...

## unit: the pure packages only (no servers): allocation and simulator.
unit:
	$(GO) test -race -count=1 ./rebalancer ./rebalancer/sim

## lint: gofmt, go vet.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd deploy/render && $(GO) vet ./...

## bench: benchmarks against real servers; results go to docs/BENCHMARKS.md by hand.
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...

## demo: the local stack (see README).
demo: deps
	$(GO) run ./cmd/demo $(if $(DURATION),--duration $(DURATION))
