# toolbus: see README.md. Every target works on a fresh machine with only Go installed.
GO      ?= go
BIN     := bin/toolbus
PKGS    := ./...

.PHONY: demo install test test-faults bench build vet fmt fuzz clean

DEMO_BIN := bin/toolbus-demo
# The demo binary links no provider SDK and no OTLP exporter (-tags toolbus_lite): its first
# build takes a fraction of the full one; scripts, script files, cassettes, call, replay,
# tail and the console all work. -trimpath and -s -w make it smaller and link faster.
LITE    := -tags toolbus_lite -trimpath -ldflags='-s -w'

DEMO_SYSTEM := You are an on-call assistant. Use the tools to check facts before answering.

## demo: the incident scenario end to end on an embedded JetStream server (the first build
## compiles nats-server: minutes on 2 cores; later builds take seconds)
demo:
	@echo "building $(DEMO_BIN) (the first build takes a few minutes on 2 cores; later ones seconds)"
	$(GO) build $(LITE) -o $(DEMO_BIN) ./cmd/toolbus
	@mkdir -p data
	TOOLBUS_DATA_DIR=$${TOOLBUS_DATA_DIR:-$(CURDIR)/data} TOOLBUS_MODEL=$${TOOLBUS_MODEL:-replay:planner/testdata/incident.jsonl} $(DEMO_BIN) run -system "$(DEMO_SYSTEM)" "What is going on with INC-404?"
	@echo "next: make install puts this binary on your PATH as toolbus, as every document writes it"

## install: the demo's binary (the lite build) as toolbus in GOBIN (default $$(go env GOPATH)/bin),
## so that the documents' `toolbus ...` commands run as written; it reuses the demo's build
install:
	$(GO) install $(LITE) ./cmd/toolbus
	@dir="$$($(GO) env GOBIN)"; [ -n "$$dir" ] || dir="$$($(GO) env GOPATH)/bin"; \
	echo "installed $$dir/toolbus"; \
	case ":$$PATH:" in *":$$dir:"*) ;; *) echo "$$dir is not on your PATH: export PATH=\"$$dir:\$$PATH\"";; esac

## build: the full binary (every model provider, OTLP tracing)
build:
	$(GO) build -trimpath -ldflags='-s -w' -o $(BIN) ./cmd/toolbus

## test: vet, then every test with the race detector (real embedded JetStream); on an empty
## module cache the go command fetches the modules first (GOPROXY). Four test binaries at
## once (-p 4, the default is one per core): the long packages (e2e, faults) wait on
## servers, processes and timers about half of the time, so two cores run four of them.
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -p 4 -timeout 12m $(PKGS)

## test-faults: crash and restart tests with real nats-server and toolbus processes
test-faults:
	TOOLBUS_FAULTS=1 $(GO) test -race -count=1 -timeout 20m -run 'Fault' -v ./faults/...

## bench: Go benchmarks plus the pipeline benchmark table (bench/results.json)
bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./executor ./events
	@mkdir -p bench
	$(BIN) bench -json bench/results.json

## fuzz: a short run of every fuzz target
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 20s ./events
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeBinaryDirect$$' -fuzztime 20s ./events
	$(GO) test -run '^$$' -fuzz FuzzArguments -fuzztime 20s ./executor
	$(GO) test -run '^$$' -fuzz FuzzTruncate -fuzztime 20s ./executor
	$(GO) test -run '^$$' -fuzz FuzzRedact -fuzztime 20s ./executor
	$(GO) test -run '^$$' -fuzz FuzzCalculator -fuzztime 20s ./executor/packs
	$(GO) test -run '^$$' -fuzz '^FuzzOpenAIResponse$$' -fuzztime 20s ./planner/openai
	$(GO) test -run '^$$' -fuzz '^FuzzOpenAIResponsesResponse$$' -fuzztime 20s ./planner/openai
	$(GO) test -run '^$$' -fuzz '^FuzzAnthropicResponse$$' -fuzztime 20s ./planner/anthropic

vet:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)

fmt:
	gofmt -w .

clean:
	rm -rf bin data bench

.PHONY: asyncapi
## asyncapi: install the official AsyncAPI parser (npm ci, committed lockfile) and validate asyncapi.yaml
## (make test runs the same check in TestAsyncAPI, and skips it only when the parser is missing outside CI)
asyncapi:
	npm ci --prefix tools/asyncapi-validate --ignore-scripts --no-audit --no-fund
	node tools/asyncapi-validate/validate.js asyncapi.yaml

.PHONY: npm conformance
## npm: install the Node packages of the AsyncAPI validator, the TypeScript package (built by its
## npm ci) and the Node executor example from their committed lockfiles (.ci/run does the same)
npm:
	npm ci --prefix tools/asyncapi-validate --ignore-scripts --no-audit --no-fund
	npm ci --prefix sdk/typescript --no-audit --no-fund
	npm ci --prefix examples/node-executor --ignore-scripts --no-audit --no-fund

## conformance: the executor conformance suite against the Go and the Node (TypeScript package) executors
conformance: npm
	$(GO) test -race -count=1 -v ./conformance/

.PHONY: mcp-conformance-client
## mcp-conformance-client: the official MCP conformance suite's client scenarios (initialize, tools_call,
## sse-retry, every 2025-11-25 auth/ scenario, the client-credentials ones) against toolbus's MCP client
## (tools/mcp-conformance/client); make test runs the same TestClientScenarios
mcp-conformance-client:
	npm ci --prefix tools/mcp-conformance --no-audit --no-fund
	CI=true $(GO) test -count=1 -v -run TestClientScenarios ./tools/mcp-conformance/clienttest/

.PHONY: mcp-conformance-server
## mcp-conformance-server: the official MCP conformance suite's server scenarios against
## `toolbus mcp --http` serving its fixture tools (tools/mcp-conformance; the suite and
## Node 22 come from npm with the committed lockfile); the scenarios that do not apply to
## a tool tier are in tools/mcp-conformance/server-expected-failures.yml with their reasons
mcp-conformance-server:
	npm ci --prefix tools/mcp-conformance --no-audit --no-fund
	$(GO) test -race -count=1 -v -run '^TestServerScenarios$$' ./tools/mcp-conformance/

.PHONY: mcp-conformance
## mcp-conformance: both sides of the official MCP conformance suite (make test runs both too)
mcp-conformance: mcp-conformance-server mcp-conformance-client
