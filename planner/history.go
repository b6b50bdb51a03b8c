package planner

import (
	"context"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
)

// What the model is shown of a run: the messages of its steps so far, read from the
// history store once and then cached per run until the run ends.

// runHistory caches what the planner knows of a run: the messages of steps < upTo,
// the usage of those steps, and the assistant message it recorded for step upTo.
type runHistory struct {
	upTo         int
	msgs         []toolbus.Message
	usage        toolbus.Usage
	pending      *toolbus.Message
	pendingUsage toolbus.Usage
}

// history returns the messages before step, from the cache when it holds the steps
// before, else from the history store. The results of the step before come from the
// request (view.carried) when they answer the calls of the assistant message cached for
// that step, else from the view read (view.prev), else from the store.
func (p *Planner) history(ctx context.Context, run string, step int, view stepView) ([]toolbus.Message, error) {
	p.mu.Lock()
	h := p.cache[run]
	var (
		msgs  []toolbus.Message
		upTo  int
		asst  *toolbus.Message
		usage toolbus.Usage
	)
	if h != nil && h.upTo <= step {
		msgs, upTo, asst, usage = h.msgs[:len(h.msgs):len(h.msgs)], h.upTo, h.pending, h.usage.Add(h.pendingUsage)
	}
	p.mu.Unlock()
	if h == nil || h.upTo > step {
		all, err := runlog.History(ctx, p.bus, run, step)
		if err != nil {
			return nil, err
		}
		u, err := p.bus.Store().UsageSoFar(ctx, run, step)
		if err != nil {
			return nil, err
		}
		p.remember(run, &runHistory{upTo: step, msgs: all, usage: u})
		return all, nil
	}
	for s := upTo; s < step; s++ {
		if s == upTo && asst != nil {
			// The assistant message of the step this planner planned is already known:
			// only its results are read.
			msgs = append(msgs, *asst)
			if len(asst.ToolCalls) > 0 {
				if s == step-1 && answers(view.carried, asst.ToolCalls) {
					// The request carried them: nothing is read.
					msgs = append(msgs, toolMessages(view.carried)...)
					continue
				}
				var (
					rec *store.StepRecord
					err error
				)
				if prev := view.prev; prev.Prev != nil && prev.Prev.Step == s {
					rec, err = p.bus.Store().AssemblePlanView(ctx, prev) // its join state and results were just read
				} else {
					rec, _, err = p.bus.Store().Step(ctx, run, s)
				}
				if err != nil {
					return nil, err
				}
				msgs = append(msgs, rec.ToolMessages()...)
			}
			continue
		}
		more, err := p.bus.Store().StepMessages(ctx, run, s)
		if err != nil {
			return nil, err
		}
		mr, err := p.bus.Store().Assistant(ctx, run, s)
		if err != nil {
			return nil, err
		}
		usage = usage.Add(mr.Usage)
		msgs = append(msgs, more...)
	}
	p.remember(run, &runHistory{upTo: step, msgs: msgs, usage: usage})
	return msgs, nil
}

// rememberAssistant keeps the assistant message of step for the next step's history.
// The history before step 0 is the run's input, known without a read: step 0 starts the
// cache of a run even when no model was called (a pre-planned run), so that the next
// step can be planned from the cache and the results its request carries.
func (p *Planner) rememberAssistant(rs *toolbus.RunStarted, step int, mr toolbus.ModelResponded) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.cache[rs.RunID]
	if h == nil && step == 0 {
		h = &runHistory{msgs: append([]toolbus.Message(nil), rs.Messages...)}
		p.rememberLocked(rs.RunID, h)
	}
	if h != nil && h.upTo == step {
		h.pending, h.pendingUsage = &mr.Message, mr.Usage
	}
}

// usage returns the run's usage up to and including step, whose usage is u.
func (p *Planner) usage(ctx context.Context, run string, step int, u toolbus.Usage) (toolbus.Usage, error) {
	p.mu.Lock()
	h := p.cache[run]
	if h != nil && h.upTo == step {
		total := h.usage.Add(u)
		p.mu.Unlock()
		return total, nil
	}
	p.mu.Unlock()
	before, err := p.bus.Store().UsageSoFar(ctx, run, step)
	if err != nil {
		return toolbus.Usage{}, err
	}
	return before.Add(u), nil
}

func (p *Planner) remember(run string, h *runHistory) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rememberLocked(run, h)
}

func (p *Planner) rememberLocked(run string, h *runHistory) {
	if len(p.cache) >= 4096 {
		clear(p.cache) // bounded; entries reload from the store
	}
	p.cache[run] = h
}

func (p *Planner) forget(run string) {
	p.mu.Lock()
	delete(p.cache, run)
	p.mu.Unlock()
}
