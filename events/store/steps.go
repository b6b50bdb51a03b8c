package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
)

// StepRecord is the joined view of one step: the results of its calls by call index and
// the calls that wait for approval. It is assembled by Bus.Step from the step's bounded
// join state (StepState) and one history key per result, so no number of calls or
// result sizes makes any single stored value outgrow the server's max payload.
type StepRecord struct {
	RunID     string `json:"run_id"`
	Step      int    `json:"step"`
	CallCount int    `json:"call_count"`
	// Results by call index; nil until that call's result arrives. Output is not kept
	// here (the stream has it); Content is what the model reads.
	Results []*toolbus.ToolResult `json:"results"`
	// Waiting marks calls that wait for an approval decision.
	Waiting []*toolbus.ToolCall `json:"waiting,omitempty"`
}

// NewStepRecord returns an empty record for a step of n calls.
func NewStepRecord(run string, step, n int) *StepRecord {
	return &StepRecord{RunID: run, Step: step, CallCount: n, Results: make([]*toolbus.ToolResult, n), Waiting: make([]*toolbus.ToolCall, n)}
}

// Received is the number of results present.
func (r *StepRecord) Received() int {
	n := 0
	for _, x := range r.Results {
		if x != nil {
			n++
		}
	}
	return n
}

// Pending returns the calls still waiting for approval with no result.
func (r *StepRecord) Pending() []toolbus.ToolCall {
	var out []toolbus.ToolCall
	for i, w := range r.Waiting {
		if w != nil && (i >= len(r.Results) || r.Results[i] == nil) {
			out = append(out, *w)
		}
	}
	return out
}

// Settled reports whether every call has either a result or waits for approval.
func (r *StepRecord) Settled() bool {
	for i, x := range r.Results {
		if x == nil && (i >= len(r.Waiting) || r.Waiting[i] == nil) {
			return false
		}
	}
	return true
}

// Complete reports whether every call has a result.
func (r *StepRecord) Complete() bool { return r.Received() == r.CallCount }

// MaxStepCalls bounds the call count a step's join state accepts: far above any
// configured per-step cap, it only keeps a forged count from allocating without bound.
const MaxStepCalls = 100000

// Bits is a bit set by call index, stored as bytes (base64 in JSON): 128 calls cost 16
// bytes, so the join state of a step stays small whatever its results weigh.
type Bits []byte

// NewBits returns an empty set for n indexes.
func NewBits(n int) Bits { return make(Bits, (n+7)/8) }

// Has reports whether i is in the set.
func (b Bits) Has(i int) bool { return i >= 0 && i/8 < len(b) && b[i/8]&(1<<(i%8)) != 0 }

// Set adds i to the set; it reports whether i was absent.
func (b Bits) Set(i int) bool {
	if i < 0 || i/8 >= len(b) || b.Has(i) {
		return false
	}
	b[i/8] |= 1 << (i % 8)
	return true
}

// Count is the number of indexes in the set.
func (b Bits) Count() int {
	n := 0
	for _, x := range b {
		for ; x != 0; x &= x - 1 {
			n++
		}
	}
	return n
}

// StepState is the join state of one step, kept small and bounded: which calls have a
// result and which wait for approval, as bit sets. It lives in the history bucket under
// <run>.<step>.s and is updated with compare-and-set, so any number of injectors can
// join concurrently and a restart loses nothing. The results themselves are one key
// each (<run>.<step>.r.<index>, written with Create: the first result stands), and the
// waiting calls are read from the step's recorded assistant message.
type StepState struct {
	RunID     string `json:"run_id"`
	Step      int    `json:"step"`
	CallCount int    `json:"call_count"`
	Received  Bits   `json:"received"`
	Waiting   Bits   `json:"waiting,omitempty"`
}

// NewStepState returns the empty join state of a step of n calls.
func NewStepState(run string, step, n int) *StepState {
	return &StepState{RunID: run, Step: step, CallCount: n, Received: NewBits(n), Waiting: NewBits(n)}
}

// Clone returns a copy that may be changed without changing s.
func (s *StepState) Clone() *StepState {
	cp := *s
	cp.Received = append(Bits(nil), s.Received...)
	cp.Waiting = append(Bits(nil), s.Waiting...)
	return &cp
}

