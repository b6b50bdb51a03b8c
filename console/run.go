package console

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events/store"
)

// The run page: the outcome, the decisions waiting, the timeline on a time axis, each
// call's detail and the transcript. It is audit.Analyze over the run's events (the same
// audit as `toolbus replay`), placed on the run's axis: while the run is active the axis
// ends now, so running calls and waits grow until their end.

// bar places a span on the run's time axis, in percent.
type bar struct {
	Left, Width float64
}

// consoleCall is one call of a step, on the timeline and in detail.
type consoleCall struct {
	audit.CallLayout
	// Bar spans the whole call; Wait the wait for a decision (Waited calls), Exec the
	// execution after it (from the request to the result, or to now while it runs).
	Bar, Wait, Exec bar
	HasWait         bool
	HasExec         bool
	// WaitMS is how long the call waited for a decision (so far, while Waiting).
	WaitMS int64
	// Waiting: the call waits for a decision now. Running: it was requested and has no
	// result yet.
	Waiting, Running bool
	// Queued says why the fair scheduler still holds the call (fairheld.go): it
	// reached no executor yet ("" when it is not held).
	Queued string
	// Since is when the current wait or execution started (the page counts from it).
	Since      time.Time
	FullOutput string
	OutputErr  string
}

// consoleStep is one step: the model call, then its calls.
type consoleStep struct {
	N         int
	Model     bar
	ModelMS   int64
	Responded bool
	// ModelSince is when the model was asked (the page counts from it until it answers).
	ModelSince time.Time
	Calls      []*consoleCall
}

// runView is the run page.
type runView struct {
	R       *audit.Report
	Steps   []*consoleStep
	Waiting []toolbus.ToolCall
	// Questions are the calls' questions waiting for an answer (question.go).
	Questions []questionView
	Active    bool
	// Duration is the run's length once it ended; an active run shows the time since
	// R.StartedAt, which the page keeps counting.
	Duration string
	Axis     []tick
}

func (c *server) runPage(w http.ResponseWriter, r *http.Request) {
	run := r.PathValue("run")
	if !toolbus.ValidRunID(run) {
		http.Error(w, "invalid run id", http.StatusBadRequest)
		return
	}
	if !c.mustSee(w, r, run) {
		return
	}
	v := viewerOf(r)
	var decides, answers map[string]bool
	canCancel := false
	var view *runView
	err := c.hub.read(r.Context(), func(ctx context.Context) error {
		evs, err := c.hub.runEvents(ctx, c.bus, run)
		if err != nil || len(evs) == 0 {
			return err
		}
		principal, err := c.principalOf(ctx, run)
		if err != nil {
			return err
		}
		rd, err := c.readingOf(ctx, v, run)
		if err != nil {
			return err
		}
		evs = rd.events(evs)
		rep := audit.Analyze(run, evs)
		view = &runView{R: rep, Active: !rep.Status.Terminal()}
		st, _, stErr := c.bus.Store().RunState(ctx, run)
		if stErr == nil && st.Status == toolbus.RunWaitingForApproval && st.Ended != nil {
			view.Waiting = rd.calls(st.Ended.Pending)
		} else if rep.Status == toolbus.RunWaitingForApproval {
			view.Waiting = rep.Pending
		}
		var span int64
		decides = c.deciders(ctx, v, principal, view.Waiting)
		view.Questions = openQuestions(evs)
		answers = c.deciders(ctx, v, principal, askers(view.Questions))
		canCancel, _ = v.mayCancel(principal)
		view.Steps, span = c.steps(ctx, rep, time.Now())
		view.Axis = axis(span)
		if !view.Active {
			view.Duration = ms(rep.DurationMS)
		}
		return nil
	})
	if err != nil {
		c.fail(w, err)
		return
	}
	if view == nil {
		http.Error(w, fmt.Sprintf("run %s not found", run), http.StatusNotFound)
		return
	}
	data := c.pageData(r, map[string]any{"V": view, "R": view.R, "Decides": decides, "Answers": answers})
	data["CanCancel"] = data["CanAct"] == true && canCancel
	c.render(w, "run.html", data)
}

// callTimes are the moments of one call on the run's axis (milliseconds from its start;
// -1 when it has not happened). A call that needs approval is requested, then waits,
// then (granted) is requested again: its execution starts at the request after the
// decision.
type callTimes struct {
	waiting, decided, requested, finished int64
	requests                              []int64
}

// execStart is when the call's execution began: its first request, or for a call that
// waited, its first request after the decision (-1: not yet).
func (t *callTimes) execStart() int64 {
	if t.waiting < 0 {
		return t.requested
	}
	if t.decided < 0 {
		return -1
	}
	for _, r := range t.requests {
		if r >= t.decided {
			return r
		}
	}
	return -1
}

