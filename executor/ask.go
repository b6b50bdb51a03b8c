package executor

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/toolbus/toolbus"
)

// Questions to the caller.
//
// A tool asks the run's caller a question with Ask(ctx, message, schema): the schema is
// the JSON Schema of the answer, an object of primitive properties (what an MCP
// elicitation form takes). The bus worker publishes it as a tool.question event and
// waits for the tool.answer, within the call's timeout; `toolbus mcp` asks the host that
// called the tool. An accepted answer's content is checked against the schema.
//
// The wait survives restarts by re-running the tool: a call whose executor dies while it
// waits runs again from the start on its next delivery, and a question is one per call
// and seq (the tool's questions counted from 1), whichever attempt asks it, so the re-run
// asking it again gets the answer given meanwhile at once, or waits for the question
// already asked without asking it again. Code before Ask runs again: side effects belong
// after the answer, and a tool asks the same questions in the same order on every run.

// Answer is the caller's answer to a question.
type Answer struct {
	// Action is accept (Content holds the answer), decline or cancel.
	Action  string
	Content json.RawMessage
	// Reason says why there is no answer, when the caller could not be asked.
	Reason string
	// Who answered.
	Who string
}

// Question is what a tool asks (Asker's argument, AskAll's): by default a form for the
// caller's user (Message, Schema); with Method, a request to the caller's host (host.go).
type Question struct {
	Message string
	Schema  json.RawMessage
	// Key is the tool's name for the question (AskNamed), empty for Ask.
	Key string
	// Method and Params: what is asked of the host (toolbus.AskElicit, the default,
	// AskSample with an MCP CreateMessageParams, AskRoots).
	Method string
	Params json.RawMessage
	// Seq numbers the call's questions from 1 in the order the tool asks them; Batch and
	// BatchSize name the questions asked together (AskAll). Set by the executor.
	Seq, Batch, BatchSize int
}

// Asker asks the run's caller a question and waits for the answer (the bus worker's,
// WithAsker). ctx is the call's: it ends at the call's deadline.
type Asker func(ctx context.Context, q Question) (Answer, error)

// Errors of Ask.
var (
	// ErrCannotAsk: nobody can be asked here (no asker: the executor runs outside a bus
	// worker, or the caller cannot answer questions).
	ErrCannotAsk = errors.New("executor: the caller cannot be asked")
	// ErrInvalidQuestion: the schema is not an object schema that compiles.
	ErrInvalidQuestion = errors.New("executor: invalid question")
	// ErrInvalidAnswer: an accepted answer does not match the question's schema.
	ErrInvalidAnswer = errors.New("executor: the answer does not match the question's schema")
)

type askerKey struct{}

// WithAsker returns a context whose calls ask their questions with a.
func WithAsker(ctx context.Context, a Asker) context.Context {
	return context.WithValue(ctx, askerKey{}, a)
}

// Ask asks the run's caller message and returns the answer: accept with its content
// (valid against schema), decline or cancel. It waits at most until the call's
// deadline. After a restart the tool runs again and its Ask returns the answer to the
// same question (same call, same place in the order of its questions) given meanwhile,
// without asking again. It returns an error wrapping ErrNotRunning under a context that is not a
// running call's, ErrInvalidQuestion for a schema that is not an object schema,
// ErrCannotAsk when nobody can answer, ErrInvalidAnswer for content that does not match
// the schema, or the context's error.
func Ask(ctx context.Context, message string, schema json.RawMessage) (Answer, error) {
	return AskNamed(ctx, "", message, schema)
}

// AskNamed is Ask with the tool's name for the question: an MCP host sees it as the
// key of the input request (elicitation) that asks it, and may send the answer under
// it with its request, unasked. key is 1 to 64 of [A-Za-z0-9_-], or empty.
func AskNamed(ctx context.Context, key, message string, schema json.RawMessage) (Answer, error) {
	as, err := AskAll(ctx, Question{Key: key, Message: message, Schema: schema})
	if len(as) == 0 {
		return Answer{}, err
	}
	return as[0], err
}

// askerFor returns the asker of ctx with the question's message redacted as results
// are (nil when ctx has none).
func (c *call) askerFor(ctx context.Context) Asker {
	a, _ := ctx.Value(askerKey{}).(Asker)
	if a == nil {
		return nil
	}
	sv := c.e.secretValues()
	return func(ctx context.Context, q Question) (Answer, error) {
		q.Message, _ = sv.text(q.Message)
		if p, _ := sv.text(string(q.Params)); json.Valid([]byte(p)) {
			q.Params = json.RawMessage(p)
		}
		return a(ctx, q)
	}
}

// validQuestionKey reports whether key is empty or 1 to 64 of [A-Za-z0-9_-].
func validQuestionKey(key string) bool {
	if len(key) > 64 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if !toolbus.TokenByte(key[i]) {
			return false
		}
	}
	return true
}
