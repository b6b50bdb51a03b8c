// Package modeltest is the conformance suite of planner.Model adapters that talk to a
// provider over HTTP: Run checks, against a fake provider server, the rules every
// adapter must keep (tool results answer their calls, none missing, in call order,
// never sent as user text; known roles; the assistant message and its reasoning or
// thinking blocks sent back as the model produced them; provider errors classified;
// Retry-After honoured). An adapter's tests describe its wire format once (Provider)
// and call Run.
//
// The fake server applies one rule set (Check) to a provider-neutral view of each
// request (Entry), which Provider.Decode builds from the wire format and which refuses
// what only that wire format forbids (a role the API does not know, a tool_result that
// is not first in its message...).
package modeltest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

// Provider describes a provider's wire format to the fake server and the suite.
type Provider struct {
	// Name is the adapter's name as its errors start ("openai", "anthropic"...).
	Name string
	// Path is the only path the fake serves (e.g. /v1/chat/completions).
	Path string
	// New returns the adapter under test, talking to the fake at url (no path) with the
	// API key APIKey, any default model name and the given retry policy.
	New func(t *testing.T, url string, retry planner.RetryPolicy) planner.Model
	// Decode reads a request body as the provider-neutral history, or returns why the
	// provider would refuse it (the fake answers 400 with that message).
	Decode func(body []byte) ([]Entry, error)
	// DecodeAnswer reads a successful (non-streamed) answer as its assistant entry;
	// false when the body is not one.
	DecodeAnswer func(body []byte) (Entry, bool)
	// Answer encodes an answer as the provider's successful response body. A non-empty
	// Reasoning must come with provider parts that only the raw blocks can bring back
	// (DeepSeek's reasoning_content, an encrypted reasoning item, a redacted_thinking
	// block): the suite checks they go back unmodified.
	Answer func(a Answer) string
	// ErrorBody formats an error message as the provider does.
	ErrorBody func(msg string) string
	// FlagsErrors reports whether the wire format marks tool results that did not
	// succeed (Anthropic's is_error), so the suite checks the mark.
	FlagsErrors bool
}

// Call is a tool call as the neutral view has it.
type Call struct {
	ID, Name string
	// Args is the arguments' text (canonical JSON when the wire format carries an object).
	Args string
}

// Entry is one message of a request, provider-neutral.
type Entry struct {
	// Role is system, user, assistant or tool, or the unknown role the request used.
	Role string
	// Text is the message's text (a tool result's content for a tool entry).
	Text string
	// Calls are the tool calls of an assistant entry.
	Calls []Call
	// CallID is the call a tool entry answers.
	CallID string
	// IsError marks a tool result flagged as failed (FlagsErrors).
	IsError bool
	// Opaque is the canonical JSON of the provider parts of an assistant entry that
	// toolbus cannot rebuild (reasoning items, thinking blocks with their signature),
	// "" when there are none.
	Opaque string
}

// Answer is what the fake's model says.
type Answer struct {
	Text      string
	Reasoning string
	Calls     []toolbus.ToolCall
}

