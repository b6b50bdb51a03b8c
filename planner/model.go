package planner

import (
	"context"
	"errors"

	"github.com/toolbus/toolbus"
)

// Request is what the planner asks a model for one step.
type Request struct {
	RunID string
	Step  int
	// Model is the run's model name (may be empty: the adapter's default).
	Model string
	// Messages is the history: input messages, then each step's assistant message whole
	// followed by its tool messages in call order.
	Messages []toolbus.Message
	// Tools offered to the model (the catalog filtered by the run's allowed tools).
	Tools []toolbus.ToolContract
}

// Response is the model's answer: the whole assistant message.
type Response struct {
	Message toolbus.Message
	Usage   toolbus.Usage
	Model   string
}

// Model calls a language model. Implementations must be safe for concurrent use.
// Errors wrapping ErrPermanent fail the run (a request the provider will never accept);
// any other error is treated as transient and the step is retried later.
type Model interface {
	Complete(ctx context.Context, req Request) (Response, error)
}

// ErrPermanent marks model errors that retrying cannot fix.
var ErrPermanent = errors.New("planner: permanent model error")

// Permanent marks err so that it fails the run. The mark adds no text: the error's
// message ends up in RunEnded.Reason, which must read as one chain without a repeated
// prefix.
func Permanent(err error) error {
	if err == nil || errors.Is(err, ErrPermanent) {
		return err
	}
	return permanentError{err}
}

// permanentError is err marked with ErrPermanent.
type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() error        { return e.err }
func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// ModelFunc adapts a function to Model.
type ModelFunc func(ctx context.Context, req Request) (Response, error)

// Complete calls f.
func (f ModelFunc) Complete(ctx context.Context, req Request) (Response, error) { return f(ctx, req) }

var _ Model = ModelFunc(nil)

// Script is a scripted model for tests and demos: step i of every run is answered by
// Steps[i] (the last one repeats). It never calls a network.
type Script struct {
	Steps []func(req Request) Response
}

// Complete answers req from the script.
func (s *Script) Complete(_ context.Context, req Request) (Response, error) {
	if len(s.Steps) == 0 {
		return Response{}, Permanent(errors.New("empty script"))
	}
	i := req.Step
	if i >= len(s.Steps) {
		i = len(s.Steps) - 1
	}
	r := s.Steps[i](req)
	if r.Message.Role == "" {
		r.Message.Role = toolbus.RoleAssistant
	}
	if r.Model == "" {
		r.Model = "script"
	}
	return r, nil
}

var _ Model = (*Script)(nil)

// Calls returns a script step that asks for the given calls.
func Calls(calls ...toolbus.ToolCall) func(Request) Response {
	return func(Request) Response {
		return Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}}
	}
}

// Answer returns a script step that answers with text and no tool call.
func Answer(text string) func(Request) Response {
	return func(Request) Response {
		return Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: text}}
	}
}
