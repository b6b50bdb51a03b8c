package audit

import "sort"

// StepLayout is one step of a run on its time axis (milliseconds from run.started): the
// model call, then its calls. It is the run model of the web console.
type StepLayout struct {
	N int
	// ModelFrom and ModelTo bound the model call (Requested); ModelTo is the end of the
	// axis while the model has not answered (Responded false).
	ModelFrom, ModelTo int64
	Requested          bool
	Responded          bool
	// Calls are the step's calls in call order.
	Calls []CallLayout
}

// CallLayout is one call of a step on the run's time axis.
type CallLayout struct {
	Call
	// Start is the call's first request (or wait for approval); End its first result,
	// or the end of the axis while it has none (Running).
	Start, End int64
	Running    bool
	// Status is the result's status; "waiting" while it waits for a decision, else
	// "pending". Code is the result's code.
	Status string
	Code   string
}

// Layout lays the report's steps and calls out on the run's time axis, in step order;
// span is the axis' length in milliseconds (at least 1).
func (r *Report) Layout() (steps []StepLayout, span int64) {
	span = 1
	for _, e := range r.Timeline {
		span = max(span, e.AtMS)
	}
	byStep := map[int]*StepLayout{}
	stepOf := func(n int) *StepLayout {
		s := byStep[n]
		if s == nil {
			s = &StepLayout{N: n}
			byStep[n] = s
		}
		return s
	}
	start, end := map[callKey]int64{}, map[callKey]int64{}
	modelStart, modelEnd := map[int]int64{}, map[int]int64{}
	for _, e := range r.Timeline {
		switch e.Type {
		case "model.requested":
			stepOf(e.Step)
			if _, ok := modelStart[e.Step]; !ok {
				modelStart[e.Step] = e.AtMS
			}
		case "model.responded":
			modelEnd[e.Step] = e.AtMS
		case "tool.requested", "tool.waiting":
			k := callKey{e.Step, e.CallID}
			if _, ok := start[k]; !ok {
				start[k] = e.AtMS
			}
		case "tool.finished":
			k := callKey{e.Step, e.CallID}
			if _, ok := end[k]; !ok {
				end[k] = e.AtMS
			}
		}
	}
	for n, from := range modelStart {
		s := stepOf(n)
		to, ok := modelEnd[n]
		s.Responded = ok
		if !ok {
			to = span
		}
		s.Requested, s.ModelFrom, s.ModelTo = true, from, to
	}
	for _, rc := range r.Calls {
		s := stepOf(rc.Step)
		k := callKey{rc.Step, rc.CallID}
		cl := CallLayout{Call: rc, Start: start[k], Status: "pending"}
		if e, ok := end[k]; ok {
			cl.End = e
		} else {
			cl.End, cl.Running = span, true
		}
		if rc.Waited && rc.Decision == "" {
			cl.Status = "waiting"
		}
		if rc.Result != nil {
			cl.Status, cl.Code = string(rc.Result.Status), rc.Result.Code()
		}
		s.Calls = append(s.Calls, cl)
	}
	steps = make([]StepLayout, 0, len(byStep))
	for _, s := range byStep {
		sort.SliceStable(s.Calls, func(i, j int) bool { return s.Calls[i].Index < s.Calls[j].Index })
		steps = append(steps, *s)
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].N < steps[j].N })
	return steps, span
}
