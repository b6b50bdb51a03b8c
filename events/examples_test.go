package events_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/golden"
)

// example is one event of the contract with fixed values: CONTRACT.md and
// the schema tests all show or check what the real encoder makes of it.
type example struct {
	Type    string
	Subject string
	Meta    events.Meta
	Data    any
}

// The documents whose example blocks are generated from the encoder (paths from the
// events package directory).
var exampleDocs = []string{"../CONTRACT.md"}

var exampleAt = time.Date(2026, 11, 29, 12, 0, 3, 250_000_000, time.UTC)

const exRun = "run-7f3a"

// examples returns one example of every event type, in contract order. Types with more
// than one interesting shape (tool.finished) have extra examples, named type#n.
func examples() []example {
	call0 := toolbus.ToolCall{CallID: "call_01", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-404"}`}
	call1 := toolbus.ToolCall{CallID: "call_02", Tool: "restart_service", Arguments: `{"service":"auth-api"}`}
	principal := toolbus.Principal{ID: "alice", Roles: []string{"oncall"}}
	const trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tool := func(src string, step int, c toolbus.ToolCall, idx, n int) events.Meta {
		return events.Meta{Source: events.Source(src, "exec-1"), Time: exampleAt, RunID: exRun, Step: step,
			CallID: c.CallID, CallIndex: idx, CallCount: n, HasCall: true, TraceParent: trace}
	}
	run := func(src string, step int) events.Meta {
		return events.Meta{Source: events.Source(src, "host-1"), Time: exampleAt, RunID: exRun, Step: step}
	}
	ended := func(s toolbus.RunStatus, step int, e toolbus.RunEnded) example {
		e.RunID, e.Status = exRun, s
		m := run("injector", step)
		if s == toolbus.RunCompleted {
			m.Source = events.Source("planner", "host-1")
		}
		m.ID = events.IDRunEnded(exRun, step, s)
		return example{events.TypeRunEnded(s), events.SubjectRunEnded(exRun, s), m, e}
	}
	withID := func(m events.Meta, id string) events.Meta { m.ID = id; return m }
	finishedMeta := func(c toolbus.ToolCall, idx int) events.Meta {
		return withID(tool("executor", 0, c, idx, 2), events.IDToolFinished(exRun, 0, c.CallID))
	}
	usage := toolbus.Usage{InputTokens: 812, OutputTokens: 98}
	return []example{
		{events.TypeRunStarted, events.SubjectRunStarted(exRun, principal.ID), withID(run("client", 0), events.IDRunStarted(exRun)),
			toolbus.RunStarted{RunID: exRun, Messages: []toolbus.Message{
				{Role: toolbus.RoleSystem, Content: "You are the on-call assistant."},
				{Role: toolbus.RoleUser, Content: "What is going on with INC-404?"}},
				AllowedTools: []string{"lookup_incident", "restart_service"},
				Limits:       toolbus.Limits{MaxSteps: 10, Deadline: exampleAt.Add(10 * time.Minute), TokenBudget: 20000},
				Model:        "openai:gpt-4o", Principal: principal, StartedAt: exampleAt}},
		{events.TypeModelRequested, events.SubjectModelRequested(exRun), withID(run("injector", 0), events.IDModelRequested(exRun, 0)),
			toolbus.ModelRequested{RunID: exRun, Step: 0}},
		{events.TypeModelRequested + "#2", events.SubjectModelRequested(exRun), withID(run("injector", 1), events.IDModelRequested(exRun, 1)),
			toolbus.ModelRequested{RunID: exRun, Step: 1, PrevResults: []toolbus.ToolResult{
				{CallID: call0.CallID, Tool: call0.Tool, Status: toolbus.StatusFailed,
					Error:   &toolbus.ToolError{Code: "incident_not_found", Message: "no incident INC-404"},
					Content: `{"error":{"code":"incident_not_found","message":"no incident INC-404","retryable":false}}`,
					Attempt: 1, DurationMS: 12, Executor: "exec-1"},
				{CallID: call1.CallID, Tool: call1.Tool, Status: toolbus.StatusSucceeded,
					Content: `{"restarted":"auth-api"}`, Attempt: 1, DurationMS: 230, Executor: "exec-1"}}}},
		{events.TypeModelResponded, events.SubjectModelResponded(exRun), withID(run("planner", 0), events.IDModelResponded(exRun, 0)),
			toolbus.ModelResponded{RunID: exRun, Step: 0, Message: toolbus.Message{Role: toolbus.RoleAssistant,
				Content: "Let me look the incident up.", ToolCalls: []toolbus.ToolCall{call0, call1}},
				Usage: usage, Model: "gpt-4o", LatencyMS: 840}},
		{events.TypeToolRequested, events.SubjectToolRequested(exRun, call0.Tool),
			withID(tool("planner", 0, call0, 0, 2), events.IDToolRequested(exRun, 0, call0.CallID, false)),
			toolbus.ToolRequested{RunID: exRun, Step: 0, CallIndex: 0, CallCount: 2, Call: call0,
				Deadline: exampleAt.Add(10 * time.Minute), Principal: principal,
				AllowedTools: []string{"lookup_incident", "restart_service"}}},
		{events.TypeToolProgress, events.SubjectToolProgress(exRun, call0.Tool),
			events.Meta{ID: events.IDToolProgress(exRun, 0, call0.CallID, 1, 3), Source: events.Source("executor", "exec-1"), Time: exampleAt,
				RunID: exRun, Step: 0, CallID: call0.CallID, HasCall: true},
			toolbus.ToolProgress{RunID: exRun, Step: 0, CallID: call0.CallID, Tool: call0.Tool, Attempt: 1, Seq: 3,
				Done: 40, Total: 120, Message: "searched 40 of 120 archives"}},
		{events.TypeToolLog, events.SubjectToolLog(exRun, call0.Tool),
			events.Meta{ID: events.IDToolLog(exRun, 0, call0.CallID, 1, 2), Source: events.Source("executor", "exec-1"), Time: exampleAt,
				RunID: exRun, Step: 0, CallID: call0.CallID, HasCall: true},
			toolbus.ToolLog{RunID: exRun, Step: 0, CallID: call0.CallID, Tool: call0.Tool, Attempt: 1, Seq: 2,
				Level: "warning", Message: "archive 2025-11 is slow to answer", Attrs: json.RawMessage(`{"archive":"2025-11","ms":2300}`)}},
		{events.TypeToolQuestion, events.SubjectToolQuestion(exRun, call0.Tool),
			events.Meta{ID: events.IDToolQuestion(exRun, 0, call0.CallID, 1, 1), Source: events.Source("executor", "exec-1"), Time: exampleAt,
				RunID: exRun, Step: 0, CallID: call0.CallID, HasCall: true},
			toolbus.ToolQuestion{RunID: exRun, Step: 0, CallID: call0.CallID, Tool: call0.Tool, Attempt: 1, Seq: 1,
				Message: "Two incidents match INC-40: which one?",
				Schema:  json.RawMessage(`{"type":"object","properties":{"incident":{"type":"string","enum":["INC-401","INC-404"]}},"required":["incident"]}`)}},
		{events.TypeToolAnswer, events.SubjectToolAnswer(exRun, "alice"),
			events.Meta{ID: events.IDToolAnswer(exRun, 0, call0.CallID, 1, 1), Source: events.Source("mcp", "mcp-1"), Time: exampleAt,
				RunID: exRun, Step: 0, CallID: call0.CallID, HasCall: true},
			toolbus.ToolAnswer{RunID: exRun, Step: 0, CallID: call0.CallID, Tool: call0.Tool, Attempt: 1, Seq: 1,
				Action: "accept", Content: json.RawMessage(`{"incident":"INC-404"}`), Who: "alice"}},
		{events.TypeToolFinished, events.SubjectToolFinished(exRun, call0.Tool), finishedMeta(call0, 0),
			toolbus.ToolFinished{RunID: exRun, Step: 0, CallIndex: 0, CallCount: 2, ToolResult: toolbus.ToolResult{
				CallID: call0.CallID, Tool: call0.Tool, Status: toolbus.StatusFailed,
				Error:   &toolbus.ToolError{Code: "incident_not_found", Message: "no incident INC-404"},
				Content: `{"error":{"code":"incident_not_found","message":"no incident INC-404","retryable":false}}`,
				Attempt: 1, DurationMS: 12, Executor: "exec-1"}}},
		{events.TypeToolFinished + "#2", events.SubjectToolFinished(exRun, "big_output"),
			finishedMeta(toolbus.ToolCall{CallID: "call_03", Tool: "big_output"}, 1),
			toolbus.ToolFinished{RunID: exRun, Step: 0, CallIndex: 1, CallCount: 2, ToolResult: toolbus.ToolResult{
				CallID: "call_03", Tool: "big_output", Status: toolbus.StatusSucceeded,
				Output:  json.RawMessage(`{"lines":["auth-api: pool exhausted","password=[REDACTED]"]}`),
				Content: `{"lines":["auth-api: pool exhausted",` + "\n[... 5226496 bytes omitted ...]\n" + `"password=[REDACTED]"]}`,
				Truncated: &toolbus.Truncation{OriginalBytes: 5242880, KeptBytes: 16384,
					Ref: "kv://toolbus_outputs/big_output.run-7f3a.0.call_03"},
				Redactions: 1, Attempt: 1, DurationMS: 40, Executor: "exec-1"}}},
		{events.TypeToolFinished + "#3", events.SubjectToolFinished(exRun, "calculator"),
			finishedMeta(toolbus.ToolCall{CallID: "call_04", Tool: "calculator"}, 1),
			toolbus.ToolFinished{RunID: exRun, Step: 0, CallIndex: 1, CallCount: 2, ToolResult: toolbus.ToolResult{
				CallID: "call_04", Tool: "calculator", Status: toolbus.StatusRejected,
				Error: &toolbus.ToolError{Code: toolbus.CodeInvalidArguments, Message: "arguments violate the input schema",
					Details: json.RawMessage(`[{"path":"/expression","message":"missing property"}]`)},
				Content: `{"error":{"code":"invalid_arguments","message":"arguments violate the input schema","retryable":false}}`,
				Attempt: 1, DurationMS: 0, Executor: "exec-1"}}},
		{events.TypeToolWaiting, events.SubjectToolWaiting(exRun, call1.Tool),
			withID(tool("executor", 0, call1, 1, 2), events.IDToolWaiting(exRun, 0, call1.CallID)),
			toolbus.ToolWaiting{RunID: exRun, Step: 0, CallIndex: 1, CallCount: 2, Call: call1}},
		{events.TypeApprovalGranted, events.SubjectApproval(exRun, true, "bob"),
			events.Meta{ID: events.IDApproval(exRun, "0/"+call1.CallID, true), Source: events.Source("cli", "bob"), Time: exampleAt,
				RunID: exRun, Step: 0, CallID: call1.CallID, HasCall: true},
			toolbus.Approval{RunID: exRun, CallID: call1.CallID, Who: "bob", Why: "change CHG-1 approved"}},
		{events.TypeApprovalDenied, events.SubjectApproval(exRun, false, "bob"),
			events.Meta{ID: events.IDApproval(exRun, "0/"+call1.CallID, false), Source: events.Source("cli", "bob"), Time: exampleAt,
				RunID: exRun, Step: 0, CallID: call1.CallID, HasCall: true},
			toolbus.Approval{RunID: exRun, CallID: call1.CallID, Who: "bob", Why: "not during the freeze"}},
		{events.TypeRunCancel, events.SubjectRunCancel(exRun, "alice"), withID(run("cli", 0), events.IDRunCancel(exRun)),
			toolbus.Cancel{RunID: exRun, Reason: "wrong incident", Who: "alice"}},
		ended(toolbus.RunCompleted, 2, toolbus.RunEnded{Answer: "INC-404 does not exist. INC-001 is a high-severity incident on auth-api.",
			StepsUsed: 3, Usage: toolbus.Usage{InputTokens: 2400, OutputTokens: 310}}),
		ended(toolbus.RunWaitingForApproval, 0, toolbus.RunEnded{Reason: "1 call waits for approval",
			Pending: []toolbus.ToolCall{call1}, StepsUsed: 1, Usage: usage}),
		ended(toolbus.RunFailed, 1, toolbus.RunEnded{Reason: "tool restart_service failed: tool_internal_error",
			Code: toolbus.CodeToolInternalError, StepsUsed: 2, Usage: usage}),
		ended(toolbus.RunLimitReached, 10, toolbus.RunEnded{Reason: "max steps 10 reached", Code: toolbus.LimitMaxSteps,
			StepsUsed: 10, Usage: toolbus.Usage{InputTokens: 9100, OutputTokens: 800}}),
		ended(toolbus.RunCancelled, 1, toolbus.RunEnded{Reason: "wrong incident", StepsUsed: 1, Usage: usage}),
		{events.TypeRunTimer, events.SubjectTimer(exRun), withID(run("injector", 0), events.IDTimer(exRun)),
			events.RunTimer{RunID: exRun, Deadline: exampleAt.Add(10 * time.Minute)}},
	}
}

// baseType strips the #n suffix of extra examples.
func baseType(name string) string { t, _, _ := strings.Cut(name, "#"); return t }

// encode encodes e with the real encoder.
func (e example) encode(t testing.TB) *nats.Msg {
	t.Helper()
	m := e.Meta
	m.Type = baseType(e.Type)
	msg, err := events.Encode(e.Subject, m, e.Data)
	if err != nil {
		t.Fatalf("%s: %v", e.Type, err)
	}
	return msg
}

// contractTypes returns events.EventTypes, after checking that it lists every Type*
// constant of the package's source files (read from the source, so a new event type
// cannot be left out of the schemas, the examples, the AsyncAPI document and
// CONTRACT.md) and every run outcome.
func contractTypes(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var decls []ast.Decl
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, f.Decls...)
	}
	if len(decls) == 0 {
		t.Fatal("no declarations in package events")
	}
	types := events.EventTypes()
	for _, d := range decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !strings.HasPrefix(n.Name, "Type") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Contains(types, v) {
					t.Fatalf("events.EventTypes does not list %s (%s)", v, n.Name)
				}
			}
		}
	}
	for _, s := range []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunWaitingForApproval, toolbus.RunFailed,
		toolbus.RunLimitReached, toolbus.RunCancelled} {
		if !slices.Contains(types, events.TypeRunEnded(s)) {
			t.Fatalf("events.EventTypes does not list %s", events.TypeRunEnded(s))
		}
	}
	return types
}

