// Package toolbus is the root of the toolbus module: an event-driven runtime over NATS
// JetStream that turns an LLM's tool calls into real, safe actions and returns their
// results to the next model request. See README.md; the code lives in events/,
// executor/, planner/, injector/ and cmd/toolbus.
package toolbus
