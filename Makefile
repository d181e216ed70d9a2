# Mandate — build, generate, lint and test. Everything runs offline except
# for the Go module proxy: buf and golangci-lint are Go tools pinned in
# tools/go.mod and tools/lint/go.mod, protoc plugins in go.mod.
SHELL := /bin/bash
BUF   := go tool -modfile=tools/go.mod buf
LINT  := go tool -modfile=tools/lint/go.mod golangci-lint
PLUGIN_BUILD := go build -trimpath -buildvcs=false

.PHONY: all generate vendor-protos lint test test-short bench ci check-generated binaries idle-rss governance-diff

all: generate lint test

## generate: regenerate gen/ (Go, gateway, OpenAPI 3.1, manifest, descriptor set)
# protoc-gen-mandate links gen/mandate/v1; when options.proto changes, the
# first pass rebuilds that package and a second pass uses it.
generate:
	@mkdir -p bin
	$(PLUGIN_BUILD) -o bin/protoc-gen-mandate ./cmd/protoc-gen-mandate
	$(PLUGIN_BUILD) -o bin/protoc-gen-openapi31 ./cmd/protoc-gen-openapi31
	$(BUF) generate
	@$(PLUGIN_BUILD) -o bin/protoc-gen-mandate.next ./cmd/protoc-gen-mandate
	@if ! cmp -s bin/protoc-gen-mandate bin/protoc-gen-mandate.next; then \
		mv bin/protoc-gen-mandate.next bin/protoc-gen-mandate && $(BUF) generate; \
	else rm -f bin/protoc-gen-mandate.next; fi

## binaries: the all-in-one mandate and one binary per service (mandate-audit, …)
## in ./bin, built as deploy/compose/Dockerfile builds them. A per-service binary
## links only its service, so that an idle process maps less of it; it is built
## with gRPC's grpcnotrace tag: Mandate never turns on grpc.EnableTracing, and
## without the tag gRPC links golang.org/x/net/trace, whose html/template keeps
## every exported method of the binary alive (about 5 MB).
SERVICES     := audit catalog confirm executor mcpbridge helpdesk
BIN_LDFLAGS  ?= -s -w
BIN_TAGS     ?= grpcnotrace
binaries:
	@mkdir -p bin
	CGO_ENABLED=0 go build -trimpath -ldflags='$(BIN_LDFLAGS)' -o bin/ ./cmd/mandate
	CGO_ENABLED=0 go build -trimpath -tags='$(BIN_TAGS)' -ldflags='$(BIN_LDFLAGS)' -o bin/ $(SERVICES:%=./cmd/mandate-%)

## idle-rss: every service's resident memory while idle, from the all-in-one and from
## its own binary, side by side (needs Postgres at 127.0.0.1:5432)
idle-rss:
	scripts/idle-rss.sh

## vendor-protos: refresh third_party/ from the Go module cache
vendor-protos:
	scripts/vendor-protos.sh

## lint: buf lint + format check, go vet, golangci-lint
lint:
	$(BUF) lint
	$(BUF) format proto --diff --exit-code
	go vet ./...
	$(LINT) run ./...

## governance-diff: the sample manifest against the previous release's
## (docs/governance-diff.md): fails on a high finding that
## docs/governance/accepted.yaml does not accept with a reason
PREVIOUS_MANIFEST ?= docs/governance/manifest-previous.json
governance-diff:
	go run ./cmd/mandate manifest diff --overrides docs/governance/accepted.yaml $(PREVIOUS_MANIFEST) gen/manifest/manifest.json

## test: every test tier this machine can run (Postgres tests skip without a server
## unless MANDATE_REQUIRE_POSTGRES=1)
test:
	go test -race -count=1 ./...

test-short:
	go test -short ./...

## bench: the benchmarks quoted in the issues' closing notes
bench:
	go test -run '^$$' -bench . -benchmem ./internal/...

## bench-governed: governed vs ungoverned MCP calls (ticket.search, and
## expense.report.create with a key) side by side — `mandate dev`, the services
## as processes over Postgres (when one answers) and a plain go-sdk server — as
## tables of ratios, latency, CPU and allocs per command, then one call's spans
## through the separate services (-timeline), audit appends against pgbench,
## and issue #28's targets table per command
.PHONY: bench-governed
bench-governed:
	go run ./cmd/mandate-bench

## check-generated: fail if `make generate` changes anything
check-generated: generate
	@if [ -n "$$(git status --porcelain -- gen)" ]; then \
		echo "make generate changed generated files; commit them:"; git status --porcelain -- gen; git diff --stat -- gen; exit 1; fi

ci: check-generated lint governance-diff test
