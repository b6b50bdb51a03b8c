package events

import (
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// The one home of the rule "which stream holds a durable": a tool's queue (ToolConsumer)
// is on the queue stream (QueueStreamName), every other durable (the planner's, the
// injector's: ConsumerPlanner and the others) on the event stream itself.

// IsToolConsumer reports whether a durable is a tool's queue (ToolConsumer).
func IsToolConsumer(durable string) bool { return strings.HasPrefix(durable, ToolConsumerPrefix) }

// DurableStream is the name of the stream that holds a durable of the event stream
// named stream: its queue stream for a tool's queue, the event stream for the rest.
func DurableStream(stream, durable string) string {
	if IsToolConsumer(durable) {
		return QueueStreamName(stream)
	}
	return stream
}

// DurableHome is the stream of this bus that holds a durable (DurableStream): the queue
// stream as this bus reaches it (QueueStream) for a tool's queue, the event stream for
// the rest.
func (b *Bus) DurableHome(durable string) jetstream.Stream {
	if IsToolConsumer(durable) {
		return b.QueueStream()
	}
	return b.EventStream()
}
