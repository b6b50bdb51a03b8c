// Package events owns the public contract of toolbus: the event data types, the subjects,
// the CloudEvents codec over NATS, the stream and consumer setup, the tool catalog and the
// history store that planner and injector share. It imports none of the workers.
package events
