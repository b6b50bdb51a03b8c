package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
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
func (b *Bus) StepState(ctx context.Context, run string, step int) (*StepState, uint64, error) {
	key := stepKey(run, step, "s")
	e, err := b.history.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return nil, 0, fmt.Errorf("events: get %s: %w", key, err)
	}
	st := new(StepState)
	if err := unmarshal(e.Value(), st); err != nil {
		return nil, 0, fmt.Errorf("events: decode %s: %w", key, err)
	}
	if !st.valid() {
		return nil, 0, fmt.Errorf("events: %s: malformed join state", key)
	}
	if len(st.Waiting) == 0 {
		st.Waiting = NewBits(st.CallCount)
	}
	return st, e.Revision(), nil
}

// PutStepState writes a step's join state with compare-and-set: revision 0 creates it.
// ErrConflict when another writer got there first; reload with StepState and retry.
func (b *Bus) PutStepState(ctx context.Context, st *StepState, revision uint64) (uint64, error) {
	key := stepKey(st.RunID, st.Step, "s")
	val := mustJSON(st)
	var (
		rev uint64
		err error
	)
	if revision == 0 {
		rev, err = b.history.Create(ctx, key, val)
	} else {
		rev, err = b.history.Update(ctx, key, val, revision)
	}
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
			return 0, fmt.Errorf("%w: %s: %w", ErrConflict, key, err)
		}
		return 0, fmt.Errorf("events: put %s: %w", key, err)
	}
	return rev, nil
}

// PutResult records the result of call idx of a step; the first result stands. It
// returns the stored result and whether this call stored it. The result's Output is not
// kept (the stream has it).
func (b *Bus) PutResult(ctx context.Context, run string, step, idx int, res toolbus.ToolResult) (toolbus.ToolResult, bool, error) {
	res.Output = nil
	key := resultKey(run, step, idx)
	if _, err := b.history.Create(ctx, key, mustJSON(res)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return res, false, fmt.Errorf("events: put %s: %w", key, err)
		}
		prev, err := b.Result(ctx, run, step, idx)
		return prev, false, err
	}
	return res, true, nil
}

// Result returns the recorded result of call idx of a step; ErrNotFound when none.
func (b *Bus) Result(ctx context.Context, run string, step, idx int) (toolbus.ToolResult, error) {
	var r toolbus.ToolResult
	err := b.getJSON(ctx, b.history, resultKey(run, step, idx), &r)
	return r, err
}

// Step assembles the joined view of a step from its join state, its result keys and
// (for waiting calls) its assistant message, with the join state's revision.
// ErrNotFound when nothing has been joined yet.
func (b *Bus) Step(ctx context.Context, run string, step int) (*StepRecord, uint64, error) {
	st, rev, err := b.StepState(ctx, run, step)
	if err != nil {
		return nil, 0, err
	}
	rec, err := b.assemble(ctx, st)
	return rec, rev, err
}