// Every event type of the contract has an example (and so a documented payload and a
// schema that is checked against the encoder).
func TestExamplesCoverEveryType(t *testing.T) {
	have := map[string]bool{}
	for _, e := range examples() {
		have[baseType(e.Type)] = true
	}
	for _, typ := range contractTypes(t) {
		if !have[typ] {
			t.Errorf("event type %s has no example in examples_test.go", typ)
		}
	}
	if len(have) != len(contractTypes(t)) {
		t.Errorf("examples cover %d types, the contract has %d", len(have), len(contractTypes(t)))
	}
}

// dataBlock is the documented form of e's data: the encoder's body, indented.
func (e example) dataBlock(t testing.TB) string {
	var b bytes.Buffer
	if err := json.Indent(&b, e.encode(t).Data, "", "  "); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// wireBlock is the whole NATS message of e as the encoder builds it: subject, headers
// (sorted) and the body byte for byte.
func (e example) wireBlock(t testing.TB) string {
	msg := e.encode(t)
	var b strings.Builder
	fmt.Fprintf(&b, "subject: %s\n", msg.Subject)
	keys := make([]string, 0, len(msg.Header))
	for k := range msg.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range msg.Header[k] {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	fmt.Fprintf(&b, "\n%s", msg.Data)
	return b.String()
}

// exampleBlockRE finds a marked example: an HTML comment naming the example, then the
// fenced block that follows it.
var exampleBlockRE = regexp.MustCompile("(?s)<!-- (data|wire): ([a-z_.]+(?:#[0-9]+)?) -->\n```([a-z]*)\n(.*?)\n```")

// The example payloads of CONTRACT.md are what the encoder writes, so the
// documentation cannot drift from the wire. Regenerate the blocks with
// go test ./events -run ExampleBlocks -update.
func TestExampleBlocks(t *testing.T) {
	byName := map[string]example{}
	for _, e := range examples() {
		byName[e.Type] = e
	}
	for _, doc := range exampleDocs {
		t.Run(filepath.Base(doc), func(t *testing.T) {
			raw, err := os.ReadFile(doc)
			if err != nil {
				t.Fatal(err)
			}
			text := string(raw)
			matches := exampleBlockRE.FindAllStringSubmatchIndex(text, -1)
			if len(matches) == 0 {
				t.Fatalf("%s has no marked example blocks (<!-- data: <type> --> before a json block)", doc)
			}
			var out strings.Builder
			last := 0
			for _, m := range matches {
				kind, name, body := text[m[2]:m[3]], text[m[4]:m[5]], text[m[8]:m[9]]
				e, ok := byName[name]
				if !ok {
					t.Errorf("%s: block %s %q names no example", doc, kind, name)
					continue
				}
				want := e.dataBlock(t)
				if kind == "wire" {
					want = e.wireBlock(t)
				}
				if body != want && !golden.Update() {
					t.Errorf("%s: the %s example of %s is not what the encoder writes (go test ./events -run ExampleBlocks -update)\n got:\n%s\nwant:\n%s", doc, kind, name, body, want)
				}
				out.WriteString(text[last:m[8]])
				out.WriteString(want)
				last = m[9]
			}
			out.WriteString(text[last:])
			if golden.Update() && out.String() != text {
				if err := os.WriteFile(doc, []byte(out.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// CONTRACT.md shows the data of every event type.
func TestContractDocShowsEveryType(t *testing.T) {
	raw, err := os.ReadFile("../CONTRACT.md")
	if err != nil {
		t.Fatal(err)
	}
	var shown []string
	for _, m := range exampleBlockRE.FindAllStringSubmatch(string(raw), -1) {
		if m[1] == "data" {
			shown = append(shown, baseType(m[2]))
		}
	}
	for _, typ := range contractTypes(t) {
		if !slices.Contains(shown, typ) {
			t.Errorf("CONTRACT.md shows no data example of %s", typ)
		}
	}
}
