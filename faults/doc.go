// Package faults is the fault and load suite of toolbus: it builds the real nats-server
// (github.com/nats-io/nats-server/v2) and toolbus binaries, runs them as separate
// processes on 127.0.0.1, breaks them (kill -9 of an executor mid-call and of the
// injector mid-join, a NATS server restart, the loss of a node of a 3-node JetStream
// cluster) and checks from the JetStream stream itself that nothing was lost and
// nothing ran twice. The nats-server processes run the config files of deploy/nats.
// It also holds the load test (1,000 concurrent runs over 4 executor processes).
//
// The package has no code of its own: everything is in its tests and in the test
// binary faults/internal/faultbus. Run the whole suite with
//
//	make test-faults        # TOOLBUS_FAULTS=1 go test -race -count=1 -run Fault -v ./faults/...
//
// A plain `go test ./...` runs only TestFaultExecutorKill (a real kill -9 of a real
// executor process, about 15 s), TestFaultSecurityRoles (the binaries with per-role
// credentials, a few seconds), TestFaultQuestionSurvivesRestarts (every process killed
// -9 while a tool waits for its question's answer, about 15 s), TestFaultMixedLanguages
// (a TypeScript team and a Go team in their own accounts, about 30 s; it needs node and
// the built sdk/typescript) and the others that skip only under -short, and skips the
// rest unless TOOLBUS_FAULTS=1. Those that run in plain `go test` run in parallel
// (t.Parallel): each has its own servers, processes, ports and directory.
// TOOLBUS_FAULTS_LOGS=1 prints the end of every process log; TOOLBUS_LOAD_RUNS changes
// the number of runs of the load test.
package faults
