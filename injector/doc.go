// Package injector joins the results of each step in call order, whatever order they
// finish in, and decides what follows: the next model request, or a run outcome
// (failed, limit_reached, waiting_for_approval). It also applies approval decisions and
// cancellations.
//
// The injector also starts runs: the first run.started of a run id records the run, arms
// its deadline timer and asks for step 0; a later run.started for the same id is
// terminated. Results are checked against the calls of the step's recorded assistant
// message, which the injector learns from the step's model.responded event (a core NATS
// subscription; only the planner publishes it, with the recorded answer) or, when it
// missed that event, reads once (calls.go).
//
// The join state of a step lives in JetStream: one key per result in the history bucket
// (created once: the first result stands) and a small join record of bit sets updated
// with compare-and-set, so no number of calls or result sizes outgrows the server's max
// payload, any number of injectors can run at once and a restarted injector loses
// nothing. Every publication has a deterministic id and every outcome is stored whole
// before it is published, so redoing a decision after a crash publishes nothing twice
// and loses nothing. Each run's deadline timer (see deadline.go) ends a run whose step
// never completes.
package injector
