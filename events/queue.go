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
// served the tool. On a deployment made before the queue stream (no QueueStreamName yet)
// it reads the tool's queue that deployment keeps on the event stream, which `toolbus
// init` retires once it is empty (docs/deployment-and-security.md, "Upgrading to the
// queue stream": `toolbus tools` shows when it is).
func (b *Bus) ToolQueueInfo(ctx context.Context, tool string) (ToolQueue, error) {
	if b.team {
		return ToolQueue{Tool: tool}, fmt.Errorf("%w: the state of the queue of %s (the core exports no consumer info to a team: its roles' credentials read it)", ErrTeamAccount, tool)
	}
	c, err := b.QueueStream().Consumer(ctx, ToolConsumer(tool))
	if errors.Is(err, ErrNotSetUp) {
		c, err = b.stream.Consumer(ctx, ToolConsumer(tool))
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return ToolQueue{Tool: tool}, fmt.Errorf("%w: queue of %s", ErrNotFound, tool)
		}
		return ToolQueue{Tool: tool}, fmt.Errorf("events: queue of %s: %w", tool, err)
	}
	ci := c.CachedInfo()
	return ToolQueue{Tool: tool, Pending: ci.NumPending, InFlight: ci.NumAckPending, Redelivers: ci.NumRedelivered}, nil
}

// QueueStream is the queue stream (QueueStreamName) as this bus reaches it: the tools'
// queues by name (their info, binding, and creating or updating them where the
// credentials allow; never in a team account). Nothing else of it is read: its info
// would list the subjects of every tool, and only the server writes in it.
func (b *Bus) QueueStream() jetstream.Stream {
	return &queueStream{js: b.js, name: QueueStreamName(b.cfg.Stream), team: b.team}
}

// queueStream implements the consumer methods of jetstream.Stream on the queue stream;
// the others are not called (the embedded nil Stream).
type queueStream struct {
	jetstream.Stream
	js   jetstream.JetStream
	name string
	team bool
}

func (s *queueStream) CachedInfo() *jetstream.StreamInfo {
	return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: s.name}}
}

func (s *queueStream) Consumer(ctx context.Context, name string) (jetstream.Consumer, error) {
	c, err := s.js.Consumer(ctx, s.name, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: stream %s does not exist (made before the queue stream: docs/deployment-and-security.md, Upgrading to the queue stream)", ErrNotSetUp, s.name)
	}
	return c, err
}

func (s *queueStream) CreateOrUpdateConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if s.team {
		return nil, fmt.Errorf("%w: consumer %s is made by `toolbus init` in the core account", ErrTeamAccount, cfg.Durable)
	}
	return s.js.CreateOrUpdateConsumer(ctx, s.name, cfg)
}

func (s *queueStream) CreateConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	return s.CreateOrUpdateConsumer(ctx, cfg)
}

func (s *queueStream) DeleteConsumer(ctx context.Context, name string) error {
	if s.team {
		return fmt.Errorf("%w: consumer %s is deleted in the core account", ErrTeamAccount, name)
	}
	return s.js.DeleteConsumer(ctx, s.name, name)
}