// Complete reports whether every call has a result.
func (s *StepState) Complete() bool { return s.Received.Count() == s.CallCount }

// Settled reports whether every call has a result or waits for approval.
func (s *StepState) Settled() bool {
	for i := 0; i < s.CallCount; i++ {
		if !s.Received.Has(i) && !s.Waiting.Has(i) {
			return false
		}
	}
	return true
}

// Unanswered returns the indexes of the calls with no result.
func (s *StepState) Unanswered() []int {
	var out []int
	for i := 0; i < s.CallCount; i++ {
		if !s.Received.Has(i) {
			out = append(out, i)
		}
	}
	return out
}

func (s *StepState) valid() bool {
	n := (s.CallCount + 7) / 8
	return s.CallCount > 0 && s.CallCount <= MaxStepCalls && len(s.Received) == n && (len(s.Waiting) == n || len(s.Waiting) == 0)
}

func resultKey(run string, step, idx int) string {
	return stepKey(run, step, "r") + "." + strconv.Itoa(idx)
}

// StepState loads the join state of a step and its revision for a later PutStepState.
// ErrNotFound when nothing has been joined yet.
func (s *Store) StepState(ctx context.Context, run string, step int) (*StepState, uint64, error) {
	key := stepKey(run, step, "s")
	e, err := s.history.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return nil, 0, fmt.Errorf("store: get %s: %w", key, err)
	}
	st, err := decodeStepState(key, e.Value())
	if err != nil {
		return nil, 0, err
	}
	return st, e.Revision(), nil
}

func decodeStepState(key string, raw []byte) (*StepState, error) {
	st := new(StepState)
	if err := json.Unmarshal(raw, st); err != nil {
		return nil, fmt.Errorf("store: decode %s: %w", key, err)
	}
	if !st.valid() {
		return nil, fmt.Errorf("store: %s: malformed join state", key)
	}
	if len(st.Waiting) == 0 {
		st.Waiting = NewBits(st.CallCount)
	}
	return st, nil
}

// PutStepState writes a step's join state with compare-and-set: revision 0 creates it.
// ErrConflict when another writer got there first; reload with StepState and retry.
func (s *Store) PutStepState(ctx context.Context, st *StepState, revision uint64) (uint64, error) {
	key := stepKey(st.RunID, st.Step, "s")
	val := mustJSON(st)
	var (
		rev uint64
		err error
	)
	if revision == 0 {
		rev, err = s.history.Create(ctx, key, val)
	} else {
		rev, err = s.history.Update(ctx, key, val, revision)
	}
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
			return 0, fmt.Errorf("%w: %s: %w", ErrConflict, key, err)
		}
		return 0, fmt.Errorf("store: put %s: %w", key, err)
	}
	return rev, nil
}

// PutResult records the result of call idx of a step; the first result stands. It
// returns the stored result and whether this call stored it. The result's Output is not
// kept (the stream has it).
func (s *Store) PutResult(ctx context.Context, run string, step, idx int, res toolbus.ToolResult) (toolbus.ToolResult, bool, error) {
	res.Output = nil
	key := resultKey(run, step, idx)
	if _, err := s.history.Create(ctx, key, mustJSON(res)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return res, false, fmt.Errorf("store: put %s: %w", key, err)
		}
		prev, err := s.Result(ctx, run, step, idx)
		return prev, false, err
	}
	return res, true, nil
}

// Result returns the recorded result of call idx of a step; ErrNotFound when none.
func (s *Store) Result(ctx context.Context, run string, step, idx int) (toolbus.ToolResult, error) {
	var r toolbus.ToolResult
	err := s.getJSON(ctx, s.history, resultKey(run, step, idx), &r)
	return r, err
}

// Step assembles the joined view of a step from its join state, its result keys and
// (for waiting calls) its assistant message, with the join state's revision.
// ErrNotFound when nothing has been joined yet.
func (s *Store) Step(ctx context.Context, run string, step int) (*StepRecord, uint64, error) {
	st, rev, err := s.StepState(ctx, run, step)
	if err != nil {
		return nil, 0, err
	}
	rec, err := s.assemble(ctx, st)
	return rec, rev, err
}

