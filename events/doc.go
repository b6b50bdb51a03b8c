// Package events owns the wire of toolbus: the subjects, the envelope of every event type
// (subject, id, type and extensions derived from the data), the CloudEvents codec over
// NATS, the stream and consumer setup and the consume loop. Its Bus is the connection,
// the event stream and the shared state of package events/store. It imports none of the
// workers.
package events
