package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
)

// RunState is the state of a run in the runs bucket.
type RunState struct {
	RunID     string            `json:"run_id"`
	Status    toolbus.RunStatus `json:"status"`
	Step      int               `json:"step"`
	Code      string            `json:"code,omitempty"`
	Reason    string            `json:"reason,omitempty"`
	StartedAt time.Time         `json:"started_at"`
	UpdatedAt time.Time         `json:"updated_at"`
	// Ended is the whole outcome event of a run that ended (or waits for approval), so a
	// worker that finds the run ended after a crash republishes exactly the same event.
	Ended *toolbus.RunEnded `json:"ended,omitempty"`
}

// RunState returns the state of a run and its revision.
func (s *Store) RunState(ctx context.Context, run string) (RunState, uint64, error) {
	var st RunState
	e, err := s.runs.Get(ctx, run)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return st, 0, fmt.Errorf("%w: %s", ErrRunNotFound, run)
		}
		return st, 0, fmt.Errorf("store: run state %s: %w", run, err)
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return st, 0, fmt.Errorf("store: decode run state %s: %w", run, err)
	}
	return st, e.Revision(), nil
}

// Runs lists the state of every run in the runs bucket.
func (s *Store) Runs(ctx context.Context) ([]RunState, error) {
	var out []RunState
	err := s.walk(ctx, s.runs, func(_ string, val []byte) {
		var st RunState
		if json.Unmarshal(val, &st) == nil {
			out = append(out, st)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("store: list runs: %w", err)
	}
	return out, nil
}

// CreateRunState records a new run as running at step 0. It reports false (and changes
// nothing) when the run already has a state: the first run.started of a run id is the
// only one that creates it.
func (s *Store) CreateRunState(ctx context.Context, run string, startedAt time.Time) (bool, error) {
	now := time.Now().UTC()
	if startedAt.IsZero() {
		startedAt = now
	}
	st := RunState{RunID: run, Status: toolbus.RunRunning, StartedAt: startedAt, UpdatedAt: now}
	rev, err := s.runs.Create(ctx, run, mustJSON(st))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return false, nil
		}
		return false, fmt.Errorf("store: run state %s: %w", run, err)
	}
	s.written.remember(run, st, rev)
	return true, nil
}

// SetRunState moves a run to a new status with compare-and-set. It refuses to move a run
// out of a terminal state (ErrRunEnded) unless the stored state is the very same outcome,
// in which case it returns nil so the caller can republish the (deduplicated) event after
// a crash.
func (s *Store) SetRunState(ctx context.Context, run string, status toolbus.RunStatus, step int, code, reason string) error {
	_, err := s.setRunState(ctx, run, status, step, code, reason, nil)
	return err
}

func (s *Store) setRunState(ctx context.Context, run string, status toolbus.RunStatus, step int, code, reason string, ended *toolbus.RunEnded) (RunState, error) {
	for attempt := 0; attempt < 32; attempt++ {
		// The state this store wrote last, while no other write is known: its compare-and-set
		// fails if another writer came in between, and the loop then reads.
		st, rev, ok := s.written.take(run)
		var err error
		if !ok || attempt > 0 {
			st, rev, err = s.RunState(ctx, run)
		}
		if err != nil && !errors.Is(err, ErrRunNotFound) {
			return st, err
		}
		if st.Status.Terminal() {
			if st.Status == status && st.Step == step {
				return st, nil
			}
			return st, fmt.Errorf("%w: %s is %s", ErrRunEnded, run, st.Status)
		}
		now := time.Now().UTC()
		if st.StartedAt.IsZero() {
			st.StartedAt = now
		}
		st.RunID, st.Status, st.Step, st.Code, st.Reason, st.UpdatedAt, st.Ended = run, status, step, code, reason, now, ended
		var written uint64
		if rev == 0 {
			written, err = s.runs.Create(ctx, run, mustJSON(st))
		} else {
			written, err = s.runs.Update(ctx, run, mustJSON(st), rev)
		}
		if err == nil {
			if !st.Status.Terminal() {
				s.written.remember(run, st, written)
			}
			return st, nil
		}
		var apiErr *jetstream.APIError
		if !errors.Is(err, jetstream.ErrKeyExists) && !(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
			return st, fmt.Errorf("store: set run state %s: %w", run, err)
		}
	}
	return RunState{}, fmt.Errorf("%w: run state %s", ErrConflict, run)
}

// RecordEnd is the first half of EndRun: it stores the outcome (the whole RunEnded) in
// the run state and returns the state as stored.
func (s *Store) RecordEnd(ctx context.Context, step int, ended toolbus.RunEnded) (RunState, error) {
	return s.setRunState(ctx, ended.RunID, ended.Status, step, ended.Code, ended.Reason, &ended)
}

// CurrentStep returns the step a run is at: the highest step with a recorded assistant
// message, at or after the step of its run state (the run state records the step when
// the run waits or ends, not at every step). A step whose model call is still under way
// has no assistant message yet; CurrentStep then returns the step before it.
func (s *Store) CurrentStep(ctx context.Context, run string) (int, error) {
	st, _, err := s.RunState(ctx, run)
	if err != nil {
		return 0, err
	}
	step := st.Step
	for {
		if _, err := s.Assistant(ctx, run, step+1); err != nil {
			if errors.Is(err, ErrNotFound) {
				return step, nil
			}
			return 0, err
		}
		step++
	}
}

// writtenStates remembers, per run, the run state this store wrote last and its
// revision, so that the next write of the same run (typically its end, by the injector
// that started it) is a compare-and-set on that revision instead of a read and then one:
// one message less per run. A stale entry costs nothing but the read it would have
// saved: the compare-and-set fails when anything else was written since. Two
// generations of at most writtenGeneration runs each bound it; an entry is dropped when
// used (the write that follows remembers its own) and never kept for an ended run.
type writtenStates struct {
	mu        sync.Mutex
	cur, prev map[string]writtenState
}

// writtenState is a run state as written and the revision the bucket gave it.
type writtenState struct {
	st  RunState
	rev uint64
}

// writtenGeneration is the size of a generation of writtenStates: the runs in flight of
// one injector, twice over.
const writtenGeneration = 8192

// remember records st as the state of run written at revision rev.
func (w *writtenStates) remember(run string, st RunState, rev uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.cur) >= writtenGeneration {
		w.prev, w.cur = w.cur, nil
	}
	if w.cur == nil {
		w.cur = make(map[string]writtenState)
	}
	w.cur[run] = writtenState{st: st, rev: rev}
}

// take returns and forgets the state of run this store wrote last.
func (w *writtenStates) take(run string) (RunState, uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.cur[run]; ok {
		delete(w.cur, run)
		return e.st, e.rev, true
	}
	if e, ok := w.prev[run]; ok {
		delete(w.prev, run)
		return e.st, e.rev, true
	}
	return RunState{}, 0, false
}
