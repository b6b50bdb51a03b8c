// Package planner consumes model.requested, reads the run's history, calls a Model,
// records the whole assistant message and publishes model.responded, then one
// tool.requested per call (or run.completed when the model answered without calls).
//
// A redelivered step reuses the assistant message already recorded, so a retried step
// never asks the model twice for the same step's calls. The history is cached per run;
// the results of the step before come with the request when the injector could carry
// them, and a first delivery whose results answer the calls this planner recorded is
// planned without reading the history bucket (see Planner.viewless).
//
// The package links no model SDK: the provider adapters are planner/openai (Chat
// Completions, Responses) and planner/anthropic (Messages), and planner/modeltest is the
// conformance suite every adapter passes. Script and Replay answer without a network.
package planner