// assemble reads the results and waiting calls a join state marks.
func (s *Store) assemble(ctx context.Context, st *StepState) (*StepRecord, error) {
	return s.assembleWith(ctx, st, nil)
}

// assembleWith is assemble with results already read (by call index); the others are
// read here.
func (s *Store) assembleWith(ctx context.Context, st *StepState, known map[int]toolbus.ToolResult) (*StepRecord, error) {
	rec := NewStepRecord(st.RunID, st.Step, st.CallCount)
	var asst *toolbus.ModelResponded
	if known == nil && st.Received.Count() > 1 {
		// One request for every result of the step; what it misses is read on its own.
		known, _ = s.batchResults(ctx, st.RunID, st.Step, st.CallCount)
	}
	for i := 0; i < st.CallCount; i++ {
		if st.Received.Has(i) {
			r, ok := known[i]
			if !ok {
				var err error
				if r, err = s.Result(ctx, st.RunID, st.Step, i); err != nil {
					return nil, err
				}
			}
			rec.Results[i] = &r
			continue
		}
		if st.Waiting.Has(i) {
			if asst == nil {
				mr, err := s.Assistant(ctx, st.RunID, st.Step)
				if err != nil {
					return nil, err
				}
				asst = &mr
			}
			if i < len(asst.Message.ToolCalls) {
				c := asst.Message.ToolCalls[i]
				rec.Waiting[i] = &c
			}
		}
	}
	return rec, nil
}

// AssembleStep is Step for a join state already loaded.
func (s *Store) AssembleStep(ctx context.Context, st *StepState) (*StepRecord, error) {
	return s.assemble(ctx, st)
}

// PlanView is what the planner reads before planning a step: the join state of the step
// before and the results it had when read, and the assistant message already recorded
// for the step.
type PlanView struct {
	// Prev is the join state of step-1; nil for step 0 or when nothing was joined yet.
	Prev *StepState
	// Results are results of step-1 by call index, read with Prev (possibly not all
	// of them: AssemblePlanView reads the missing ones).
	Results map[int]toolbus.ToolResult
	// Assistant is the assistant message recorded for the step; nil when none is.
	Assistant *toolbus.ModelResponded
}

// PlanView reads the planner's view of step of run with one batched request (the join
// state of the step before, its results and the step's assistant message), or key by key
// where batched reads are not available.
func (s *Store) PlanView(ctx context.Context, run string, step int) (PlanView, error) {
	var v PlanView
	filters := []string{stepKey(run, step, "a")}
	if step > 0 {
		filters = append(filters, stepKey(run, step-1, "s"), stepKey(run, step-1, "r")+".*")
	}
	if vals, ok := s.lastValues(ctx, filters, batchMax); ok {
		if raw, ok := vals[stepKey(run, step, "a")]; ok {
			mr := new(toolbus.ModelResponded)
			if err := json.Unmarshal(raw, mr); err != nil {
				return v, fmt.Errorf("store: decode %s: %w", stepKey(run, step, "a"), err)
			}
			v.Assistant = mr
		}
		if step > 0 {
			if raw, ok := vals[stepKey(run, step-1, "s")]; ok {
				st, err := decodeStepState(stepKey(run, step-1, "s"), raw)
				if err != nil {
					return v, err
				}
				v.Prev = st
				v.Results = decodeResults(vals, stepKey(run, step-1, "r")+".", st.CallCount)
			}
		}
		return v, nil
	}
	if step > 0 {
		st, _, err := s.StepState(ctx, run, step-1)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return v, err
		}
		v.Prev = st
	}
	mr, err := s.Assistant(ctx, run, step)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return v, err
	}
	if err == nil {
		v.Assistant = &mr
	}
	return v, nil
}

// AssemblePlanView is AssembleStep of v.Prev with the results read with it.
func (s *Store) AssemblePlanView(ctx context.Context, v PlanView) (*StepRecord, error) {
	return s.assembleWith(ctx, v.Prev, v.Results)
}
