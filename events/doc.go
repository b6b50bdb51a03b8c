// Package events owns the wire of toolbus: the subjects and durable names, the envelope
// of every event type (subject, id, type and extensions derived from the data), the
// CloudEvents codec over NATS and the checks that a subject and its body agree. Its Bus
// is the connection, publishing (deterministic ids, the squat guard), reading the event
// stream and the shared state of package events/store. Creating the stream, buckets and
// consumers is package events/provision's job; serving consumers is events/consume's;
// reading what a run stored is events/runlog's and following it live events/follow's.
// It imports none of the workers.
package events
