package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
)

const searchSchema = `{
	"type": "object",
	"properties": {
		"q": {"type": "string", "minLength": 1},
		"limit": {"type": "integer", "minimum": 1, "maximum": 100},
		"filters": {"type": "array", "items": {"type": "object", "properties": {"field": {"type": "string"}}, "required": ["field"]}}
	},
	"required": ["q"],
	"additionalProperties": false
}`

const emptySchema = `{"type":"object","properties":{},"additionalProperties":false}`

// fixture is an executor whose tools all count their runs in ran.
type fixture struct {
	ex  *executor.Executor
	ran *atomic.Int64
	log *testutil.Buffer
}

// A fake secret of each kind, built at run time so the source holds no literal secret.
var (
	fakeOpenAIKey = "sk-" + "proj-" + strings.Repeat("A1b2C3d4", 5)
	fakeGitHub    = "ghp_" + strings.Repeat("x9Y8", 9)
	fakeBearer    = "Bearer " + "abc.def-" + strings.Repeat("Z7", 12)
)

func newFixture(t testing.TB, opts ...executor.Option) *fixture {
	t.Helper()
	f := &fixture{ran: new(atomic.Int64), log: new(testutil.Buffer)}
	reg := executor.NewRegistry()
	add := func(tool executor.Tool, fn func(ctx context.Context, args json.RawMessage) (any, error)) {
		t.Helper()
		if tool.InputSchema == nil {
			tool.InputSchema = json.RawMessage(emptySchema)
		}
		tool.Func = func(ctx context.Context, args json.RawMessage) (any, error) {
			f.ran.Add(1)
			return fn(ctx, args)
		}
		if err := reg.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	add(executor.Tool{Name: "search", InputSchema: json.RawMessage(searchSchema), ReadOnly: true},
		func(_ context.Context, args json.RawMessage) (any, error) {
			var in struct {
				Q     string `json:"q"`
				Limit int    `json:"limit"`
			}
			if err := json.Unmarshal(args, &in); err != nil {
				return nil, err
			}
			return map[string]any{"query": in.Q, "limit": in.Limit, "items": []string{"b", "a"}}, nil
		})
	add(executor.Tool{Name: "empty"}, func(context.Context, json.RawMessage) (any, error) { return nil, nil })
	add(executor.Tool{Name: "empty_string"}, func(context.Context, json.RawMessage) (any, error) { return "", nil })
	add(executor.Tool{Name: "text"}, func(context.Context, json.RawMessage) (any, error) { return "line 1\n<b>line 2</b>", nil })
	add(executor.Tool{Name: "raw"}, func(context.Context, json.RawMessage) (any, error) {
		return json.RawMessage(`{ "z": 1, "a": {"y": [3, 2], "b": 1.50} }`), nil
	})
	add(executor.Tool{Name: "typed_error"}, func(context.Context, json.RawMessage) (any, error) {
		return nil, fmt.Errorf("lookup: %w", &executor.Error{Code: "incident_not_found", Message: "no incident INC-404",
			Retryable: true, Details: map[string]any{"id": "INC-404", "token": "t0p"}})
	})
	add(executor.Tool{Name: "plain_error", RedactFields: []string{"token"}}, func(context.Context, json.RawMessage) (any, error) {
		return nil, errors.New("upstream refused key " + fakeOpenAIKey)
	})
	add(executor.Tool{Name: "panics"}, func(context.Context, json.RawMessage) (any, error) {
		var m map[string]int
		m["boom"]++ // nil map write: a runtime panic
		return nil, nil
	})
	add(executor.Tool{Name: "goexit"}, func(context.Context, json.RawMessage) (any, error) {
		runtimeGoexit()
		return nil, nil
	})
	// ignores_ctx never returns while the test runs (neverReturns is closed by no one): an
	// Execute that returns at all returned without waiting for it.
	add(executor.Tool{Name: "ignores_ctx", Timeout: 100 * time.Millisecond}, func(context.Context, json.RawMessage) (any, error) {
		<-neverReturns
		return "late", nil
	})
	add(executor.Tool{Name: "waits_ctx", Timeout: 10 * time.Second}, func(ctx context.Context, _ json.RawMessage) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	add(executor.Tool{Name: "bad_output", OutputSchema: json.RawMessage(`{"type":"object","properties":{"ok":{"type":"boolean"},"code":{"type":"string","pattern":"^[a-z]+$"}},"required":["ok"]}`)},
		func(context.Context, json.RawMessage) (any, error) {
			return map[string]any{"ok": "SECRET-VALUE-1", "code": "SECRET-VALUE-2"}, nil
		})
	add(executor.Tool{Name: "good_output", OutputSchema: json.RawMessage(`{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}`)},
		func(context.Context, json.RawMessage) (any, error) { return map[string]bool{"ok": true}, nil })
	add(executor.Tool{Name: "unencodable"}, func(context.Context, json.RawMessage) (any, error) { return make(chan int), nil })
	add(executor.Tool{Name: "bad_raw"}, func(context.Context, json.RawMessage) (any, error) { return json.RawMessage(`{"a":`), nil })
	add(executor.Tool{Name: "secrets", RedactFields: []string{"password", "api_key"}}, func(context.Context, json.RawMessage) (any, error) {
		return map[string]any{
			"user":     "alice",
			"password": "hunter2",
			"nested":   []any{map[string]any{"API-Key": 12345, "auth": fakeBearer}},
			"note":     "clone with https://bob:s3cret@git.example.com/repo.git using " + fakeGitHub,
		}, nil
	})
	add(executor.Tool{Name: "forbidden"}, func(context.Context, json.RawMessage) (any, error) { return "ran", nil })

	auth := executor.AuthorizerFunc(func(_ context.Context, p toolbus.Principal, tool string, _ json.RawMessage) error {
		if tool == "forbidden" {
			return fmt.Errorf("principal %s lacks role incident-admin", p.ID)
		}
		return nil
	})
	opts = append([]executor.Option{executor.WithAuthorizer(auth), executor.WithInstance("exec-test"),
		executor.WithLogger(slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug})))}, opts...)
	f.ex = testutil.Must(executor.New(reg, opts...))
	return f
}