// assemble reads the results and waiting calls a join state marks.
func (b *Bus) assemble(ctx context.Context, st *StepState) (*StepRecord, error) {
	rec := NewStepRecord(st.RunID, st.Step, st.CallCount)
	var asst *toolbus.ModelResponded
	for i := 0; i < st.CallCount; i++ {
		if st.Received.Has(i) {
			r, err := b.Result(ctx, st.RunID, st.Step, i)
			if err != nil {
				return nil, err
			}
			rec.Results[i] = &r
			continue
		}
		if st.Waiting.Has(i) {
			if asst == nil {
				mr, err := b.Assistant(ctx, st.RunID, st.Step)
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
func (b *Bus) AssembleStep(ctx context.Context, st *StepState) (*StepRecord, error) {
	return b.assemble(ctx, st)
}

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
func (b *Bus) RunState(ctx context.Context, run string) (RunState, uint64, error) {
	var st RunState
	e, err := b.runs.Get(ctx, run)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return st, 0, fmt.Errorf("%w: %s", ErrRunNotFound, run)
		}
		return st, 0, fmt.Errorf("events: run state %s: %w", run, err)
	}
	if err := unmarshal(e.Value(), &st); err != nil {
		return st, 0, fmt.Errorf("events: decode run state %s: %w", run, err)
	}
	return st, e.Revision(), nil
}

// Runs lists the state of every run in the runs bucket.
func (b *Bus) Runs(ctx context.Context) ([]RunState, error) {
	lister, err := b.runs.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("events: list runs: %w", err)
	}
	defer lister.Stop()
	var out []RunState
	for k := range lister.Keys() {
		st, _, err := b.RunState(ctx, k)
		if err != nil {
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

// CreateRunState records a new run as running at step 0. It reports false (and changes
// nothing) when the run already has a state: the first run.started of a run id is the
// only one that creates it.
func (b *Bus) CreateRunState(ctx context.Context, run string, startedAt time.Time) (bool, error) {
	now := time.Now().UTC()
	if startedAt.IsZero() {
		startedAt = now
	}
	st := RunState{RunID: run, Status: toolbus.RunRunning, StartedAt: startedAt, UpdatedAt: now}
	if _, err := b.runs.Create(ctx, run, mustJSON(st)); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return false, nil
		}
		return false, fmt.Errorf("events: run state %s: %w", run, err)
	}
	return true, nil
}

// SetRunState moves a run to a new status with compare-and-set. It refuses to move a run
// out of a terminal state (ErrRunEnded) unless the stored state is the very same outcome,
// in which case it returns nil so the caller can republish the (deduplicated) event after
// a crash.
func (b *Bus) SetRunState(ctx context.Context, run string, status toolbus.RunStatus, step int, code, reason string) error {
	_, err := b.setRunState(ctx, run, status, step, code, reason, nil)
	return err
}

func (b *Bus) setRunState(ctx context.Context, run string, status toolbus.RunStatus, step int, code, reason string, ended *toolbus.RunEnded) (RunState, error) {
	for attempt := 0; attempt < 32; attempt++ {
		st, rev, err := b.RunState(ctx, run)
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
		if rev == 0 {
			_, err = b.runs.Create(ctx, run, mustJSON(st))
		} else {
			_, err = b.runs.Update(ctx, run, mustJSON(st), rev)
		}
		if err == nil {
			return st, nil
		}
		var apiErr *jetstream.APIError
		if !errors.Is(err, jetstream.ErrKeyExists) && !(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
			return st, fmt.Errorf("events: set run state %s: %w", run, err)
		}
	}
	return RunState{}, fmt.Errorf("%w: run state %s", ErrConflict, run)
}

// EndRun records a run outcome and publishes run.<status>. It returns ErrRunEnded (and
// publishes nothing) when the run already ended differently, so a late result cannot
// move a run back. When the run already ended with the same outcome (a redelivery after
// a crash), the stored outcome is published again: its id is deterministic, and
// PublishOutcome skips it when the stream already has it.
func (b *Bus) EndRun(ctx context.Context, source string, step int, ended toolbus.RunEnded) error {
	st, err := b.RecordEnd(ctx, step, ended)
	if err != nil {
		return err
	}
	return b.PublishOutcome(ctx, source, st)
}

// RecordEnd is the first half of EndRun: it stores the outcome (the whole RunEnded) in
// the run state and returns the state as stored.
func (b *Bus) RecordEnd(ctx context.Context, step int, ended toolbus.RunEnded) (RunState, error) {
	return b.setRunState(ctx, ended.RunID, ended.Status, step, ended.Code, ended.Reason, &ended)
}

// outcomeID is the deterministic id of an outcome event.
func outcomeID(run string, step int, ended *toolbus.RunEnded) string {
	id := IDRunEnded(run, step, ended.Status)
	if ended.Status == toolbus.RunWaitingForApproval {
		// A step can wait several times, once per remaining set of pending calls.
		id += "/" + strconv.Itoa(len(ended.Pending))
	}
	return id
}

// PublishOutcome publishes the outcome event recorded in a run state (the second half of
// EndRun). It publishes nothing when the stream already holds that very event, so an
// outcome republished after a crash reaches the stream once even past the duplicate
// window.
func (b *Bus) PublishOutcome(ctx context.Context, source string, st RunState) error {
	ended := st.Ended
	if ended == nil {
		if !st.Status.Terminal() {
			return nil
		}
		// A state written before outcomes were stored whole: rebuild what it records.
		ended = &toolbus.RunEnded{RunID: st.RunID, Status: st.Status, Code: st.Code, Reason: st.Reason, StepsUsed: st.Step + 1}
	}
	id := outcomeID(st.RunID, st.Step, ended)
	subject := SubjectRunEnded(st.RunID, ended.Status)
	if raw, err := b.Stream.GetLastMsgForSubject(ctx, subject); err == nil && raw.Header.Get(HeaderMsgID) == id {
		return nil
	}
	_, err := b.Publish(ctx, subject, Meta{
		ID: id, Type: TypeRunEnded(ended.Status), Source: source, RunID: st.RunID, Step: st.Step,
	}, *ended)
	return err
}

// CurrentStep returns the step a run is at: the highest step with a recorded assistant
// message, at or after the step of its run state (the run state records the step when
// the run waits or ends, not at every step). A step whose model call is still under way
// has no assistant message yet; CurrentStep then returns the step before it.
func (b *Bus) CurrentStep(ctx context.Context, run string) (int, error) {
	st, _, err := b.RunState(ctx, run)
	if err != nil {
		return 0, err
	}
	step := st.Step
	for {
		if _, err := b.Assistant(ctx, run, step+1); err != nil {
			if errors.Is(err, ErrNotFound) {
				return step, nil
			}
			return 0, err
		}
		step++
	}
}

// Call ids are unique within a step only (some models reuse call_0 at every step), so
// approval decisions are kept per step: a decision never carries over to a later call
// that happens to reuse the id.
func decisionKey(run string, step int, callID string) string {
	return run + "." + strconv.Itoa(step) + "." + kvSafe(callID)
}

// DecideStep records the approval decision of one call of a step; the first decision
// stands and is returned.
func (b *Bus) DecideStep(ctx context.Context, step int, d Decision) (Decision, error) {
	key := decisionKey(d.RunID, step, d.CallID)
	if _, err := b.approvals.Create(ctx, key, mustJSON(d)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return d, fmt.Errorf("events: approval %s: %w", key, err)
		}
		return b.StepDecision(ctx, d.RunID, step, d.CallID)
	}
	return d, nil
}

// StepDecision returns the approval decision of one call of a step; ErrNotFound when
// none was made.
func (b *Bus) StepDecision(ctx context.Context, run string, step int, callID string) (Decision, error) {
	var d Decision
	err := b.getJSON(ctx, b.approvals, decisionKey(run, step, callID), &d)
	return d, err
}

// PublishApproval publishes a person's (or a service's) decision on a call that waits
// for approval: toolbus.<run>.approval.granted or .denied, with the step in the step
// extension and the id <run>/<step>/<call_id>/approval.<granted|denied>, so the same
// decision published twice is stored once. The injector records the first decision
// per call and re-issues the call.
func (b *Bus) PublishApproval(ctx context.Context, source string, step int, a toolbus.Approval, granted bool) (*jetstream.PubAck, error) {
	if !toolbus.ValidRunID(a.RunID) || a.CallID == "" {
		return nil, fmt.Errorf("events: approval needs a valid run id and a call id")
	}
	typ := TypeApprovalDenied
	if granted {
		typ = TypeApprovalGranted
	}
	return b.Publish(ctx, SubjectApproval(a.RunID, granted), Meta{
		ID: IDApproval(a.RunID, strconv.Itoa(step)+"/"+a.CallID, granted), Type: typ, Source: source,
		RunID: a.RunID, Step: step, CallID: a.CallID, HasCall: true,
	}, a)
}

// PublishCancel publishes run.cancel: executors cancel the run's calls in flight and the
// injector ends the run as cancelled.
func (b *Bus) PublishCancel(ctx context.Context, source string, c toolbus.Cancel) (*jetstream.PubAck, error) {
	if !toolbus.ValidRunID(c.RunID) {
		return nil, fmt.Errorf("events: cancel needs a valid run id")
	}
	return b.Publish(ctx, SubjectRunCancel(c.RunID), Meta{
		ID: IDRunCancel(c.RunID), Type: TypeRunCancel, Source: source, RunID: c.RunID,
	}, c)
}

// CancelRequest returns the run.cancel event of a run, if one was published.
func (b *Bus) CancelRequest(ctx context.Context, run string) (toolbus.Cancel, bool, error) {
	raw, err := b.Stream.GetLastMsgForSubject(ctx, SubjectRunCancel(run))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return toolbus.Cancel{}, false, nil
		}
		return toolbus.Cancel{}, false, fmt.Errorf("events: run.cancel of %s: %w", run, err)
	}
	var c toolbus.Cancel
	if _, err := Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, &c); err != nil {
		return toolbus.Cancel{}, false, err
	}
	if c.RunID == "" {
		c.RunID = run
	}
	return c, true, nil
}

// The deadline timer of a run: one event per run on toolbus.<run>.timer.deadline,
// published by the injector that starts the run. The injector's timer consumer holds it
// (a negative acknowledgement delayed until the deadline: a durable timer kept by the
// server, which survives injector restarts) and ends the run when its deadline passes
// with the run still going.
const (
	TypeRunTimer = "toolbus.timer.deadline"
	FilterTimers = SubjectPrefix + ".*.timer.deadline"
)

// SubjectTimer is toolbus.<run>.timer.deadline.
func SubjectTimer(run string) string { return SubjectPrefix + "." + run + ".timer.deadline" }

// IDTimer is <run>/timer.deadline.
func IDTimer(run string) string { return run + "/timer.deadline" }

// RunTimer is the data of a run's deadline timer.
type RunTimer struct {
	RunID    string    `json:"run_id"`
	Deadline time.Time `json:"deadline"`
}
