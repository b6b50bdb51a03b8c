package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// What a result keeps beside its event (an output or attachments too large for it go to
// the outputs bucket) and whether the stream already holds it.

// keepLargeOutput moves an output too large for an event to the outputs bucket, under
// the key prefix of the call's queue.
func (w *Worker) keepLargeOutput(ctx context.Context, queue string, req toolbus.ToolRequested, res *toolbus.ToolResult) error {
	if err := w.keepLargeAttachments(ctx, queue, req, res); err != nil {
		return err
	}
	if len(res.Output) <= w.cfg.InlineOutputMax {
		return nil
	}
	ref, err := w.bus.Store().PutOutput(ctx, queue, req.RunID, req.Step, req.Call.CallID, res.Output)
	if errors.Is(err, store.ErrOutputsFull) {
		// Not retried: a full bucket does not empty itself within a lease, and waiting
		// would stall this call and every call with a large output. The result goes out
		// without the whole output (no ref); the model reads its bounded content as ever.
		w.log.Warn("large output not kept: the outputs bucket is full", "run_id", req.RunID, "call_id", req.Call.CallID,
			"tool", req.Call.Tool, "bytes", len(res.Output), "error", err)
		ref, err = "", nil
	}
	if err != nil {
		return err
	}
	if res.Truncated == nil {
		res.Truncated = &toolbus.Truncation{OriginalBytes: len(res.Output), KeptBytes: len(res.Content)}
	}
	res.Truncated.Ref = ref
	res.Output = nil
	return nil
}

// keepLargeAttachments moves to the outputs bucket the attachments that do not fit in
// the event beside the output: the attachments travel inline while the output and the
// inline attachments hold at most InlineOutputMax bytes in all.
func (w *Worker) keepLargeAttachments(ctx context.Context, queue string, req toolbus.ToolRequested, res *toolbus.ToolResult) error {
	inline := min(len(res.Output), w.cfg.InlineOutputMax)
	for i := range res.Attachments {
		a := &res.Attachments[i]
		if a.Ref != "" || inline+len(a.Data) <= w.cfg.InlineOutputMax {
			inline += len(a.Data)
			continue
		}
		ref, err := w.bus.Store().PutAttachment(ctx, queue, req.RunID, req.Step, req.Call.CallID, i, a.Data)
		if errors.Is(err, store.ErrOutputsFull) {
			// As a large output (keepLargeOutput): the result goes out with the
			// attachment described (no bytes, no ref) rather than waiting for room.
			w.log.Warn("large attachment not kept: the outputs bucket is full", "run_id", req.RunID, "call_id", req.Call.CallID,
				"tool", req.Call.Tool, "attachment", i, "bytes", len(a.Data), "error", err)
			a.Data = nil
			continue
		}
		if err != nil {
			return err
		}
		a.Ref, a.Data = ref, nil
	}
	return nil
}

// resultStored reports whether the stream already holds the tool.finished of req. It
// walks the results of the run's tool with direct gets (next message on the subject):
// an executor's credentials may not create consumers on the event stream.
func (w *Worker) resultStored(ctx context.Context, queue string, req toolbus.ToolRequested) (bool, error) {
	_, stored, err := w.bus.Stored(ctx, events.ToolFinishedEventOn(w.source, toolbus.ToolFinished{RunID: req.RunID, Step: req.Step,
		CallIndex: req.CallIndex, CallCount: req.CallCount, ToolResult: toolbus.ToolResult{CallID: req.Call.CallID, Tool: req.Call.Tool}}, queue))
	if err != nil {
		return false, fmt.Errorf("executor: look up stored result: %w", err)
	}
	return stored, nil
}
