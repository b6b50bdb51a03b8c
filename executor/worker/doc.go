// Package worker is the bus side of an executor: it serves the tools of an
// executor.Executor on NATS JetStream. Each served tool has one durable queue shared by
// every process of every deployment that serves it (a call of a tool nobody serves is
// answered by the planner); a call is claimed in the claims bucket before it runs, so a redelivery
// waits for the claimer or takes the claim over from a dead instance; a per-run cap of
// calls in flight keeps one run from taking the fleet; the worker heartbeats its
// instance and publishes the catalog entries of its tools; every call ends with exactly
// one tool.finished.
//
// Serve runs an executor of your own from the TOOLBUS_* environment; New and
// Worker.Run wire one explicitly.
package worker
