package provision

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
)

// ErrQueuesNotDrained is returned by Setup when a tool's queue of a deployment made
// before the queue stream (a durable tool_<tool> on the event stream) still holds calls:
// moving them would run them twice or lose them, so the upgrade waits until the
// executors have finished them (docs/deployment-and-security.md, "Upgrading to the
// queue stream").
var ErrQueuesNotDrained = errors.New("provision: the tools' queues on the event stream still hold calls")

// queueStreamConfig is the configuration of the queue stream (events.QueueStreamName):
// a copy of every tool.requested of the event stream on its tool's exact subject. The
// server writes it alone (no subject of its own, so no publish reaches it); its limits
// follow the event stream's, of which it holds a part. start is where its source starts
// (the time it is first created: calls published before it are not queued again).
func queueStreamConfig(cfg events.Config, start time.Time) jetstream.StreamConfig {
	sc := jetstream.StreamConfig{
		Name:        events.QueueStreamName(cfg.Stream),
		Description: "the tools' queues: each tool.requested of " + cfg.Stream + " on " + events.QueuePrefix + ".<tool>",
		Sources: []*jetstream.StreamSource{{
			Name:         cfg.Stream,
			OptStartTime: &start,
			SubjectTransforms: []jetstream.SubjectTransformConfig{{
				Source: events.QueueSourceFilter, Destination: events.QueueDestination,
			}},
		}},
		MaxConsumers: EventStreamMaxConsumers,
	}
	eventLimits(&sc, cfg)
	byteBound(&sc, cfg)
	if cfg.FairShare {
		// The server stages the calls; the core's scheduler publishes each on its
		// queue subject once, deduplicated by the staged sequence (docs/fair-share.md).
		sc.Description = "the tools' queues: each tool.requested of " + cfg.Stream + " staged on " + events.StagePrefix + ".<tool>, released by the fair scheduler on " + events.QueuePrefix + ".<tool>"
		sc.Sources[0].SubjectTransforms[0].Destination = events.StageDestination
		sc.Subjects = []string{events.QueuePrefix + ".>"}
		sc.Duplicates = cfg.Duplicates
	}
	return sc
}

// ErrStagedCallsHeld is returned by Setup when fair share is turned off while the
// scheduler still holds staged calls: the queues would never get them.
var ErrStagedCallsHeld = errors.New("provision: the fair scheduler still holds staged calls")

// checkUnstaging refuses to turn fair share off (a staging queue stream set up without
// it) while a staged call is above the scheduler's low-water mark, the last released
// call's events.FairLowHeader.
func checkUnstaging(ctx context.Context, s jetstream.Stream) error {
	src := s.CachedInfo().Config.Sources
	if len(src) != 1 || len(src[0].SubjectTransforms) != 1 || src[0].SubjectTransforms[0].Destination != events.StageDestination {
		return nil
	}
	staged, err := s.GetLastMsgForSubject(ctx, events.StagePrefix+".>")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("provision: last staged call: %w", err)
	}
	var low uint64
	if rel, err := s.GetLastMsgForSubject(ctx, events.QueuePrefix+".>"); err == nil {
		low, _ = strconv.ParseUint(rel.Header.Get(events.FairLowHeader), 10, 64)
	}
	if staged.Sequence > low {
		return fmt.Errorf("%w (staged up to %d, released up to %d): keep TOOLBUS_FAIR_SHARE on until the injectors released them", ErrStagedCallsHeld, staged.Sequence, low)
	}
	return nil
}

// setupQueueStream creates or updates the queue stream, keeping the start of an
// existing one's source, and retires the queues of a deployment made before it.
func setupQueueStream(ctx context.Context, js jetstream.JetStream, cfg events.Config, note func(kind, name string, existed bool, before, after any)) error {
	start := time.Now().UTC()
	name := events.QueueStreamName(cfg.Stream)
	switch s, err := js.Stream(ctx, name); {
	case err == nil:
		if src := s.CachedInfo().Config.Sources; len(src) == 1 && src[0].OptStartTime != nil {
			start = *src[0].OptStartTime
		}
		if !cfg.FairShare {
			if err := checkUnstaging(ctx, s); err != nil {
				return err
			}
		}
	case errors.Is(err, jetstream.ErrStreamNotFound):
		// Created now: the queues of an earlier layout must be empty first.
		if err := retireEventStreamQueues(ctx, js, cfg.Stream); err != nil {
			return err
		}
	default:
		return fmt.Errorf("provision: stream %s: %w", name, err)
	}
	if err := upsertStream(ctx, js, queueStreamConfig(cfg, start), note); err != nil {
		return err
	}
	if !cfg.FairShare {
		return nil
	}
	// The scheduler's durable: no acknowledgement (a restarted scheduler finds its
	// place from the releases, package fair), every staged call from the first.
	_, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: events.FairConsumer, Description: "the fair scheduler's staged calls",
		FilterSubject: events.StagePrefix + ".>", AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		Replicas: cfg.Replicas, MemoryStorage: cfg.Memory,
	})
	if err != nil {
		return fmt.Errorf("provision: consumer %s of %s: %w", events.FairConsumer, name, err)
	}
	return nil
}

// retireEventStreamQueues deletes the tools' queues a deployment made before the queue
// stream keeps on the event stream (durables tool_<tool>), once none holds a call;
// otherwise it deletes nothing and returns ErrQueuesNotDrained.
func retireEventStreamQueues(ctx context.Context, js jetstream.JetStream, stream string) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("provision: stream %s: %w", stream, err)
	}
	var old, busy []string
	infos := s.ListConsumers(ctx)
	for ci := range infos.Info() {
		if !events.IsToolConsumer(ci.Name) {
			continue
		}
		old = append(old, ci.Name)
		if ci.NumPending > 0 || ci.NumAckPending > 0 {
			busy = append(busy, fmt.Sprintf("%s (%d pending, %d running)", ci.Name, ci.NumPending, ci.NumAckPending))
		}
	}
	if err := infos.Err(); err != nil {
		return fmt.Errorf("provision: consumers of %s: %w", stream, err)
	}
	if len(busy) > 0 {
		return fmt.Errorf("%w: %s; let the executors finish them with the planners stopped, then run `toolbus init` again", ErrQueuesNotDrained, strings.Join(busy, ", "))
	}
	for _, name := range old {
		if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("provision: retiring queue %s of %s: %w", name, stream, err)
		}
	}
	return nil
}
