package worker

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// TestQuestionStateRefusalSaysWhy: a team's executor asking the core the state of a
// question while nothing answers is told what the server's answer can mean, from what it
// really returns in the accounts layout (no responders, both on its own tool's subject
// with no injector serving the read service and on a subject its account does not
// import): no injector serves the read service (`toolbus injector`), or the account does
// not import it (`toolbus admin push`); no longer "is an injector running?" alone.
// CONTROL: the same request on the team's own subject is answered once the core serves it.
func TestQuestionStateRefusalSaysWhy(t *testing.T) {
	srv := intaketest.StartTeams(t, map[string][]string{"alpha": {"pick"}, "beta": {"other"}})
	alpha := eventstest.Connect(t, srv, "alpha")
	core := eventstest.Connect(t, srv, "core")
	ask := func(tool string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := alpha.RequestWithContext(ctx, events.ToolQuestionSubject(tool), []byte(`{}`))
		if err != nil {
			return questionStateRefusal(tool, err)
		}
		return nil
	}
	for _, tool := range []string{"pick", "other"} {
		err := ask(tool)
		if err == nil || !strings.Contains(err.Error(), "nothing answers "+events.ToolQuestionSubject(tool)) ||
			!strings.Contains(err.Error(), "toolbus injector") || !strings.Contains(err.Error(), "toolbus admin push") {
			t.Errorf("question state of %s: %v, want what nothing answering means and what to run", tool, err)
		}
	}
	// The control: served in the core, alpha's request on its own tool's subject is answered.
	sub, err := core.Subscribe(events.ToolQuestionSubject("pick"), func(m *nats.Msg) {
		b, _ := json.Marshal(events.QuestionState{Asked: true})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := core.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := ask("pick"); err != nil {
		t.Fatalf("the control: alpha's question state with the core answering: %v", err)
	}
}