// Check applies the rules every provider enforces to a request: known roles; a tool
// result answers a call of the closest preceding assistant message, at most once, in
// call order; every call is answered before the next other message; an assistant
// message the fake produced (found by its first call id among sent) comes back with the
// same text, calls and opaque parts. The error's text is what the fake answers.
func Check(entries []Entry, sent []Entry) error {
	var (
		pending  []string
		callable map[string]bool
	)
	for i, e := range entries {
		switch e.Role {
		case "system", "user", "assistant":
			if len(pending) > 0 {
				return fmt.Errorf("message %d: tool calls without a tool result before it: %s", i, strings.Join(pending, ", "))
			}
			callable = map[string]bool{}
			if e.Role != "assistant" {
				continue
			}
			for _, c := range e.Calls {
				if c.ID == "" || c.Name == "" {
					return fmt.Errorf("message %d: a tool call needs an id and a name", i)
				}
				if callable[c.ID] {
					return fmt.Errorf("message %d: duplicate call id %s", i, c.ID)
				}
				callable[c.ID] = true
				pending = append(pending, c.ID)
			}
			if err := sentBack(i, e, sent); err != nil {
				return err
			}
		case "tool":
			switch {
			case !callable[e.CallID]:
				return fmt.Errorf("message %d: the tool result for %s answers no call of the preceding assistant message", i, e.CallID)
			case !slices.Contains(pending, e.CallID):
				return fmt.Errorf("message %d: call %s is answered twice", i, e.CallID)
			case pending[0] != e.CallID:
				return fmt.Errorf("message %d: tool results must answer the calls in call order: expected %s, got %s", i, pending[0], e.CallID)
			}
			pending = pending[1:]
		default:
			return fmt.Errorf("message %d: unknown role %q", i, e.Role)
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("tool calls without a tool result: %s", strings.Join(pending, ", "))
	}
	return nil
}

// sentBack checks that an assistant message the fake produced comes back unmodified.
func sentBack(i int, e Entry, sent []Entry) error {
	if len(e.Calls) == 0 {
		return nil
	}
	for _, s := range sent {
		if len(s.Calls) == 0 || s.Calls[0].ID != e.Calls[0].ID {
			continue
		}
		switch {
		case !slices.Equal(s.Calls, e.Calls):
			return fmt.Errorf("message %d: the tool calls differ from the ones the model made", i)
		case s.Text != e.Text:
			return fmt.Errorf("message %d: the assistant text differs from the model's", i)
		case s.Opaque != e.Opaque:
			return fmt.Errorf("message %d: the reasoning or thinking parts of the assistant message were modified; they must go back as the model produced them", i)
		}
	}
	return nil
}

// Run runs the conformance suite against p.
func Run(t *testing.T, p Provider) {
	t.Run("history", func(t *testing.T) { testHistory(t, p) })
	t.Run("round trip", func(t *testing.T) { testRoundTrip(t, p) })
	t.Run("refused histories", func(t *testing.T) { testRefused(t, p) })
	t.Run("call ids", func(t *testing.T) { testCallIDs(t, p) })
	t.Run("errors", func(t *testing.T) { testErrors(t, p) })
	t.Run("attempt timeout", func(t *testing.T) { testAttemptTimeout(t, p) })
}

func once() planner.RetryPolicy { return planner.RetryPolicy{MaxAttempts: 1} }

// testHistory: the rich history goes out as one message per role, each tool result
// right after its call's assistant message, in call order, never as user text, with the
// provider's own raw parts sent back and none invented for a message without them.
func testHistory(t *testing.T, p Provider) {
	s := NewServer(t, p, Always(Reply{Body: p.Answer(Answer{Text: "INC-404 does not exist."})}))
	resp, err := p.New(t, s.URL, once()).Complete(context.Background(), planner.Request{RunID: "r1", Step: 2, Messages: RichHistory(), Tools: Tools()})
	if err != nil {
		t.Fatal(err)
	}
	CheckAnswer(t, resp)
	if resp.Message.Content != "INC-404 does not exist." {
		t.Fatalf("content %q", resp.Message.Content)
	}
	var shape []string
	entries := s.Entries()
	for _, e := range entries {
		switch e.Role {
		case "tool":
			shape = append(shape, "tool:"+e.CallID)
		case "assistant":
			var ids []string
			for _, c := range e.Calls {
				ids = append(ids, c.ID)
			}
			shape = append(shape, "assistant["+strings.Join(ids, ",")+"]")
		default:
			shape = append(shape, e.Role)
			if strings.Contains(e.Text, "incident_not_found") {
				t.Errorf("a tool result was sent as %s text: %q", e.Role, e.Text)
			}
		}
	}
	want := "system user assistant[call_a,call_b,call_c] tool:call_a tool:call_b tool:call_c assistant[call_d] tool:call_d user"
	if got := strings.Join(shape, " "); got != want {
		t.Fatalf("messages\n got %s\nwant %s", got, want)
	}
	byID := map[string]toolbus.Message{}
	for _, m := range RichHistory() {
		if m.Role == toolbus.RoleTool {
			byID[m.ToolCallID] = m
		}
	}
	for _, e := range entries {
		if e.Role != "tool" {
			continue
		}
		m := byID[e.CallID]
		if e.Text != m.Content {
			t.Errorf("result of %s: %q, want %q", e.CallID, e.Text, m.Content)
		}
		if p.FlagsErrors && e.IsError != m.IsError {
			t.Errorf("result of %s: is_error %v, want %v", e.CallID, e.IsError, m.IsError)
		}
	}
	first, second := entries[2], entries[6]
	if first.Text != "Let me look." || first.Opaque == "" {
		t.Errorf("the first assistant message was not sent whole: %+v", first)
	}
	if c := first.Calls[2]; c.Args != `{"expression": "1/0"` && c.Args != `{"expression":"1/0"}` {
		t.Errorf("the malformed arguments were not sent back: %q", c.Args)
	}
	if second.Opaque != "" {
		t.Errorf("provider parts were invented for a message without raw parts: %s", second.Opaque)
	}
}

// testRoundTrip: an answer with reasoning and a call goes back the next step as the
// model produced it; without its raw parts the provider refuses the history, and the
// run fails with the provider's message.
func testRoundTrip(t *testing.T, p Provider) {
	step0 := p.Answer(Answer{Text: "I will compute it.", Reasoning: "2+3 needs the calculator.",
		Calls: []toolbus.ToolCall{{CallID: "call_x", Tool: "calculator", Arguments: `{"expression":"2+3"}`}}})
	step1 := p.Answer(Answer{Text: "2+3 = 5."})
	s := NewServer(t, p, Sequence(Reply{Body: step0}, Reply{Body: step1}))
	m := p.New(t, s.URL, once())
	ctx := context.Background()
	r0, err := m.Complete(ctx, planner.Request{RunID: "r", Step: 0, Messages: []toolbus.Message{
		{Role: toolbus.RoleSystem, Content: "sys"}, {Role: toolbus.RoleUser, Content: "What is 2+3?"}}, Tools: Tools()})
	if err != nil {
		t.Fatal(err)
	}
	CheckAnswer(t, r0)
	want := []toolbus.ToolCall{{CallID: "call_x", Tool: "calculator", Arguments: `{"expression":"2+3"}`}}
	if r0.Message.Reasoning != "2+3 needs the calculator." || r0.Message.Content != "I will compute it." || !slices.Equal(r0.Message.ToolCalls, want) {
		t.Fatalf("step 0: %+v", r0.Message)
	}
	r1, err := m.Complete(ctx, planner.Request{RunID: "r", Step: 1, Messages: TwoStep(r0.Message, `{"value":5}`), Tools: Tools()})
	if err != nil || r1.Message.Content != "2+3 = 5." {
		t.Fatalf("step 1: %v %+v", err, r1.Message)
	}
	if _, accepted, rejected := s.Counts(); accepted != 2 || len(rejected) != 0 {
		t.Fatalf("accepted %d, rejected %v", accepted, rejected)
	}

	stripped := r0.Message
	stripped.Raw = nil
	_, err = m.Complete(ctx, planner.Request{RunID: "r", Step: 1, Messages: TwoStep(stripped, `{"value":5}`)})
	var pe *planner.ProviderError
	if !errors.Is(err, planner.ErrPermanent) || !errors.As(err, &pe) || pe.Status != http.StatusBadRequest ||
		!strings.HasPrefix(err.Error(), p.Name+": 400 Bad Request: ") || !strings.Contains(err.Error(), "must go back as the model produced them") {
		t.Fatalf("err = %v, want a permanent 400 with the provider's message", err)
	}
}

// testRefused: a history no provider accepts fails the run before anything is sent.
func testRefused(t *testing.T, p Provider) {
	call := func(id string) toolbus.ToolCall { return toolbus.ToolCall{CallID: id, Tool: "noop", Arguments: "{}"} }
	asst := func(ids ...string) toolbus.Message {
		m := toolbus.Message{Role: toolbus.RoleAssistant}
		for _, id := range ids {
			m.ToolCalls = append(m.ToolCalls, call(id))
		}
		return m
	}
	tool := func(id string) toolbus.Message {
		return toolbus.Message{Role: toolbus.RoleTool, ToolCallID: id, Content: "r"}
	}
	user := toolbus.Message{Role: toolbus.RoleUser, Content: "q"}
	tests := []struct {
		name string
		msgs []toolbus.Message
	}{
		{"orphan tool result", []toolbus.Message{user, tool("a")}},
		{"result of a call not made", []toolbus.Message{user, asst("a"), tool("a"), tool("x")}},
		{"missing tool result", []toolbus.Message{user, asst("a", "b"), tool("a"), user}},
		{"missing tool result at the end", []toolbus.Message{user, asst("a")}},
		{"answered twice", []toolbus.Message{user, asst("a"), tool("a"), tool("a")}},
		{"duplicate call id", []toolbus.Message{user, asst("a", "a"), tool("a")}},
		{"unknown role", []toolbus.Message{user, {Role: "function", Content: "x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewServer(t, p, Always(Reply{Body: p.Answer(Answer{Text: "ok"})}))
			_, err := p.New(t, s.URL, once()).Complete(context.Background(), planner.Request{Messages: tt.msgs})
			if !errors.Is(err, planner.ErrPermanent) {
				t.Fatalf("err = %v, want a permanent error", err)
			}
			if reqs, _, _ := s.Counts(); reqs != 0 {
				t.Fatalf("%d requests sent for a history no provider accepts", reqs)
			}
		})
	}
}

// testCallIDs: empty and duplicate call ids get ids unique within the step, the same
// for the same answer, and the next step sends them back consistently.
func testCallIDs(t *testing.T, p Provider) {
	step0 := p.Answer(Answer{Calls: []toolbus.ToolCall{
		{Tool: "calculator", Arguments: `{"expression":"2+3"}`},
		{CallID: "dup", Tool: "calculator", Arguments: `{"expression":"2+4"}`},
		{CallID: "dup", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-1"}`},
	}})
	s := NewServer(t, p, func(n int, _ []byte) Reply {
		if n < 2 {
			return Reply{Body: step0}
		}
		return Reply{Body: p.Answer(Answer{Text: "done"})}
	})
	m := p.New(t, s.URL, once())
	var first planner.Response
	for i := range 2 {
		r, err := m.Complete(context.Background(), planner.Request{Step: 3, Messages: Question()})
		if err != nil {
			t.Fatal(err)
		}
		CheckAnswer(t, r)
		var ids []string
		for _, c := range r.Message.ToolCalls {
			ids = append(ids, c.CallID)
		}
		if got := strings.Join(ids, ","); got != "call_3_0,dup,call_3_2" {
			t.Fatalf("ids %s, want call_3_0,dup,call_3_2", got)
		}
		if i == 1 && !slices.Equal(first.Message.ToolCalls, r.Message.ToolCalls) {
			t.Fatalf("ids not stable: %v then %v", first.Message.ToolCalls, r.Message.ToolCalls)
		}
		first = r
	}
	history := append(Question(), first.Message)
	for _, c := range first.Message.ToolCalls {
		history = append(history, toolbus.Message{Role: toolbus.RoleTool, ToolCallID: c.CallID, Content: "r"})
	}
	s.Forget() // the ids were rewritten on purpose; the rules check they line up
	if _, err := m.Complete(context.Background(), planner.Request{Step: 4, Messages: history}); err != nil {
		t.Fatalf("the normalized ids were not sent back consistently: %v", err)
	}
	e := s.Entries()
	var got []string
	for _, c := range e[1].Calls {
		got = append(got, c.ID)
	}
	if strings.Join(got, ",") != "call_3_0,dup,call_3_2" {
		t.Fatalf("calls sent back with ids %v", got)
	}
}

// testErrors: provider errors are classified (retried or failing the run with the
// provider's message) and Retry-After is honoured.
func testErrors(t *testing.T, p Provider) {
	ok := Reply{Body: p.Answer(Answer{Text: "done"})}
	errReply := func(status int, msg string, header ...string) Reply {
		r := Reply{Status: status, Body: p.ErrorBody(msg), Header: map[string]string{}}
		for i := 0; i+1 < len(header); i += 2 {
			r.Header[header[i]] = header[i+1]
		}
		return r
	}
	tests := []struct {
		name      string
		replies   []Reply
		attempts  int
		wantReqs  int
		wantWaits []time.Duration
		wantErr   string
		permanent bool
	}{
		{name: "429 with Retry-After then success", attempts: 4, wantReqs: 2, wantWaits: []time.Duration{2 * time.Second},
			replies: []Reply{errReply(429, "Rate limit reached", "Retry-After", "2"), ok}},
		{name: "Retry-After-Ms", attempts: 4, wantReqs: 2, wantWaits: []time.Duration{1500 * time.Millisecond},
			replies: []Reply{errReply(429, "Rate limit reached", "Retry-After-Ms", "1500"), ok}},
		// An hour is past the cap: give up at once; the planner retries the step later.
		{name: "Retry-After as an HTTP date past the cap", attempts: 4, wantReqs: 1, wantErr: "more than the 1m0s cap",
			replies: []Reply{errReply(503, "overloaded", "Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)), ok}},
		{name: "500 every time gives up", attempts: 3, wantReqs: 3, wantErr: "giving up after 3 attempts",
			replies: []Reply{errReply(500, "The server had an error")}},
		{name: "backoff between attempts", attempts: 3, wantReqs: 3,
			replies: []Reply{errReply(500, "boom"), errReply(502, "boom"), ok}},
		{name: "529 overloaded is retried", attempts: 2, wantReqs: 2, replies: []Reply{errReply(529, "Overloaded"), ok}},
		{name: "502 with a non-JSON body is retried", attempts: 2, wantReqs: 2,
			replies: []Reply{{Status: 502, Header: map[string]string{"Content-Type": "text/html"}, Body: "upstream connect error"}, ok}},
		{name: "an unreadable answer is retried", attempts: 2, wantReqs: 2,
			replies: []Reply{{Body: "<html>bad gateway</html>"}, ok}},
		{name: "400 fails the run with the provider's message", attempts: 4, wantReqs: 1, permanent: true,
			replies: []Reply{errReply(400, "messages[1].content: string too long.")},
			wantErr: p.Name + ": 400 Bad Request: messages[1].content: string too long."},
		{name: "401 fails the run", attempts: 4, wantReqs: 1, permanent: true,
			replies: []Reply{errReply(401, "Incorrect API key provided")}, wantErr: "Incorrect API key provided"},
		{name: "404 fails the run", attempts: 4, wantReqs: 1, permanent: true,
			replies: []Reply{errReply(404, "The model 'm-nope' does not exist")}, wantErr: "m-nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewServer(t, p, Sequence(tt.replies...))
			var sl Sleeps
			resp, err := p.New(t, s.URL, FastRetry(tt.attempts, &sl)).Complete(context.Background(), planner.Request{Messages: Question()})
			reqs, _, _ := s.Counts()
			if tt.wantErr == "" && (err != nil || resp.Message.Content != "done") {
				t.Fatalf("err = %v resp %+v", err, resp)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if errors.Is(err, planner.ErrPermanent) != tt.permanent {
				t.Fatalf("permanent = %v, want %v: %v", errors.Is(err, planner.ErrPermanent), tt.permanent, err)
			}
			var pe *planner.ProviderError
			if err != nil && !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a ProviderError", err)
			}
			if reqs != tt.wantReqs {
				t.Fatalf("%d requests, want %d", reqs, tt.wantReqs)
			}
			waits := sl.Waits()
			if tt.wantWaits != nil && !slices.Equal(waits, tt.wantWaits) {
				t.Fatalf("waits %v, want %v", waits, tt.wantWaits)
			}
			if tt.wantWaits == nil && tt.wantErr == "" && len(waits) != reqs-1 {
				t.Fatalf("waits %v for %d requests", waits, reqs)
			}
			for _, w := range waits {
				if w > time.Minute {
					t.Fatalf("wait %v above the cap", w)
				}
			}
		})
	}
}

// testAttemptTimeout: an attempt that hangs past RetryPolicy.AttemptTimeout is
// abandoned and retried.
func testAttemptTimeout(t *testing.T, p Provider) {
	var n atomic.Int32
	ok := p.Answer(Answer{Text: "done"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a closed connection only once the body is read
		if n.Add(1) == 1 {
			<-r.Context().Done() // the first attempt hangs until the client gives up on it
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, ok)
	}))
	defer srv.Close()
	var sl Sleeps
	rp := FastRetry(3, &sl)
	rp.AttemptTimeout = 200 * time.Millisecond
	resp, err := p.New(t, srv.URL, rp).Complete(context.Background(), planner.Request{Messages: Question()})
	if err != nil || resp.Message.Content != "done" || n.Load() != 2 {
		t.Fatalf("err %v, content %q after %d requests", err, resp.Message.Content, n.Load())
	}
}
