package events

import "errors"

// The names of the durable consumers and streams the deployment grants by name
// (deploy/nats/permissions.conf): package events/provision creates them, the workers
// bind to them.

// ErrNotSetUp is wrapped by Open and by binding a consumer when a stream, bucket or
// consumer is missing and this connection may not create it: an administrator runs
// `toolbus init`.
var ErrNotSetUp = errors.New("events: not set up (run `toolbus init` with admin credentials)")

// Durable consumer names of the planner and injector (provision.Setup creates them; the
// workers bind to them). deploy/nats/permissions.conf grants each role its own names only.
const (
	ConsumerPlanner           = "planner"
	ConsumerInjector          = "injector"
	ConsumerInjectorWaiting   = "injector-waiting"
	ConsumerInjectorApprovals = "injector-approvals"
	ConsumerInjectorCancel    = "injector-cancel"
	ConsumerInjectorStarted   = "injector-started"
	ConsumerInjectorTimers    = "injector-timers"
)

// ToolConsumer is the durable consumer name of one tool's queue: every executor that
// serves the tool, in any deployment, shares it, so each call runs on one of them.
func ToolConsumer(tool string) string { return ToolConsumerPrefix + ToolToken(tool) }

// ToolConsumerPrefix starts the name of every tool's queue.
const ToolConsumerPrefix = "tool_"

// QueueStreamName is the name of the queue stream of an event stream: it sources every
// tool.requested of the event stream, each on its tool's queue subject (SubjectQueue),
// and holds the tools' queues (ToolConsumer). See SubjectQueue for why.
func QueueStreamName(stream string) string { return stream + "_QUEUES" }

// ReadMirrorName is the name of the read mirror of a stream.
func ReadMirrorName(stream string) string { return stream + "_READ" }
