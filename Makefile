# toolbus: see README.md. Every target works on a fresh machine with Go; make test also installs
# the npm packages when Node.js and npm are there, and names the tests it could not run.
GO      ?= go
BIN     := bin/toolbus
PKGS    := ./...

.PHONY: demo install test test-missing test-faults bench build vet fmt fuzz clean

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

## test: the npm packages (make npm), vet, then every test with the race detector (real
## embedded JetStream); on an empty module cache the go command fetches the modules first
## (GOPROXY). Four test binaries at once (-p 4, the default is one per core): the long
## packages (e2e, faults) wait on servers, processes and timers about half of the time, so
## two cores run four of them; within them the tests run in parallel too (t.Parallel, e2e four and faults three at a time, the others as
## many at once as cores), so that no package takes more than half of the -timeout. A test that a missing part from outside Go (Node.js and
## npm, Chromium) skips records itself in $(MISSING) (testutil.NeedOutside); the last
## lines list them with how to get each part (outside CI a skip still passes).
MISSING := $(CURDIR)/bin/test-missing.tsv
# MISSING_REPORT prints the tests recorded in $(MISSING), by missing part with how to get
# it, and nothing when there are none (one shell command, so that make -n test runs nothing).
MISSING_REPORT = if [ -s $(MISSING) ]; then sort -u $(MISSING) | awk -F'\t' '\
	  NF < 4 { next } \
	  { k = $$1 ": " $$2; if (!(k in tests)) order[++n] = k; tests[k] = tests[k] "\n    " $$3 " " $$4; c++ } \
	  END { if (!c) exit; printf "\nmake test could not run %d tests: a part from outside Go is missing\n", c; \
	        for (i = 1; i <= n; i++) print "  " order[i] tests[order[i]] }'; fi
test: npm
	$(GO) vet $(PKGS)
	@mkdir -p bin && rm -f $(MISSING)
	@echo '$(GO) test -race -count=1 -p 4 -timeout 12m $(PKGS)'; \
	TOOLBUS_TEST_MISSING=$(MISSING) $(GO) test -race -count=1 -p 4 -timeout 12m $(PKGS); status=$$?; \
	$(MISSING_REPORT); exit $$status

## test-missing: what make test's last lines say of the tests in $(MISSING) it could not run
test-missing:
	@$(MISSING_REPORT)

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

.PHONY: npm asyncapi conformance
## npm: the npm packages the tests run, each installed with npm ci from its committed lockfile
## when its node_modules is missing or older than the lockfile (the stamp node_modules/.installed;
## npm ci wipes node_modules first): the official AsyncAPI parser, the TypeScript package (its
## npm ci builds it; again when its sources change), the Node executor example on it, the
## third-party MCP servers, and the official MCP conformance suite with its Node 22. Without
## npm it installs nothing (make test then names the tests it skipped), except under CI.
NPM_PARTS := tools/asyncapi-validate sdk/typescript examples/node-executor tools/mcp-servers tools/mcp-conformance
NPM_IGNORE_SCRIPTS := tools/asyncapi-validate examples/node-executor
ifneq ($(shell command -v npm),)
npm: $(NPM_PARTS:%=%/node_modules/.installed)
else
npm:
	@if [ -n "$$CI" ]; then echo "npm is not installed: CI needs Node.js 20 or later with npm" >&2; exit 1; fi
	@echo "npm is not installed: the tests that need Node.js skip (install Node.js 20 or later with npm)"
endif

%/node_modules/.installed: %/package-lock.json
	npm ci --prefix $*$(if $(filter $*,$(NPM_IGNORE_SCRIPTS)), --ignore-scripts) --no-audit --no-fund
	@touch $@
sdk/typescript/node_modules/.installed: $(wildcard sdk/typescript/src/*.ts) sdk/typescript/tsconfig.json
# The example installs the TypeScript package as a link to sdk/typescript: built first.
examples/node-executor/node_modules/.installed: | sdk/typescript/node_modules/.installed

## asyncapi: validate asyncapi.yaml with the official AsyncAPI parser (make test runs the same
## check in TestAsyncAPI)
asyncapi: tools/asyncapi-validate/node_modules/.installed
	node tools/asyncapi-validate/validate.js asyncapi.yaml

## conformance: the executor conformance suite against the Go and the Node (TypeScript package) executors
conformance: npm
	$(GO) test -race -count=1 -v ./conformance/

.PHONY: mcp-conformance-client
## mcp-conformance-client: the official MCP conformance suite's client scenarios (initialize, tools_call,
## sse-retry, every 2025-11-25 auth/ scenario, the client-credentials ones) against toolbus's MCP client
## (tools/mcp-conformance/client); make test runs the same TestClientScenarios
mcp-conformance-client: tools/mcp-conformance/node_modules/.installed
	CI=true $(GO) test -count=1 -v -run TestClientScenarios ./tools/mcp-conformance/clienttest/

.PHONY: mcp-conformance-server
## mcp-conformance-server: the official MCP conformance suite's server scenarios against
## `toolbus mcp --http` serving its fixture tools (tools/mcp-conformance; the suites and
## Node 22 come from npm with the committed lockfile): 0.1.16's 2025-11-25 scenarios, then
## 0.2.0's --requirements 2026-07-28; the scenarios that do not apply to a tool tier are in
## tools/mcp-conformance/server-expected-failures*.yml with their reasons
mcp-conformance-server: tools/mcp-conformance/node_modules/.installed
	$(GO) test -race -count=1 -v -run '^TestServerScenarios$$' ./tools/mcp-conformance/

.PHONY: mcp-conformance
## mcp-conformance: both sides of the official MCP conformance suite (make test runs both too)
mcp-conformance: mcp-conformance-server mcp-conformance-client