var principal = toolbus.Principal{ID: "user-1", Roles: []string{"reader"}}

func call(tool, args string) toolbus.ToolCall {
	return toolbus.ToolCall{CallID: "call_1", Tool: tool, Arguments: args}
}

// errorContent decodes the content of an error result.
func errorContent(t *testing.T, r toolbus.ToolResult) (code, message string, retryable bool) {
	t.Helper()
	var c struct {
		Error struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			Retryable bool   `json:"retryable"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.Content), &c); err != nil {
		t.Fatalf("error content is not JSON: %v: %q", err, r.Content)
	}
	return c.Error.Code, c.Error.Message, c.Error.Retryable
}

// checkInvariants holds for every result.
func checkInvariants(t *testing.T, r toolbus.ToolResult, tool string) {
	t.Helper()
	if !r.Status.Valid() {
		t.Fatalf("invalid status %q", r.Status)
	}
	if r.CallID != "call_1" || r.Tool != tool || r.Attempt != 1 || r.Executor != "exec-test" || r.DurationMS < 0 {
		t.Errorf("identity fields: %+v", r)
	}
	if !utf8.ValidString(r.Content) {
		t.Errorf("content is not valid UTF-8: %q", r.Content)
	}
	for _, bad := range []string{"goroutine ", ".go:", "runtime/debug", "panic("} {
		if strings.Contains(r.Content, bad) || (r.Error != nil && strings.Contains(r.Error.Message, bad)) {
			t.Errorf("content or message has a stack trace (%q): %q", bad, r.Content)
		}
	}
	if r.Status == toolbus.StatusSucceeded {
		if r.Error != nil || !json.Valid(r.Output) {
			t.Errorf("succeeded with error %+v or invalid output %q", r.Error, r.Output)
		}
		return
	}
	if r.Error == nil || r.Error.Code == "" || r.Error.Message == "" {
		t.Fatalf("%s without a full error: %+v", r.Status, r.Error)
	}
	if r.Output != nil {
		t.Errorf("%s with output %s", r.Status, r.Output)
	}
	code, msg, retryable := errorContent(t, r)
	if code != r.Error.Code || msg != r.Error.Message || retryable != r.Error.Retryable {
		t.Errorf("content %q does not match error %+v", r.Content, r.Error)
	}
}

func TestExecuteGatesAndStatuses(t *testing.T) {
	cancelled := func(*testing.T) context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	tests := []struct {
		name      string
		ctx       func(t *testing.T) context.Context // nil: Background
		tool      string
		args      string
		status    toolbus.Status
		code      string
		ran       bool
		retryable bool
		msg       []string // substrings of the error message
		check     func(t *testing.T, r toolbus.ToolResult)
	}{
		// Gate 1: unknown tool.
		{name: "unknown tool", tool: "serch", args: `{"q":"x"}`, status: toolbus.StatusRejected, code: toolbus.CodeUnknownTool,
			msg: []string{`"serch"`, "no tool with this name is registered"}},
		{name: "unknown tool case", tool: "Search", args: `{"q":"x"}`, status: toolbus.StatusRejected, code: toolbus.CodeUnknownTool},
		{name: "empty tool name", tool: "", args: `{}`, status: toolbus.StatusRejected, code: toolbus.CodeUnknownTool},
		// Gate 2: malformed arguments.
		{name: "trailing comma", tool: "search", args: `{"q":"x",}`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"not valid JSON", "byte offset 9"}},
		{name: "truncated", tool: "search", args: `{"q":"x`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"not valid JSON", "truncated", "byte offset 7"}},
		{name: "array", tool: "search", args: `[1]`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"must be a JSON object", "array"}},
		{name: "string", tool: "search", args: `"x"`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"must be a JSON object", "string"}},
		{name: "null", tool: "empty", args: `null`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"must be a JSON object", "null"}},
		{name: "empty string", tool: "empty", args: ``, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"arguments are empty"}},
		{name: "whitespace", tool: "empty", args: " \n\t ", status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"arguments are empty"}},
		{name: "two values", tool: "empty", args: `{} {}`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"not valid JSON"}},
		{name: "single quotes", tool: "search", args: `{'q':'x'}`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"not valid JSON", "byte offset 1"}},
		// Gate 3: schema.
		{name: "schema violations", tool: "search", args: `{"limit":500,"extra":true,"filters":[{"x":1}]}`,
			status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"4 violations", "(root): missing property 'q'", "additional properties 'extra'", "/limit:", "/filters/0: missing property 'field'"},
			check: func(t *testing.T, r toolbus.ToolResult) {
				var vs []executor.Violation
				if err := json.Unmarshal(r.Error.Details, &vs); err != nil {
					t.Fatalf("details: %v: %s", err, r.Error.Details)
				}
				paths := map[string]int{}
				for _, v := range vs {
					paths[v.Path]++
				}
				if paths[""] != 2 || paths["/limit"] != 1 || paths["/filters/0"] != 1 || len(vs) != 4 {
					t.Errorf("violations = %+v", vs)
				}
			}},
		{name: "wrong type", tool: "search", args: `{"q":5}`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"/q: got number, want string"}},
		{name: "empty object for required", tool: "search", args: `{}`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments,
			msg: []string{"missing property 'q'"}},
		// Gate 4: authorization.
		{name: "not authorized", tool: "forbidden", args: `{}`, status: toolbus.StatusRejected, code: toolbus.CodeNotAuthorized,
			msg: []string{"not authorized", "lacks role incident-admin"}},
		// Context already done: nothing runs.
		{name: "cancelled before start", ctx: cancelled, tool: "empty", args: `{}`, status: toolbus.StatusCancelled, code: toolbus.CodeCancelled},
		// Gate 6: running.
		{name: "succeeded", tool: "search", args: `{"q":"x","limit":2}`, status: toolbus.StatusSucceeded, ran: true,
			check: func(t *testing.T, r toolbus.ToolResult) {
				const want = `{"items":["b","a"],"limit":2,"query":"x"}`
				if r.Content != want || string(r.Output) != want {
					t.Errorf("content %q output %s, want %s", r.Content, r.Output, want)
				}
			}},
		{name: "whitespace around object", tool: "search", args: " {\"q\":\"x\"}\n", status: toolbus.StatusSucceeded, ran: true},
		{name: "nil output", tool: "empty", args: `{}`, status: toolbus.StatusSucceeded, ran: true,
			check: func(t *testing.T, r toolbus.ToolResult) {
				if r.Content != "null" || string(r.Output) != "null" || r.Truncated != nil {
					t.Errorf("empty result: %+v", r)
				}
			}},
		{name: "empty string output", tool: "empty_string", args: `{}`, status: toolbus.StatusSucceeded, ran: true,
			check: func(t *testing.T, r toolbus.ToolResult) {
				if r.Content != "" || string(r.Output) != `""` {
					t.Errorf("empty string result: %+v", r)
				}
			}},
		{name: "text output", tool: "text", args: `{}`, status: toolbus.StatusSucceeded, ran: true,
			check: func(t *testing.T, r toolbus.ToolResult) {
				if r.Content != "line 1\n<b>line 2</b>" || string(r.Output) != `"line 1\n<b>line 2</b>"` {
					t.Errorf("text result: content %q output %s", r.Content, r.Output)
				}
			}},
		{name: "raw output is canonical", tool: "raw", args: `{}`, status: toolbus.StatusSucceeded, ran: true,
			check: func(t *testing.T, r toolbus.ToolResult) {
				const want = `{"a":{"b":1.50,"y":[3,2]},"z":1}`
				if r.Content != want || string(r.Output) != want {
					t.Errorf("content %q output %s, want %s", r.Content, r.Output, want)
				}
			}},
		{name: "typed error", tool: "typed_error", args: `{}`, status: toolbus.StatusFailed, code: "incident_not_found", ran: true,
			retryable: true, msg: []string{"no incident INC-404"},
			check: func(t *testing.T, r toolbus.ToolResult) {
				if string(r.Error.Details) != `{"id":"INC-404","token":"t0p"}` {
					t.Errorf("details = %s", r.Error.Details)
				}
			}},
		{name: "plain error redacted", tool: "plain_error", args: `{}`, status: toolbus.StatusFailed, code: toolbus.CodeToolError, ran: true,
			msg: []string{"upstream refused key [REDACTED]"},
			check: func(t *testing.T, r toolbus.ToolResult) {
				if strings.Contains(r.Content, fakeOpenAIKey) || r.Redactions != 1 {
					t.Errorf("secret not redacted: %+v", r)
				}
			}},
		{name: "panic", tool: "panics", args: `{}`, status: toolbus.StatusFailed, code: toolbus.CodeToolInternalError, ran: true,
			msg: []string{"internal error"}},
		{name: "goexit", tool: "goexit", args: `{}`, status: toolbus.StatusFailed, code: toolbus.CodeToolInternalError, ran: true},
		{name: "timeout, tool ignores ctx", tool: "ignores_ctx", args: `{}`, status: toolbus.StatusTimedOut, code: toolbus.CodeTimeout,
			ran: true, retryable: true, msg: []string{"timeout of 100ms"},
			check: func(t *testing.T, r toolbus.ToolResult) {
				if r.DurationMS > 2000 {
					t.Errorf("timed out call took %dms", r.DurationMS)
				}
				if strings.Contains(r.Error.Message, "(before the tool finished)") {
					t.Errorf("message says the obvious twice: %q", r.Error.Message)
				}
			}},
		{name: "call deadline", ctx: func(t *testing.T) context.Context {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			t.Cleanup(cancel)
			return ctx
		}, tool: "waits_ctx", args: `{}`, status: toolbus.StatusTimedOut, code: toolbus.CodeTimeout, ran: true, retryable: true,
			msg: []string{"deadline"}},
		{name: "cancelled while running", ctx: func(*testing.T) context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(30*time.Millisecond, cancel)
			return ctx
		}, tool: "waits_ctx", args: `{}`, status: toolbus.StatusCancelled, code: toolbus.CodeCancelled, ran: true},
		// Gate 7: output.
		{name: "output schema violation", tool: "bad_output", args: `{}`, status: toolbus.StatusFailed, code: toolbus.CodeInvalidToolOutput,
			ran: true, msg: []string{"invalid output", "/ok: got string, want boolean", "/code"},
			check: func(t *testing.T, r toolbus.ToolResult) {
				if strings.Contains(r.Content, "SECRET-VALUE") || strings.Contains(string(r.Error.Details), "SECRET-VALUE") {
					t.Errorf("bad output leaked: %q %s", r.Content, r.Error.Details)
				}
			}},
		{name: "output schema ok", tool: "good_output", args: `{}`, status: toolbus.StatusSucceeded, ran: true},
		{name: "unencodable output", tool: "unencodable", args: `{}`, status: toolbus.StatusFailed, code: toolbus.CodeInvalidToolOutput, ran: true},
		{name: "invalid raw output", tool: "bad_raw", args: `{}`, status: toolbus.StatusFailed, code: toolbus.CodeInvalidToolOutput, ran: true},
		// Gate 8: redaction.
		{name: "redaction", tool: "secrets", args: `{}`, status: toolbus.StatusSucceeded, ran: true,
			check: func(t *testing.T, r toolbus.ToolResult) {
				for _, s := range []string{"hunter2", "12345", "s3cret", fakeGitHub, "Z7Z7"} {
					if strings.Contains(r.Content, s) || strings.Contains(string(r.Output), s) {
						t.Errorf("%q not redacted: %s", s, r.Content)
					}
				}
				if r.Redactions != 5 || !strings.Contains(r.Content, "https://bob:[REDACTED]@git.example.com") ||
					!strings.Contains(r.Content, `"auth":"Bearer [REDACTED]"`) || r.Content != string(r.Output) {
					t.Errorf("redactions %d, content %s", r.Redactions, r.Content)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			if tt.ctx != nil {
				ctx = tt.ctx(t)
			}
			r := executeWithin(t, f.ex, ctx, call(tt.tool, tt.args))
			checkInvariants(t, r, tt.tool)
			if r.Status != tt.status || r.Code() != tt.code {
				t.Fatalf("status %s/%s, want %s/%s: %+v", r.Status, r.Code(), tt.status, tt.code, r)
			}
			if ran := f.ran.Load() > 0; ran != tt.ran {
				t.Errorf("tool ran = %v, want %v", ran, tt.ran)
			}
			if r.Error != nil {
				if r.Error.Retryable != tt.retryable {
					t.Errorf("retryable = %v", r.Error.Retryable)
				}
				for _, m := range tt.msg {
					if !strings.Contains(r.Error.Message, m) {
						t.Errorf("message %q lacks %q", r.Error.Message, m)
					}
				}
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func TestPanicStackGoesToLog(t *testing.T) {
	f := newFixture(t)
	r := f.ex.Execute(context.Background(), call("panics", `{}`), principal)
	checkInvariants(t, r, "panics")
	if r.Code() != toolbus.CodeToolInternalError {
		t.Fatalf("code %s", r.Code())
	}
	logged := f.log.String()
	if !strings.Contains(logged, "level=ERROR") || !strings.Contains(logged, "goroutine ") || !strings.Contains(logged, "assignment to entry in nil map") {
		t.Errorf("panic not logged with its stack at error level:\n%s", logged)
	}
}

func TestTimeoutIgnoringToolReturnsInTime(t *testing.T) {
	f := newFixture(t)
	start := time.Now()
	r := executeWithin(t, f.ex, context.Background(), call("ignores_ctx", `{}`))
	if r.Status != toolbus.StatusTimedOut || !r.Error.Retryable {
		t.Fatalf("result %+v", r)
	}
	// A lower bound only (a busy machine makes it later, never earlier): the call's own
	// timeout ended it, and executeWithin showed it did not wait for the tool.
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("Execute returned after %v, before the tool's 100ms timeout", d)
	}
}

// neverReturns is never closed: a tool that waits on it never returns while the tests run.
var neverReturns = make(chan struct{})

// hangDeadline is how long executeWithin waits before it calls Execute hung: far past any
// timeout of the fixture's tools, so that only a call that waits for a tool which never
// returns (or for its 10s timeout instead of its context) reaches it.
const hangDeadline = time.Minute

// executeWithin runs Execute and fails the test if it has not returned by hangDeadline:
// a deadline for a hang, not a measurement of speed.
func executeWithin(t *testing.T, ex *executor.Executor, ctx context.Context, c toolbus.ToolCall) toolbus.ToolResult {
	t.Helper()
	done := make(chan toolbus.ToolResult, 1)
	go func() { done <- ex.Execute(ctx, c, principal) }()
	select {
	case r := <-done:
		return r
	case <-time.After(hangDeadline):
		t.Fatalf("Execute(%s) did not return within %v", c.Tool, hangDeadline)
		return toolbus.ToolResult{}
	}
}

func TestDefaultTimeoutOption(t *testing.T) {
	f := newFixture(t, executor.WithDefaultTimeout(50*time.Millisecond))
	r := f.ex.Execute(context.Background(), call("empty", `{}`), principal)
	if r.Status != toolbus.StatusSucceeded {
		t.Fatalf("%+v", r)
	}
	// waits_ctx sets its own 10s timeout; the default does not shorten it, the ctx does:
	// the context's deadline, not the tool's, is what the result names.
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Millisecond)
	defer cancel()
	r = f.ex.Execute(ctx, call("waits_ctx", `{}`), principal)
	if r.Status != toolbus.StatusTimedOut || !strings.Contains(r.Error.Message, "the call deadline expired") {
		t.Fatalf("%+v", r)
	}
}

func TestToolSeesDeadlineAndCallInfo(t *testing.T) {
	reg := executor.NewRegistry()
	var got executor.CallInfo
	var deadline time.Time
	err := reg.Register(executor.Tool{Name: "peek", InputSchema: json.RawMessage(emptySchema), Timeout: time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			got, _ = executor.CallInfoFrom(ctx)
			deadline, _ = ctx.Deadline()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			sub, cancel := context.WithTimeout(ctx, time.Hour) // derived contexts work
			defer cancel()
			if d, _ := sub.Deadline(); !d.Equal(deadline) {
				return nil, fmt.Errorf("derived deadline %v, want %v", d, deadline)
			}
			return "ok", nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ci := executor.CallInfo{RunID: "run1", Step: 2, CallIndex: 1, Attempt: 3, IdempotencyKey: "run1/2/call_1"}
	ctx := executor.WithCallInfo(context.Background(), ci)
	before := time.Now()
	r := testutil.Must(executor.New(reg)).Execute(ctx, call("peek", `{}`), principal)
	if r.Status != toolbus.StatusSucceeded || r.Attempt != 3 || !reflect.DeepEqual(got, ci) {
		t.Fatalf("result %+v, call info %+v", r, got)
	}
	if deadline.Before(before.Add(59*time.Second)) || deadline.After(time.Now().Add(time.Minute)) {
		t.Errorf("tool deadline %v, want about a minute from now", deadline)
	}
	if _, ok := executor.CallInfoFrom(context.Background()); ok {
		t.Error("CallInfoFrom found info in a bare context")
	}
}

func TestConcurrencyLimit(t *testing.T) {
	reg := executor.NewRegistry()
	var inFlight, peak, ran atomic.Int64
	release := make(chan struct{})
	err := reg.Register(executor.Tool{Name: "limited", InputSchema: json.RawMessage(emptySchema), MaxConcurrency: 2, Timeout: 5 * time.Second,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ran.Add(1)
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return nil, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ex := testutil.Must(executor.New(reg, executor.WithLogger(slog.New(slog.DiscardHandler))))
	var wg sync.WaitGroup
	results := make([]toolbus.ToolResult, 5)
	for i := range results {
		wg.Go(func() { results[i] = ex.Execute(context.Background(), call("limited", `{}`), principal) })
	}
	time.Sleep(100 * time.Millisecond)
	if got := inFlight.Load(); got != 2 {
		t.Errorf("%d calls in flight, want 2", got)
	}
	close(release)
	wg.Wait()
	for _, r := range results {
		if r.Status != toolbus.StatusSucceeded {
			t.Errorf("%+v", r)
		}
	}
	if peak.Load() != 2 || ran.Load() != 5 {
		t.Errorf("peak %d, ran %d", peak.Load(), ran.Load())
	}

	// Waiting for a slot respects the context, and the tool does not run.
	block := make(chan struct{})
	defer close(block)
	err = reg.Register(executor.Tool{Name: "one", InputSchema: json.RawMessage(emptySchema), MaxConcurrency: 1, Timeout: 150 * time.Millisecond,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ran.Add(1)
			<-block
			return nil, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ran.Store(0)
	go ex.Execute(context.Background(), call("one", `{}`), principal) // holds the slot past its timeout
	time.Sleep(30 * time.Millisecond)
	// The slot is held until the test ends: a result at all, timed out for want of a free
	// slot, is the waiting call's own timeout.
	r := executeWithin(t, ex, context.Background(), call("one", `{}`))
	if r.Status != toolbus.StatusTimedOut || !strings.Contains(r.Error.Message, "free slot") {
		t.Errorf("waiting call: %+v", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	r = ex.Execute(ctx, call("one", `{}`), principal)
	if r.Status != toolbus.StatusCancelled {
		t.Errorf("cancelled waiting call: %+v", r)
	}
	if ran.Load() != 1 {
		t.Errorf("tool ran %d times, want 1 (the slot holder)", ran.Load())
	}
}

func TestAuthorizerSeesValidatedCall(t *testing.T) {
	reg := executor.NewRegistry()
	var ran atomic.Int64
	if err := reg.Register(executor.Tool{Name: "t", InputSchema: json.RawMessage(searchSchema),
		Func: func(context.Context, json.RawMessage) (any, error) { ran.Add(1); return nil, nil }}); err != nil {
		t.Fatal(err)
	}
	var gotP toolbus.Principal
	var gotArgs string
	ex := testutil.Must(executor.New(reg, executor.WithAuthorizer(executor.AuthorizerFunc(
		func(_ context.Context, p toolbus.Principal, tool string, args json.RawMessage) error {
			gotP, gotArgs = p, string(args)
			return executor.NewError("ignored_code", "only admins may search")
		}))))
	r := ex.Execute(context.Background(), call("t", `{"q":"x"}`), principal)
	if r.Code() != toolbus.CodeNotAuthorized || r.Error.Message != "not authorized to call t: only admins may search" ||
		gotP.ID != "user-1" || gotArgs != `{"q":"x"}` || ran.Load() != 0 {
		t.Fatalf("%+v principal %+v args %s", r, gotP, gotArgs)
	}
	// An invalid call never reaches the authorizer.
	gotArgs = ""
	r = ex.Execute(context.Background(), call("t", `{"q":1}`), principal)
	if r.Code() != toolbus.CodeInvalidArguments || gotArgs != "" {
		t.Fatalf("%+v args %s", r, gotArgs)
	}
	// A panicking authorizer rejects.
	ex = testutil.Must(executor.New(reg, executor.WithLogger(slog.New(slog.DiscardHandler)), executor.WithAuthorizer(executor.AuthorizerFunc(
		func(context.Context, toolbus.Principal, string, json.RawMessage) error { panic("auth backend down") }))))
	r = ex.Execute(context.Background(), call("t", `{"q":"x"}`), principal)
	if r.Code() != toolbus.CodeNotAuthorized || strings.Contains(r.Content, "backend down") || ran.Load() != 0 {
		t.Fatalf("%+v", r)
	}
}

func TestBigOutputIsTruncated(t *testing.T) {
	reg := executor.NewRegistry()
	big := strings.Repeat("aé€😀", 10<<20/10) // 10 MiB of 1 to 4 byte runes
	for _, tool := range []executor.Tool{
		{Name: "big_text", Func: func(context.Context, json.RawMessage) (any, error) { return big, nil }},
		{Name: "big_json", Func: func(context.Context, json.RawMessage) (any, error) {
			return map[string]any{"data": big, "n": 1}, nil
		}},
		{Name: "small_bound", MaxOutputBytes: 300, Func: func(context.Context, json.RawMessage) (any, error) { return big[:1000], nil }},
	} {
		tool.InputSchema = json.RawMessage(emptySchema)
		if err := reg.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	ex := testutil.Must(executor.New(reg))
	for _, tc := range []struct {
		tool string
		max  int
	}{{"big_text", executor.DefaultMaxOutputBytes}, {"big_json", executor.DefaultMaxOutputBytes}, {"small_bound", 300}} {
		r := ex.Execute(context.Background(), call(tc.tool, `{}`), principal)
		if r.Status != toolbus.StatusSucceeded || r.Truncated == nil {
			t.Fatalf("%s: %+v", tc.tool, r.Truncated)
		}
		if len(r.Content) > tc.max || len(r.Content) < tc.max-100 || !utf8.ValidString(r.Content) {
			t.Errorf("%s: content %d bytes (max %d), valid UTF-8 %v", tc.tool, len(r.Content), tc.max, utf8.ValidString(r.Content))
		}
		marker := fmt.Sprintf("\n…[truncated: kept %d of %d bytes]…\n", r.Truncated.KeptBytes, r.Truncated.OriginalBytes)
		if !strings.Contains(r.Content, marker) || r.Truncated.KeptBytes+len(marker) != len(r.Content) {
			t.Errorf("%s: marker %q missing or counts wrong: %+v", tc.tool, marker, *r.Truncated)
		}
		if r.Truncated.OriginalBytes < 1000 || !json.Valid(r.Output) || len(r.Output) < r.Truncated.OriginalBytes {
			t.Errorf("%s: output %d bytes, truncation %+v", tc.tool, len(r.Output), *r.Truncated)
		}
	}
}

func TestErrorMessagesAreBounded(t *testing.T) {
	reg := executor.NewRegistry()
	long := strings.Repeat("é\"\n", 5000)
	if err := reg.Register(executor.Tool{Name: "loud", InputSchema: json.RawMessage(emptySchema), MaxOutputBytes: 512,
		Func: func(context.Context, json.RawMessage) (any, error) { return nil, errors.New(long) }}); err != nil {
		t.Fatal(err)
	}
	r := testutil.Must(executor.New(reg)).Execute(context.Background(), call("loud", `{}`), principal)
	if len(r.Content) > 512 || !json.Valid([]byte(r.Content)) || !strings.Contains(r.Error.Message, "truncated") {
		t.Fatalf("content %d bytes: %q", len(r.Content), r.Content)
	}
	// A long unknown tool name is cut in the message.
	r = testutil.Must(executor.New(reg)).Execute(context.Background(), call(strings.Repeat("x", 10000), `{}`), principal)
	if r.Code() != toolbus.CodeUnknownTool || len(r.Error.Message) > 300 {
		t.Fatalf("%+v", r.Error)
	}
}

func TestExecuteNilContextAndEmptyExecutor(t *testing.T) {
	ex := testutil.Must(executor.New(nil))
	//nolint:staticcheck // a nil context must not panic
	r := ex.Execute(nil, call("x", `{}`), principal)
	if r.Code() != toolbus.CodeUnknownTool || ex.Registry() == nil {
		t.Fatalf("%+v", r)
	}
}

func TestConcurrentExecute(t *testing.T) {
	f := newFixture(t)
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Go(func() {
			tools := []string{"search", "empty", "typed_error", "panics", "secrets"}
			tool := tools[i%len(tools)]
			args := `{}`
			if tool == "search" {
				args = `{"q":"x"}`
			}
			r := f.ex.Execute(context.Background(), call(tool, args), principal)
			if !r.Status.Valid() || r.Tool != tool {
				t.Errorf("%+v", r)
			}
		})
	}
	wg.Wait()
}

type panicMarshaler struct{}

func (panicMarshaler) MarshalJSON() ([]byte, error) { panic("marshal boom") }

func TestBadValuesFromToolsDoNotPanic(t *testing.T) {
	reg := executor.NewRegistry()
	tools := map[string]func(context.Context, json.RawMessage) (any, error){
		"marshal_panic": func(context.Context, json.RawMessage) (any, error) { return panicMarshaler{}, nil },
		"details_panic": func(context.Context, json.RawMessage) (any, error) {
			return nil, &executor.Error{Code: "x", Message: "m", Details: panicMarshaler{}}
		},
		"details_bad": func(context.Context, json.RawMessage) (any, error) {
			return nil, &executor.Error{Code: "x", Message: "m", Details: make(chan int)}
		},
		"nil_typed_error": func(context.Context, json.RawMessage) (any, error) { return nil, (*executor.Error)(nil) },
		"stack_in_error": func(context.Context, json.RawMessage) (any, error) {
			return nil, errors.New("failed: goroutine 7 [running]:\nmain.f()\n\t/src/main.go:12 +0x1d")
		},
		"frame_in_error": func(context.Context, json.RawMessage) (any, error) {
			return nil, errors.New("db error at /app/store/db.go:88 (connection reset)")
		},
	}
	for name, fn := range tools {
		if err := reg.Register(executor.Tool{Name: name, InputSchema: json.RawMessage(emptySchema), Func: fn}); err != nil {
			t.Fatal(err)
		}
	}
	ex := testutil.Must(executor.New(reg, executor.WithLogger(slog.New(slog.DiscardHandler))))
	want := map[string]string{"marshal_panic": toolbus.CodeToolInternalError, "details_panic": toolbus.CodeToolInternalError,
		"details_bad": "x", "nil_typed_error": toolbus.CodeToolError, "stack_in_error": toolbus.CodeToolError,
		"frame_in_error": toolbus.CodeToolError}
	for name, code := range want {
		r := ex.Execute(context.Background(), toolbus.ToolCall{CallID: "call_1", Tool: name, Arguments: `{}`}, principal)
		if r.Status != toolbus.StatusFailed || r.Code() != code {
			t.Errorf("%s: %s/%s, want failed/%s: %+v", name, r.Status, r.Code(), code, r)
		}
		for _, bad := range []string{"goroutine ", ".go:", "marshal boom"} {
			if strings.Contains(r.Content, bad) {
				t.Errorf("%s: content %q has %q", name, r.Content, bad)
			}
		}
	}
}

// New refuses an option out of its range instead of replacing it with another value;
// zero keeps the default.
func TestNewRefusesBadOptions(t *testing.T) {
	for name, opt := range map[string]executor.Option{
		"negative timeout":         executor.WithDefaultTimeout(-time.Second),
		"negative max output":      executor.WithDefaultMaxOutputBytes(-1),
		"max output below the min": executor.WithDefaultMaxOutputBytes(executor.MinOutputBytes - 1),
	} {
		if ex, err := executor.New(nil, opt); !errors.Is(err, executor.ErrInvalidOption) || ex != nil {
			t.Errorf("%s: New = %v, %v; want nil and ErrInvalidOption", name, ex, err)
		}
	}
	for name, opt := range map[string]executor.Option{
		"zero timeout (the default)":    executor.WithDefaultTimeout(0),
		"zero max output (the default)": executor.WithDefaultMaxOutputBytes(0),
		"the min output":                executor.WithDefaultMaxOutputBytes(executor.MinOutputBytes),
	} {
		if _, err := executor.New(nil, opt); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
