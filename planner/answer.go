package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/store"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// A step's answer: the one already recorded, else the model's (with the bytes of the
// attachments it may read) or a pre-planned run's, bounded by what the store can record.

// answer returns the step's assistant message, recorded: the one already recorded (a
// redelivery or a duplicate request: the model is called once per step), the
// pre-planned calls of a run that has them, or the model's answer. got reports that
// the model was not called. errEndedHere: it ended the run (p.fail, answerTooLarge).
func (p *Planner) answer(ctx context.Context, span trace.Span, rs *toolbus.RunStarted, step int, view stepView, recorded *toolbus.ModelResponded) (mr toolbus.ModelResponded, got bool, err error) {
	run := rs.RunID
	// Reuse what the model already said for this step, if it was recorded (a redelivery,
	// or a duplicate request): the model is called once per step.
	if recorded != nil {
		mr, got = *recorded, true
	}
	if !got && len(rs.Calls) > 0 {
		// A pre-planned run: its calls are step 0, and no model is ever called.
		mr = prePlanned(rs, step)
		wctx, cancel := context.WithTimeout(ctx, busWriteTimeout)
		mr, _, err = p.bus.Store().PutAssistant(wctx, mr)
		cancel()
		if err != nil {
			return mr, got, err
		}
		got = true
	}
	if !got {
		if mr, err = p.callModel(ctx, rs, step, view); err != nil {
			if rec, ok := p.recordedAfterAll(ctx, view, run, step); ok {
				return rec, true, nil
			}
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.String("error.type", toolbus.CodeModelError))
			if errors.Is(err, ErrPermanent) {
				return mr, got, endedHere(p.fail(ctx, run, step, toolbus.CodeModelError, err.Error()))
			}
			return mr, got, err
		}
		// An answer the bus cannot record would fail every retry of the step, each
		// retry paying the model again: the run ends now.
		if limit := p.maxAnswer(); limit > 0 {
			if b, merr := json.Marshal(mr); merr == nil && len(b) > limit {
				if rec, ok := p.recordedAfterAll(ctx, view, run, step); ok {
					return rec, true, nil
				}
				return mr, got, endedHere(p.answerTooLarge(ctx, run, step, len(b), limit))
			}
		}
		// The first recorded answer wins (another planner may have raced us).
		wctx, cancel := context.WithTimeout(ctx, busWriteTimeout)
		mr, _, err = p.bus.Store().PutAssistant(wctx, mr)
		cancel()
		if err != nil {
			if tooLarge(err) {
				return mr, got, endedHere(p.answerTooLarge(ctx, run, step, 0, p.maxAnswer()))
			}
			return mr, got, err
		}
	}
	return mr, got, nil
}

// recordedAfterAll returns the answer recorded for step when the view was not read
// (viewless) and the model call failed or its answer cannot be recorded: the request may
// have been a duplicate of an answered step, whose recorded answer stands, so a failure
// of the extra model call must not end the run or hold the step.
func (p *Planner) recordedAfterAll(ctx context.Context, view stepView, run string, step int) (toolbus.ModelResponded, bool) {
	if !view.skipped {
		return toolbus.ModelResponded{}, false
	}
	mr, err := p.bus.Store().Assistant(ctx, run, step)
	return mr, err == nil
}

func (p *Planner) callModel(ctx context.Context, rs *toolbus.RunStarted, step int, view stepView) (toolbus.ModelResponded, error) {
	msgs, err := p.history(ctx, rs.RunID, step, view)
	if err != nil {
		return toolbus.ModelResponded{}, err
	}
	msgs = p.attachmentBytes(ctx, rs, msgs)
	mctx, cancel := context.WithTimeout(ctx, p.cfg.ModelTimeout)
	defer cancel()
	if !rs.Limits.Deadline.IsZero() {
		var c2 context.CancelFunc
		mctx, c2 = context.WithDeadline(mctx, rs.Limits.Deadline)
		defer c2()
	}
	model := p.model
	if rs.Model != "" && p.cfg.Models != nil {
		if model, err = p.cfg.Models(rs.Model); err != nil {
			// Retrying cannot help: the planner is configured as it is.
			return toolbus.ModelResponded{}, Permanent(fmt.Errorf("planner: run %s names model %q, which this planner cannot serve: %w", rs.RunID, rs.Model, err))
		}
	}
	start := time.Now()
	resp, err := model.Complete(mctx, Request{
		RunID: rs.RunID, Step: step, Model: rs.Model, Messages: msgs, Tools: p.catalog.Tools(rs),
	})
	// Labelled by the run's model, not the response's: the run's is the configured name
	// (a bounded set) and is known when the call fails.
	p.cfg.Metrics.ModelCalled(rs.Model, time.Since(start), resp.Usage, err)
	if err != nil {
		return toolbus.ModelResponded{}, fmt.Errorf("planner: model call for %s step %d: %w", rs.RunID, step, err)
	}
	resp.Message.Role = toolbus.RoleAssistant
	resp.Message.ToolCalls = NormalizeCallIDs(step, resp.Message.ToolCalls)
	return toolbus.ModelResponded{
		RunID: rs.RunID, Step: step, Message: resp.Message, Usage: resp.Usage,
		Model: resp.Model, LatencyMS: time.Since(start).Milliseconds(),
	}, nil
}

