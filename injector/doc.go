// Package injector joins the results of each step in call order, whatever order they
// finish in, and decides what follows: the next model request, or a run outcome
// (failed, limit_reached, waiting_for_approval). It also applies approval decisions and
// cancellations.
//
// The join state of a step lives in JetStream (a key in the history bucket, updated
// with compare-and-set), so any number of injectors can run at once and a restarted
// injector loses nothing. Every publication has a deterministic id, so redoing a
// decision after a crash publishes nothing twice.
package injector
