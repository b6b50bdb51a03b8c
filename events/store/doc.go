// Package store holds toolbus's shared state, apart from the event contract and its
// codec: the run history (each step's assistant message, join state and results), the
// run states, the approval decisions, the tool catalog and the live executor
// instances, the claims on calls and the run slots, and the large tool outputs (in
// chunks), all in JetStream key-value buckets. Every write two workers may race on is a
// create, where the first write stands, or a compare-and-set.
//
// provision.Setup (or `toolbus init`) creates the buckets and events.Open opens them; an
// events.Bus embeds the Store over them, so workers reach the state through their bus.
package store
