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

// The inline budget of a join state. A result is kept inline in its step's join state
// (written by the compare-and-set that marks it received: no write of its own) when its
// encoding is at most InlineResultMax bytes and the inline results of the state stay
// within InlineStateMax bytes (less on a server whose max_payload is under four times
// that: see Store.InlineBudget); any other result is written under its own key first
// (the overflow, <run>.<step>.r.<index>).
//
// Why these sizes: every compare-and-set of a step (one to three per step with group
// commit, more when injectors race) rewrites the whole state, and the planner reads it
// whole. One message saved per result costs the server about what copying and storing a
// few KiB costs, so a result of a few KiB is worth inlining and a larger one is not;
// 32 KiB bounds what a rewrite copies to the cost of a few messages and stays far below
// any max_payload toolbus runs with (its events carry results of 16 KiB and more).
const (
	InlineResultMax = 4 << 10
	InlineStateMax  = 32 << 10
)

// StepState is the join state of one step, kept small and bounded: which calls have a
// result and which wait for approval, as bit sets, and the results that fit the inline
// budget. It lives in the history bucket under <run>.<step>.s and is updated with
// compare-and-set, so any number of injectors can join concurrently, a restart loses
// nothing, and the first result the state marks for a call stands. A marked result
// missing from Results is under its own key (<run>.<step>.r.<index>), written with
// Create before the compare-and-set that marked it: a result too large to inline, or
// any result of a step joined before results were inlined. The waiting calls are read
// from the step's recorded assistant message.
type StepState struct {
	RunID     string `json:"run_id"`
	Step      int    `json:"step"`
	CallCount int    `json:"call_count"`
	Received  Bits   `json:"received"`
	Waiting   Bits   `json:"waiting,omitempty"`
	// Results are the inline results by call index: a ToolResult without its output,
	// as JSON (decoded only when read). Never changed once set.
	Results map[int]json.RawMessage `json:"results,omitempty"`
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
	if s.Results != nil {
		cp.Results = make(map[int]json.RawMessage, len(s.Results)+4)
		for i, r := range s.Results { // the values are never changed: shared
			cp.Results[i] = r
		}
	}
	return &cp
}

// EncodeResult is the stored form of a result: its JSON without the output (the stream
// has it).
func EncodeResult(res toolbus.ToolResult) json.RawMessage {
	res.Output = nil
	return mustJSON(res)
}

// inlineCost is what an inline result adds to the state's JSON: the result, its key and
// punctuation.
func inlineCost(idx, size int) int { return size + len(strconv.Itoa(idx)) + 4 }

// InlineBytes is the size the inline results take in the state's JSON.
func (s *StepState) InlineBytes() int {
	n := 0
	for i, r := range s.Results {
		n += inlineCost(i, len(r))
	}
	return n
}

// JoinInline marks call idx received with its result res (EncodeResult) inline, when
// the call has no result yet and res fits the inline budget of budget bytes in all
// (Store.InlineBudget). It reports whether it did; full reports that the call has no
// result but res does not fit: it must then be written under its own key
// (Store.PutResult) before a later change marks it (Received.Set).
func (s *StepState) JoinInline(idx int, res json.RawMessage, budget int) (joined, full bool) {
	if idx < 0 || idx >= s.CallCount || s.Received.Has(idx) {
		return false, false
	}
	if len(res) > InlineResultMax || s.InlineBytes()+inlineCost(idx, len(res)) > budget {
		return false, true
	}
	s.Received.Set(idx)
	if s.Results == nil {
		s.Results = map[int]json.RawMessage{}
	}
	s.Results[idx] = res
	return true, false
}

// Inline returns the inline result of call idx; ok is false when the call has none
// inline (no result yet, or one under its own key).
func (s *StepState) Inline(idx int) (r toolbus.ToolResult, ok bool, err error) {
	raw, ok := s.Results[idx]
	if !ok {
		return r, false, nil
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, false, fmt.Errorf("store: decode inline result %d of %s step %d: %w", idx, s.RunID, s.Step, err)
	}
	return r, true, nil
}

// Overflowed counts the calls with a result that is not inline (under its own key).
func (s *StepState) Overflowed() int { return s.Received.Count() - len(s.Results) }

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
	if !(s.CallCount > 0 && s.CallCount <= MaxStepCalls && len(s.Received) == n && (len(s.Waiting) == n || len(s.Waiting) == 0)) {
		return false
	}
	for i := range s.Results { // an inline result is written with its mark, never alone
		if !s.Received.Has(i) {
			return false
		}
	}
	return true
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

