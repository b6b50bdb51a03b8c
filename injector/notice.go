package injector

import (
	"context"
	"encoding/json"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// publishOutcome publishes a run's outcome and, for a run that ended otherwise than
// completed (its calls may still run), tells the executors of the tools its last step
// called (events.SubjectRunEndedFor). Executors in the core account hear the outcome
// and the run.cancel themselves; those in team accounts hear only these notices, which
// name no other team's tools. The notices are core NATS and best effort, as hearing the
// outcome is: a call that runs on still gets its one result, which the ended run
// ignores.
func (in *Injector) publishOutcome(ctx context.Context, st store.RunState) error {
	if err := in.bus.PublishOutcome(ctx, in.source, st); err != nil {
		return err
	}
	if !st.Status.Terminal() || st.Status == toolbus.RunCompleted {
		return nil
	}
	calls, err := in.stepCalls(ctx, st.RunID, st.Step)
	if err != nil {
		in.log.Debug("run ended: its calls are not known, no notice to their executors", "run_id", st.RunID, "error", err)
		return nil
	}
	body, _ := json.Marshal(events.RunEndedNotice{RunID: st.RunID, Status: st.Status}) // plain data
	seen := map[string]bool{}
	for _, c := range calls {
		subj := events.SubjectRunEndedFor(st.RunID, c.Tool)
		if seen[subj] {
			continue
		}
		seen[subj] = true
		if err := in.bus.Conn().Publish(subj, body); err != nil {
			in.log.Debug("run ended: notice not sent", "run_id", st.RunID, "subject", subj, "error", err)
		}
	}
	return nil
}
