package provision

import (
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
)

// The one home of the limits of a stream that holds the events or a part of them (the
// event stream, its read mirror, the queue stream): each keeps the event stream's
// retention, age, storage and replicas, and allows no message delete and no purge (the
// events are the audit trail), so that no copy outlives or outgrows what it copies.

// eventLimits sets on sc the limits every stream of the events keeps.
func eventLimits(sc *jetstream.StreamConfig, cfg events.Config) {
	sc.Retention = jetstream.LimitsPolicy
	sc.MaxAge = cfg.MaxAge
	sc.Storage = storage(cfg)
	sc.Replicas = cfg.Replicas
	sc.DenyDelete, sc.DenyPurge = true, true
}

// byteBound sets on sc the event stream's bound on bytes (Config.StreamMaxBytes; 0:
// unbounded). Bounded, a full stream refuses new messages rather than dropping the
// oldest (the audit); the injectors stop admitting runs before it is full.
func byteBound(sc *jetstream.StreamConfig, cfg events.Config) {
	sc.MaxBytes = -1
	if cfg.StreamMaxBytes > 0 {
		sc.MaxBytes, sc.Discard = cfg.StreamMaxBytes, jetstream.DiscardNew
	}
}
