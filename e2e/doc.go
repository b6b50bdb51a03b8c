// Package e2e holds the end-to-end tests of the pipeline: planner, executor workers and
// injector on a real embedded JetStream server, wired as cmd/toolbus wires them.
//
// Each test starts its own server and workers, so the tests run in parallel
// (t.Parallel): most of their time is spent waiting on the bus and on timers, and this
// package bounds the suite's time. The credentials the shipped deploy/nats files read
// from the environment are written into a copy of the files instead (startConfigured).
// A test that sets environment variables (t.Setenv) cannot run in parallel, nor does one
// bound by the CPU (megabytes through the bus): those run before the parallel ones.
package e2e
