package e2e_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

// hugeModel answers every request with a final answer of size bytes, counting calls.
type hugeModel struct {
	size  int
	calls atomic.Int32
}

func (m *hugeModel) Complete(context.Context, planner.Request) (planner.Response, error) {
	m.calls.Add(1)
	return planner.Response{Model: "huge", Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: strings.Repeat("x", m.size)}}, nil
}

// TestOversizedAnswerCallsModelOnce: a model answer larger than the bus can record (2 MiB
// over the server's 1 MiB max_payload) ends the run failed with model_answer_too_large
// after one model call; before, each retry of the step called (and paid) the model again
// until the deliveries ran out.
func TestOversizedAnswerCallsModelOnce(t *testing.T) {
	t.Parallel()
	m := &hugeModel{size: 2 << 20}
	s := newStack(t, m)
	s.startAll()
	s.submit("huge-answer", toolbus.Limits{})
	ended := s.waitEnd("huge-answer")
	if ended.Status != toolbus.RunFailed || ended.Code != toolbus.CodeModelAnswerTooLarge {
		t.Fatalf("run ended %s/%s (%s), want failed/%s", ended.Status, ended.Code, ended.Reason, toolbus.CodeModelAnswerTooLarge)
	}
	if n := m.calls.Load(); n != 1 {
		t.Fatalf("the model was called %d times, want once", n)
	}
}