// timesOf reads when each call waited, was decided, requested and finished.
func timesOf(rep *audit.Report) map[[2]string]*callTimes {
	out := map[[2]string]*callTimes{}
	get := func(step int, call string) *callTimes {
		k := [2]string{itoa(step), call}
		t := out[k]
		if t == nil {
			t = &callTimes{waiting: -1, decided: -1, requested: -1, finished: -1}
			out[k] = t
		}
		return t
	}
	first := func(p *int64, v int64) {
		if *p < 0 {
			*p = v
		}
	}
	for _, e := range rep.Timeline {
		if e.CallID == "" {
			continue
		}
		t := get(e.Step, e.CallID)
		switch e.Type {
		case "tool.waiting":
			first(&t.waiting, e.AtMS)
		case "approval.granted", "approval.denied":
			first(&t.decided, e.AtMS)
		case "tool.requested":
			first(&t.requested, e.AtMS)
			t.requests = append(t.requests, e.AtMS)
		case "tool.finished":
			first(&t.finished, e.AtMS)
		}
	}
	return out
}

// steps places the report's layout on the page's time axis, in percent, with the waits
// and executions of each call and the full output of truncated results. While the run
// is active the axis ends at now; it returns the axis' length in milliseconds.
func (c *server) steps(ctx context.Context, rep *audit.Report, now time.Time) ([]*consoleStep, int64) {
	layout, span := rep.Layout()
	active := !rep.Status.Terminal()
	end := span
	if active && !rep.StartedAt.IsZero() {
		end = max(span, now.Sub(rep.StartedAt).Milliseconds())
	}
	span = max(end, 1)
	at := func(v int64) time.Time { return rep.StartedAt.Add(time.Duration(v) * time.Millisecond) }
	pos := func(from, to int64) bar {
		to = max(to, from)
		return bar{Left: float64(from) * 100 / float64(span), Width: max(0.5, float64(to-from)*100/float64(span))}
	}
	times := timesOf(rep)
	holds := newFairHolds(c.bus)
	out := make([]*consoleStep, 0, len(layout))
	for _, sl := range layout {
		s := &consoleStep{N: sl.N, Responded: sl.Responded}
		if sl.Requested {
			to := sl.ModelTo
			if !sl.Responded {
				to = end
				s.ModelSince = at(sl.ModelFrom)
			}
			s.Model, s.ModelMS = pos(sl.ModelFrom, to), to-sl.ModelFrom
		}
		for _, cl := range sl.Calls {
			if cl.Running {
				cl.End = end
			}
			cc := &consoleCall{CallLayout: cl, Bar: pos(cl.Start, cl.End)}
			t := times[[2]string{itoa(cl.Step), cl.CallID}]
			if t == nil {
				t = &callTimes{waiting: -1, decided: -1, requested: -1, finished: -1}
			}
			if cl.Waited && t.waiting >= 0 {
				waitEnd := t.decided
				if waitEnd < 0 {
					waitEnd = t.finished
				}
				if waitEnd < 0 {
					waitEnd = end
					cc.Waiting = cl.Result == nil
					cc.Since = at(t.waiting)
				}
				cc.HasWait, cc.Wait, cc.WaitMS = true, pos(t.waiting, waitEnd), waitEnd-t.waiting
			}
			if from := t.execStart(); from >= 0 {
				execEnd := t.finished
				if execEnd < 0 || cl.Result == nil {
					execEnd = end
					cc.Running = active
					cc.Since = at(from)
				}
				cc.HasExec, cc.Exec = true, pos(from, execEnd)
			}
			cc.Waiting = cc.Waiting && active
			switch {
			case cl.Result != nil:
			case cc.Running:
				cc.Status = "running"
				if cc.Queued = holds.queued(ctx, rep.Principal, cl.Tool, rep.RunID, cl.Step, cl.CallID); cc.Queued != "" {
					cc.Status = "queued"
				}
			case cc.Waiting:
				cc.Status = "waiting"
			case !active:
				cc.Status = "unfinished" // the run ended before the call's result
			}
			c.fullOutput(ctx, rep.RunID, cc)
			s.Calls = append(s.Calls, cc)
		}
		out = append(out, s)
	}
	return out, span
}

// fullOutput reads the whole output of a truncated result from the outputs bucket: only
// the output of the call itself (store.CallOutput), as the run's record names it.
func (c *server) fullOutput(ctx context.Context, run string, cc *consoleCall) {
	rc := cc.Result
	if rc == nil || rc.Truncated == nil || rc.Truncated.Ref == "" {
		return
	}
	owner := store.OutputOwner{Tool: cc.Tool, Run: run, Step: cc.Step, CallID: cc.CallID}
	data, err := c.bus.Store().CallOutput(ctx, owner, rc.Truncated.Ref, -1)
	if err != nil {
		cc.OutputErr = err.Error()
		return
	}
	if len(data) > consoleMaxOutput {
		data = data[:consoleMaxOutput]
	}
	cc.FullOutput = string(data)
}
