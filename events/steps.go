package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StepRecord is the join state of one step: the results of its calls by call index. It
// lives in the history bucket and is updated with compare-and-set, so any number of
// injectors can join concurrently and a restart loses nothing. Once complete it is the
// step's tool messages in the history.
type StepRecord struct {
	RunID     string `json:"run_id"`
	Step      int    `json:"step"`
	CallCount int    `json:"call_count"`
	// Results by call index; nil until that call's result arrives. Output is not kept
	// here (the stream has it); Content is what the model reads.
	Results []*ToolResult `json:"results"`
	// Waiting marks calls that wait for an approval decision.
	Waiting []*ToolCall `json:"waiting,omitempty"`
}

// NewStepRecord returns an empty record for a step of n calls.
func NewStepRecord(run string, step, n int) *StepRecord {
	return &StepRecord{RunID: run, Step: step, CallCount: n, Results: make([]*ToolResult, n), Waiting: make([]*ToolCall, n)}
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
func (r *StepRecord) Pending() []ToolCall {
	var out []ToolCall
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

// Step loads the join record of a step and its revision for a later UpdateStep.
// ErrNotFound when no result has been joined yet.
func (b *Bus) Step(ctx context.Context, run string, step int) (*StepRecord, uint64, error) {
	key := stepKey(run, step, "r")
	e, err := b.history.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return nil, 0, fmt.Errorf("events: get %s: %w", key, err)
	}
	rec := new(StepRecord)
	if err := unmarshal(e.Value(), rec); err != nil {
		return nil, 0, fmt.Errorf("events: decode %s: %w", key, err)
	}
	return rec, e.Revision(), nil
}

// PutStep writes a join record with compare-and-set: revision 0 creates it. ErrConflict
// when another writer got there first; reload with Step and retry.
func (b *Bus) PutStep(ctx context.Context, rec *StepRecord, revision uint64) (uint64, error) {
	key := stepKey(rec.RunID, rec.Step, "r")
	val := mustJSON(rec)
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

// RunState is the state of a run in the runs bucket.
type RunState struct {
	RunID     string    `json:"run_id"`
	Status    RunStatus `json:"status"`
	Step      int       `json:"step"`
	Code      string    `json:"code,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
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

// SetRunState moves a run to a new status with compare-and-set. It refuses to move a run
// out of a terminal state (ErrRunEnded) unless the stored state is the very same outcome,
// in which case it returns nil so the caller can republish the (deduplicated) event after
// a crash.
func (b *Bus) SetRunState(ctx context.Context, run string, status RunStatus, step int, code, reason string) error {
	for attempt := 0; attempt < 32; attempt++ {
		st, rev, err := b.RunState(ctx, run)
		if err != nil && !errors.Is(err, ErrRunNotFound) {
			return err
		}
		if st.Status.Terminal() {
			if st.Status == status && st.Step == step {
				return nil
			}
			return fmt.Errorf("%w: %s is %s", ErrRunEnded, run, st.Status)
		}
		now := time.Now().UTC()
		if st.StartedAt.IsZero() {
			st.StartedAt = now
		}
		st.RunID, st.Status, st.Step, st.Code, st.Reason, st.UpdatedAt = run, status, step, code, reason, now
		if rev == 0 {
			_, err = b.runs.Create(ctx, run, mustJSON(st))
		} else {
			_, err = b.runs.Update(ctx, run, mustJSON(st), rev)
		}
		if err == nil {
			return nil
		}
		var apiErr *jetstream.APIError
		if !errors.Is(err, jetstream.ErrKeyExists) && !(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
			return fmt.Errorf("events: set run state %s: %w", run, err)
		}
	}
	return fmt.Errorf("%w: run state %s", ErrConflict, run)
}

// EndRun records a run outcome and publishes run.<status>. It returns ErrRunEnded (and
// publishes nothing) when the run already ended differently, so a late result cannot
// move a run back.
func (b *Bus) EndRun(ctx context.Context, source string, step int, ended RunEnded) error {
	if err := b.SetRunState(ctx, ended.RunID, ended.Status, step, ended.Code, ended.Reason); err != nil {
		return err
	}
	id := IDRunEnded(ended.RunID, step, ended.Status)
	if ended.Status == RunWaitingForApproval {
		// A step can wait several times, once per remaining set of pending calls.
		id += "/" + strconv.Itoa(len(ended.Pending))
	}
	_, err := b.Publish(ctx, SubjectRunEnded(ended.RunID, ended.Status), Meta{
		ID: id, Type: TypeRunEnded(ended.Status),
		Source: source, RunID: ended.RunID, Step: step,
	}, ended)
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
func (b *Bus) PublishApproval(ctx context.Context, source string, step int, a Approval, granted bool) (*jetstream.PubAck, error) {
	if !ValidRunID(a.RunID) || a.CallID == "" {
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
func (b *Bus) PublishCancel(ctx context.Context, source string, c Cancel) (*jetstream.PubAck, error) {
	if !ValidRunID(c.RunID) {
		return nil, fmt.Errorf("events: cancel needs a valid run id")
	}
	return b.Publish(ctx, SubjectRunCancel(c.RunID), Meta{
		ID: IDRunCancel(c.RunID), Type: TypeRunCancel, Source: source, RunID: c.RunID,
	}, c)
}

// CancelRequest returns the run.cancel event of a run, if one was published.
func (b *Bus) CancelRequest(ctx context.Context, run string) (Cancel, bool, error) {
	raw, err := b.Stream.GetLastMsgForSubject(ctx, SubjectRunCancel(run))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Cancel{}, false, nil
		}
		return Cancel{}, false, fmt.Errorf("events: run.cancel of %s: %w", run, err)
	}
	var c Cancel
	if _, err := Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, &c); err != nil {
		return Cancel{}, false, err
	}
	if c.RunID == "" {
		c.RunID = run
	}
	return c, true, nil
}

// DefaultLimits are the limits a worker applies to runs that set none (TOOLBUS_MAX_STEPS,
// TOOLBUS_RUN_TIMEOUT, TOOLBUS_TOKEN_BUDGET); a zero field sets no default.
type DefaultLimits struct {
	MaxSteps int
	// RunTimeout gives a run with no deadline the deadline StartedAt + RunTimeout.
	RunTimeout  time.Duration
	TokenBudget int64
}

// WithDefaults returns rs with its zero limits filled from d (rs itself is not changed:
// it may be shared through the run cache).
func (rs *RunStarted) WithDefaults(d DefaultLimits) *RunStarted {
	l := rs.Limits
	if (l.MaxSteps > 0 || d.MaxSteps <= 0) && (!l.Deadline.IsZero() || d.RunTimeout <= 0 || rs.StartedAt.IsZero()) &&
		(l.TokenBudget > 0 || d.TokenBudget <= 0) {
		return rs
	}
	cp := *rs
	if l.MaxSteps <= 0 && d.MaxSteps > 0 {
		cp.Limits.MaxSteps = d.MaxSteps
	}
	if l.Deadline.IsZero() && d.RunTimeout > 0 && !rs.StartedAt.IsZero() {
		cp.Limits.Deadline = rs.StartedAt.Add(d.RunTimeout)
	}
	if l.TokenBudget <= 0 && d.TokenBudget > 0 {
		cp.Limits.TokenBudget = d.TokenBudget
	}
	return &cp
}
