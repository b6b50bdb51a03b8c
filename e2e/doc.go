// Package e2e holds the end-to-end tests of the pipeline: planner, executor workers and
// injector on a real embedded JetStream server, wired as cmd/toolbus wires them.
package e2e
