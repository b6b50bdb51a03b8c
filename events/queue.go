package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ToolQueue describes one tool's queue: its pending and in-flight calls.
type ToolQueue struct {
	Tool       string `json:"tool"`
	Pending    uint64 `json:"pending"`
	InFlight   int    `json:"in_flight"`
	Redelivers int    `json:"redelivered"`
}

// ToolQueueInfo reads the consumer of a tool's queue. ErrNotFound when no executor ever
// served the tool.
func (b *Bus) ToolQueueInfo(ctx context.Context, tool string) (ToolQueue, error) {
	c, err := b.stream.Consumer(ctx, ToolConsumer(tool))
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return ToolQueue{Tool: tool}, fmt.Errorf("%w: queue of %s", ErrNotFound, tool)
		}
		return ToolQueue{Tool: tool}, fmt.Errorf("events: queue of %s: %w", tool, err)
	}
	ci := c.CachedInfo()
	return ToolQueue{Tool: tool, Pending: ci.NumPending, InFlight: ci.NumAckPending, Redelivers: ci.NumRedelivered}, nil
}
