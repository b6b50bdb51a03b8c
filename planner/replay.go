package planner

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"

	"github.com/toolbus/toolbus"
)

// A cassette is a JSONL file of model exchanges, one Exchange per line, in the order
// they happened. Recorder writes one; Replay serves one, so a recorded run re-runs
// offline with the same tool calls and answers.

// Exchange is one line of a cassette: what the planner asked a model for one step of a
// run, and what the model answered.
type Exchange struct {
	RunID    string           `json:"run_id"`
	Step     int              `json:"step"`
	Request  ExchangeRequest  `json:"request"`
	Response ExchangeResponse `json:"response"`
}

// ExchangeRequest is the recorded Request.
type ExchangeRequest struct {
	Model    string                 `json:"model,omitempty"`
	Messages []toolbus.Message      `json:"messages"`
	Tools    []toolbus.ToolContract `json:"tools,omitempty"`
}

// ExchangeResponse is the recorded Response.
type ExchangeResponse struct {
	Message toolbus.Message `json:"message"`
	Usage   toolbus.Usage   `json:"usage"`
	Model   string          `json:"model,omitempty"`
}

// Recorder is a Model that calls another Model and appends every successful exchange
// to a cassette as one JSON line. It is safe for concurrent use: lines are written
// whole, one at a time. A failed write is logged and does not fail the step (the
// model's answer is already paid for).
type Recorder struct {
	model Model
	log   *slog.Logger

	mu sync.Mutex
	w  io.Writer
	c  io.Closer
}

var _ Model = (*Recorder)(nil)

// NewRecorder returns a Recorder that writes to w. log may be nil (slog.Default()).
func NewRecorder(m Model, w io.Writer, log *slog.Logger) *Recorder {
	if log == nil {
		log = slog.Default()
	}
	return &Recorder{model: m, w: w, log: log}
}

// OpenRecorder returns a Recorder appending to the file at path (created if needed).
// Close closes the file.
func OpenRecorder(m Model, path string, log *slog.Logger) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("planner: recorder: %w", err)
	}
	r := NewRecorder(m, f, log)
	r.c = f
	return r, nil
}

// Complete calls the wrapped model and records the exchange when it succeeds.
func (r *Recorder) Complete(ctx context.Context, req Request) (Response, error) {
	resp, err := r.model.Complete(ctx, req)
	if err != nil {
		return resp, err
	}
	line, merr := json.Marshal(Exchange{
		RunID: req.RunID, Step: req.Step,
		Request:  ExchangeRequest{Model: req.Model, Messages: req.Messages, Tools: req.Tools},
		Response: ExchangeResponse{Message: resp.Message, Usage: resp.Usage, Model: resp.Model},
	})
	if merr == nil {
		line = append(line, '\n')
		r.mu.Lock()
		_, merr = r.w.Write(line)
		r.mu.Unlock()
	}
	if merr != nil {
		r.log.Error("planner: recording a model exchange failed", "run_id", req.RunID, "step", req.Step, "error", merr)
	}
	return resp, nil
}

// Close closes the cassette file of a Recorder made by OpenRecorder.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == nil {
		return nil
	}
	err := r.c.Close()
	r.c = nil
	return err
}

// Replay is a Model that answers from a cassette, with no network. It is safe for
// concurrent use.
//
// Matching: a request whose run id is in the cassette is answered by that run's
// exchange for the request's step. A request of any other run is bound, at its first
// request, to a recorded run (the first run not yet bound, cycling when there are more
// runs than recordings), then answered by that run's exchanges for each step; so the
// n-th new run replays the n-th recorded run. When a recorded run holds several
// exchanges for a step (a retried step), successive requests for that step get them in
// order, the last one repeating. A step with no recorded answer fails with an error
// wrapping ErrPermanent.
type Replay struct {
	runs  []string                      // recorded run ids, in order of first appearance
	steps map[string]map[int][]Exchange // run id -> step -> exchanges

	mu      sync.Mutex
	bound   map[string]string // request run id -> recorded run id
	foreign int               // runs bound to a recording of another run id
	calls   map[string]int    // request run id + step -> requests served

	// name is the model name the answers carry: replay:<cassette> (OpenReplay), else
	// the recorded one.
	name string
}

var _ Model = (*Replay)(nil)

// OpenReplay loads the cassette at path.
func OpenReplay(path string) (*Replay, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("planner: replay: %w", err)
	}
	defer f.Close()
	r, err := NewReplay(f)
	if err != nil {
		return nil, fmt.Errorf("%w (cassette %s)", err, path)
	}
	r.name = "replay:" + path // what serves the run, not the model recorded in it
	return r, nil
}

// NewReplay loads a cassette from r. Blank lines are skipped; a line that is not an
// Exchange is an error.
func NewReplay(r io.Reader) (*Replay, error) {
	rp := &Replay{steps: map[string]map[int][]Exchange{}, bound: map[string]string{}, calls: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(trimSpace(line)) == 0 {
			continue
		}
		var ex Exchange
		if err := json.Unmarshal(line, &ex); err != nil {
			return nil, fmt.Errorf("planner: replay: line %d: %w", n, err)
		}
		if ex.Step < 0 {
			return nil, fmt.Errorf("planner: replay: line %d: negative step %d", n, ex.Step)
		}
		byStep, ok := rp.steps[ex.RunID]
		if !ok {
			byStep = map[int][]Exchange{}
			rp.steps[ex.RunID] = byStep
			rp.runs = append(rp.runs, ex.RunID)
		}
		byStep[ex.Step] = append(byStep[ex.Step], ex)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("planner: replay: %w", err)
	}
	return rp, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	return b
}

// Complete answers req from the cassette.
func (r *Replay) Complete(ctx context.Context, req Request) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, err
	}
	r.mu.Lock()
	rec, ok := r.bound[req.RunID]
	if !ok {
		if len(r.runs) == 0 {
			r.mu.Unlock()
			return Response{}, Permanent(errors.New("replay: the cassette is empty"))
		}
		if _, own := r.steps[req.RunID]; own {
			rec = req.RunID
		} else {
			rec = r.runs[r.foreign%len(r.runs)]
			r.foreign++
		}
		r.bound[req.RunID] = rec
	}
	exs := r.steps[rec][req.Step]
	key := fmt.Sprintf("%s\x00%d", req.RunID, req.Step)
	n := r.calls[key]
	r.calls[key] = n + 1
	r.mu.Unlock()

	if len(exs) == 0 {
		return Response{}, Permanent(fmt.Errorf("replay: no recorded answer for step %d of run %s (replaying recorded run %q)", req.Step, req.RunID, rec))
	}
	ex := exs[min(n, len(exs)-1)]
	msg := ex.Response.Message
	msg.ToolCalls = slices.Clone(msg.ToolCalls) // the planner normalizes ids in place
	if msg.Role == "" {
		msg.Role = toolbus.RoleAssistant
	}
	model := cmp.Or(r.name, ex.Response.Model, "replay")
	return Response{Message: msg, Usage: ex.Response.Usage, Model: model}, nil
}