// MaxModelAttachmentBytes bounds the bytes of the attachments kept by reference that
// the planner reads for one model request; past it, and for one it cannot read, the
// adapter gets no bytes and describes the attachment.
const MaxModelAttachmentBytes = 32 << 20

// attachmentBytes returns msgs with the bytes of the attachments kept in the outputs
// bucket (Ref, no Data) read from there, within MaxModelAttachmentBytes; msgs itself
// is not changed (the history is cached). A reference is read only as its call's own
// (store.CallOutput): each step's messages are its assistant message, then its tool
// messages, so a tool message's step is the count of assistant messages after the
// run's own messages; a reference in the run's own messages (the client's) is never
// read.
func (p *Planner) attachmentBytes(ctx context.Context, rs *toolbus.RunStarted, msgs []toolbus.Message) []toolbus.Message {
	budget := MaxModelAttachmentBytes
	var out []toolbus.Message
	step := -1
	for i, m := range msgs {
		if i < len(rs.Messages) {
			continue
		}
		if m.Role == toolbus.RoleAssistant {
			step++
		}
		cloned := false
		for j, a := range m.Attachments {
			if a.Ref == "" || len(a.Data) > 0 || a.Size > budget || m.Role != toolbus.RoleTool {
				continue
			}
			owner := store.OutputOwner{Tool: m.Name, Run: rs.RunID, Step: step, CallID: m.ToolCallID}
			data, err := p.bus.Store().CallOutput(ctx, owner, a.Ref, j)
			if err != nil {
				p.log.Warn("attachment not read for the model: it is described instead", "run_id", rs.RunID, "ref", a.Ref, "error", err)
				continue
			}
			budget -= len(data)
			if out == nil {
				out = slices.Clone(msgs)
			}
			if !cloned {
				out[i].Attachments, cloned = slices.Clone(m.Attachments), true
			}
			out[i].Attachments[j].Data = data
		}
	}
	if out == nil {
		return msgs
	}
	return out
}

// prePlannedModel names the "model" of the steps of a pre-planned run.
const prePlannedModel = "toolbus/pre-planned"

// prePlanned returns the assistant message of a step of a pre-planned run (one with
// RunStarted.Calls): step 0 asks for the run's calls; any later step answers with no
// call, which ends the run completed.
func prePlanned(rs *toolbus.RunStarted, step int) toolbus.ModelResponded {
	msg := toolbus.Message{Role: toolbus.RoleAssistant}
	if step == 0 {
		msg.ToolCalls = NormalizeCallIDs(0, append([]toolbus.ToolCall(nil), rs.Calls...))
	} else {
		msg.Content = fmt.Sprintf("pre-planned run: %d call(s) answered", len(rs.Calls))
	}
	return toolbus.ModelResponded{RunID: rs.RunID, Step: step, Message: msg, Model: prePlannedModel}
}

// maxAnswer is the largest model answer (JSON bytes) the planner records: the server's
// max_payload less AnswerHeadroom, or Config.MaxAnswerBytes when smaller; 0 when
// neither is known.
func (p *Planner) maxAnswer() int {
	limit := int(p.bus.Conn().MaxPayload()) - AnswerHeadroom
	if p.cfg.MaxAnswerBytes > 0 && (limit <= 0 || p.cfg.MaxAnswerBytes < limit) {
		limit = p.cfg.MaxAnswerBytes
	}
	return max(limit, 0)
}

// answerTooLarge ends a run whose model answer cannot be recorded (size 0: the store
// refused it).
func (p *Planner) answerTooLarge(ctx context.Context, run string, step, size, limit int) error {
	what := "is larger than"
	if size > 0 {
		what = fmt.Sprintf("is %d bytes, over", size)
	}
	return p.fail(ctx, run, step, toolbus.CodeModelAnswerTooLarge,
		fmt.Sprintf("the model's answer at step %d %s the %d bytes the bus can record (TOOLBUS_MAX_ANSWER_BYTES); it is not asked again", step, what, limit))
}

// tooLarge reports whether a store error says the message exceeds what the server
// accepts.
func tooLarge(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum)
}