// InlineBudget is how many bytes the inline results of a join state may take in all:
// InlineStateMax, or a quarter of the server's max_payload when that is less, so that a
// join state (bit sets and inline results) always fits in one message.
func (s *Store) InlineBudget() int {
	if s.conn != nil {
		if p := int(s.conn.MaxPayload()) / 4; p > 0 && p < InlineStateMax {
			return p
		}
	}
	return InlineStateMax
}

// PutResult records the result of call idx of a step under its own key (the overflow
// of a result that does not fit inline, see StepState.JoinInline); the first result
// under that key stands. It returns the stored result and whether this call stored it.
// The result's Output is not kept (the stream has it). The key is written before the
// compare-and-set that marks the call received, so a reader that sees the mark finds it.
func (s *Store) PutResult(ctx context.Context, run string, step, idx int, res toolbus.ToolResult) (toolbus.ToolResult, bool, error) {
	res.Output = nil
	key := resultKey(run, step, idx)
	if _, err := s.history.Create(ctx, key, mustJSON(res)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return res, false, fmt.Errorf("store: put %s: %w", key, err)
		}
		prev, err := s.overflowResult(ctx, run, step, idx)
		return prev, false, err
	}
	return res, true, nil
}

// overflowResult reads the result of call idx stored under its own key.
func (s *Store) overflowResult(ctx context.Context, run string, step, idx int) (toolbus.ToolResult, error) {
	var r toolbus.ToolResult
	err := s.getJSON(ctx, s.history, resultKey(run, step, idx), &r)
	return r, err
}

// Result returns the joined result of call idx of a step (the one its join state
// marks, inline or under its own key); ErrNotFound when the call has none yet.
func (s *Store) Result(ctx context.Context, run string, step, idx int) (toolbus.ToolResult, error) {
	st, _, err := s.StepState(ctx, run, step)
	if err != nil {
		return toolbus.ToolResult{}, err
	}
	if !st.Received.Has(idx) {
		return toolbus.ToolResult{}, fmt.Errorf("%w: %s: call %d has no result", ErrNotFound, stepKey(run, step, "s"), idx)
	}
	return s.ResultOf(ctx, st, idx)
}

// ResultOf returns the result of call idx that the join state st marks: inline, or read
// from its own key (a result too large to inline, or a step joined before results were
// inlined). ErrNotFound when st marks none.
func (s *Store) ResultOf(ctx context.Context, st *StepState, idx int) (toolbus.ToolResult, error) {
	if !st.Received.Has(idx) {
		return toolbus.ToolResult{}, fmt.Errorf("%w: %s: call %d has no result", ErrNotFound, stepKey(st.RunID, st.Step, "s"), idx)
	}
	if r, ok, err := st.Inline(idx); ok || err != nil {
		return r, err
	}
	return s.overflowResult(ctx, st.RunID, st.Step, idx)
}

// Step assembles the joined view of a step from its join state (with its inline
// results), the keys of the results not inline and (for waiting calls) its assistant
// message, with the join state's revision. ErrNotFound when nothing has been joined yet.
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

// assembleWith is assemble with results not inline already read (by call index); the
// others are read here.
func (s *Store) assembleWith(ctx context.Context, st *StepState, known map[int]toolbus.ToolResult) (*StepRecord, error) {
	rec := NewStepRecord(st.RunID, st.Step, st.CallCount)
	var asst *toolbus.ModelResponded
	if known == nil && st.Overflowed() > 1 {
		// One request for every result under its own key; what it misses is read on
		// its own.
		known, _ = s.batchResults(ctx, st.RunID, st.Step, st.CallCount)
	}
	for i := 0; i < st.CallCount; i++ {
		if st.Received.Has(i) {
			r, ok, err := st.Inline(i)
			if err != nil {
				return nil, err
			}
			if !ok {
				if r, ok = known[i]; !ok {
					if r, err = s.overflowResult(ctx, st.RunID, st.Step, i); err != nil {
						return nil, err
					}
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
// before (with its inline results) and the results under their own keys it had when
// read, and the assistant message already recorded for the step.
type PlanView struct {
	// Prev is the join state of step-1; nil for step 0 or when nothing was joined yet.
	Prev *StepState
	// Results are the results of step-1 under their own keys (not inline), by call
	// index, read with Prev (possibly not all of them: AssemblePlanView reads the
	// missing ones).
	Results map[int]toolbus.ToolResult
	// Assistant is the assistant message recorded for the step; nil when none is.
	Assistant *toolbus.ModelResponded
}

// PlanView reads the planner's view of step of run with one batched request (the join
// state of the step before with its inline results, the results of that step under
// their own keys, and the step's assistant message), or key by key where batched reads
// are not available.
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
