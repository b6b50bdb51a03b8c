package events_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sjs "github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// asyncAPIDir is the Node validator of asyncapi.yaml (from the events package directory).
const asyncAPIDir = "../tools/asyncapi-validate"

// asyncAPISummary is what validate.js --summary prints: the document as the official
// parser resolved it.
type asyncAPISummary struct {
	Version  string `json:"version"`
	Channels []struct {
		ID         string   `json:"id"`
		Address    string   `json:"address"`
		Parameters []string `json:"parameters"`
		Messages   []string `json:"messages"`
	} `json:"channels"`
	Messages []struct {
		ID          string         `json:"id"`
		Name        string         `json:"name"`
		ContentType string         `json:"contentType"`
		Headers     map[string]any `json:"headers"`
		Payload     map[string]any `json:"payload"`
	} `json:"messages"`
	Operations []asyncAPIOperation `json:"operations"`
}

// asyncAPIOperation is one operation: a role (its one tag) sends or receives messages.
type asyncAPIOperation struct {
	ID       string   `json:"id"`
	Action   string   `json:"action"`
	Channels []string `json:"channels"`
	Messages []string `json:"messages"`
	Tags     []string `json:"tags"`
}

// parseAsyncAPI validates asyncapi.yaml with the official AsyncAPI parser and returns
// the resolved document. Without Node or the parser's packages the test is skipped on a
// developer machine, and fails under CI (CI set), where .ci/run installs them with npm ci.
func parseAsyncAPI(t *testing.T) asyncAPISummary {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(asyncAPIDir, "node_modules", "@asyncapi", "parser", "package.json"))
	}
	if err != nil {
		msg := "the AsyncAPI parser is not installed (cd tools/asyncapi-validate && npm ci): " + err.Error()
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, node, filepath.Join(asyncAPIDir, "validate.js"), "../asyncapi.yaml", "--summary")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("asyncapi.yaml does not validate: %v\n%s", err, stderr.String())
	}
	var s asyncAPISummary
	if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
		t.Fatalf("validate.js --summary: %v\n%s", err, stdout.String())
	}
	return s
}

// sampleSubject returns the subject of events of type typ for run r and tool x, from the
// same functions the workers publish with.
func sampleSubject(t *testing.T, typ, r, x string) string {
	switch typ {
	case events.TypeRunStarted:
		return events.SubjectRunStarted(r, "p")
	case events.TypeModelRequested:
		return events.SubjectModelRequested(r)
	case events.TypeModelResponded:
		return events.SubjectModelResponded(r)
	case events.TypeToolRequested:
		return events.SubjectToolRequested(r, x)
	case events.TypeToolFinished:
		return events.SubjectToolFinished(r, x)
	case events.TypeToolWaiting:
		return events.SubjectToolWaiting(r, x)
	case events.TypeToolProgress:
		return events.SubjectToolProgress(r, x)
	case events.TypeToolLog:
		return events.SubjectToolLog(r, x)
	case events.TypeToolQuestion:
		return events.SubjectToolQuestion(r, x)
	case events.TypeToolAnswer:
		return events.SubjectToolAnswer(r, "p")
	case events.TypeApprovalGranted:
		return events.SubjectApproval(r, true, "p")
	case events.TypeApprovalDenied:
		return events.SubjectApproval(r, false, "p")
	case events.TypeRunCancel:
		return events.SubjectRunCancel(r, "p")
	case events.TypeRunTimer:
		return events.SubjectTimer(r)
	}
	if s, ok := strings.CutPrefix(typ, "toolbus.run."); ok {
		return events.SubjectRunEnded(r, toolbus.RunStatus(s))
	}
	t.Fatalf("no subject for %s", typ)
	return ""
}

// headerConst digs the const of a header property out of a resolved headers schema
// (allOf of the shared CloudEvents headers and the message's own constants).
func headerConst(s map[string]any, name string) (any, bool) {
	if props, ok := s["properties"].(map[string]any); ok {
		if p, ok := props[name].(map[string]any); ok {
			if c, ok := p["const"]; ok {
				return c, true
			}
		}
	}
	all, _ := s["allOf"].([]any)
	for _, sub := range all {
		if m, ok := sub.(map[string]any); ok {
			if c, ok := headerConst(m, name); ok {
				return c, true
			}
		}
	}
	return nil, false
}

// asyncapi.yaml is valid AsyncAPI 3.0 (official parser) and says what the code does:
// one message per event type with its CloudEvents type, dataschema and payload schema,
// on the channel whose address is the subject the workers publish on, with run and tool
// parameters; each event has a sender and a receiver; and the headers of every encoded
// example validate against the message's headers schema.
func TestAsyncAPI(t *testing.T) {
	doc := parseAsyncAPI(t)
	if doc.Version != "3.0.0" {
		t.Errorf("asyncapi %s, want 3.0.0", doc.Version)
	}
	msgByName := map[string]int{}
	for i, m := range doc.Messages {
		if _, dup := msgByName[m.Name]; dup {
			t.Errorf("two messages named %s", m.Name)
		}
		msgByName[m.Name] = i
	}
	if len(doc.Messages) != len(contractTypes(t)) {
		t.Errorf("%d messages, the contract has %d event types", len(doc.Messages), len(contractTypes(t)))
	}
	headerSchemas := map[string]*sjs.Schema{}
	c := sjs.NewCompiler()
	c.AssertFormat()
	for _, typ := range contractTypes(t) {
		i, ok := msgByName[typ]
		if !ok {
			t.Errorf("asyncapi.yaml has no message named %s", typ)
			continue
		}
		m := doc.Messages[i]
		if m.ContentType != events.ContentTypeJSON {
			t.Errorf("%s: contentType %q", typ, m.ContentType)
		}
		if got, _ := headerConst(m.Headers, "ce-type"); got != typ {
			t.Errorf("%s: headers ce-type const %v", typ, got)
		}
		if got, _ := headerConst(m.Headers, "ce-dataschema"); got != events.DataSchema(typ) {
			t.Errorf("%s: headers ce-dataschema const %v, want %s", typ, got, events.DataSchema(typ))
		}
		if got := m.Payload["$id"]; got != events.DataSchema(typ) {
			t.Errorf("%s: payload is the schema %v, want %s", typ, got, events.DataSchema(typ))
		}
		// Channels: the address is the subject, with {run} and {tool} parameters.
		var found bool
		for _, ch := range doc.Channels {
			if !slices.Contains(ch.Messages, m.ID) {
				continue
			}
			found = true
			sample := strings.NewReplacer("{run}", "run-1", "{tool}", "calculator", "{principal}", "p", "{actor}", "p").Replace(ch.Address)
			if want := sampleSubject(t, typ, "run-1", "calculator"); sample != want {
				t.Errorf("%s: channel %s address %s, the workers publish on %s", typ, ch.ID, ch.Address, want)
			}
			wantParams := []string{"run"}
			for _, p := range []string{"tool", "principal", "actor"} {
				if strings.Contains(ch.Address, "{"+p+"}") {
					wantParams = append(wantParams, p)
				}
			}
			if !slices.Equal(ch.Parameters, wantParams) {
				t.Errorf("%s: channel %s parameters %v, want %v", typ, ch.ID, ch.Parameters, wantParams)
			}
		}
		if !found {
			t.Errorf("%s: on no channel", typ)
		}
		// Every event has a role that sends it and one that receives it.
		actions := map[string]bool{}
		for _, op := range doc.Operations {
			if slices.Contains(op.Messages, m.ID) {
				actions[op.Action] = true
				if len(op.Tags) != 1 {
					t.Errorf("operation %s: tags %v, want one role", op.ID, op.Tags)
				}
			}
		}
		if !actions["send"] || !actions["receive"] {
			t.Errorf("%s: operations %v, want a sender and a receiver", typ, actions)
		}
		raw, err := json.Marshal(m.Headers)
		if err != nil {
			t.Fatal(err)
		}
		hdoc, err := sjs.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		url := "mem://asyncapi/headers/" + typ
		if err := c.AddResource(url, hdoc); err != nil {
			t.Fatal(err)
		}
		if headerSchemas[typ], err = c.Compile(url); err != nil {
			t.Fatalf("%s headers schema: %v", typ, err)
		}
	}
	// The roles of the contract, as the workers implement them.
	for _, want := range []struct{ role, action, typ string }{
		{"client", "send", events.TypeRunStarted},
		{"planner", "receive", events.TypeModelRequested},
		{"planner", "send", events.TypeToolRequested},
		{"executor", "receive", events.TypeToolRequested},
		{"executor", "send", events.TypeToolFinished},
		{"executor", "send", events.TypeToolWaiting},
		{"executor", "send", events.TypeToolProgress},
		{"executor", "send", events.TypeToolLog},
		{"executor", "send", events.TypeToolQuestion},
		{"executor", "receive", events.TypeToolAnswer},
		{"client", "send", events.TypeToolAnswer},
		{"injector", "receive", events.TypeToolFinished},
		{"injector", "send", events.TypeModelRequested},
		{"operator", "send", events.TypeApprovalGranted},
		{"operator", "send", events.TypeRunCancel},
		{"injector", "send", events.TypeRunTimer},
		{"injector", "receive", events.TypeRunTimer},
	} {
		i, ok := msgByName[want.typ]
		if !ok {
			continue
		}
		if !slices.ContainsFunc(doc.Operations, func(op asyncAPIOperation) bool {
			return op.Action == want.action && slices.Contains(op.Tags, want.role) && slices.Contains(op.Messages, doc.Messages[i].ID)
		}) {
			t.Errorf("no operation: %s %ss %s", want.role, want.action, want.typ)
		}
	}
	// Only the injector asks for a step (deploy/nats/permissions.conf): no client does.
	for _, op := range doc.Operations {
		if i, ok := msgByName[events.TypeModelRequested]; ok && op.Action == "send" &&
			slices.Contains(op.Messages, doc.Messages[i].ID) && !slices.Contains(op.Tags, "injector") {
			t.Errorf("operation %s: %v send %s, which only the injector may publish", op.ID, op.Tags, events.TypeModelRequested)
		}
	}
	// The encoder's headers are what the document says.
	for _, e := range examples() {
		s, ok := headerSchemas[baseType(e.Type)]
		if !ok {
			continue
		}
		msg := e.encode(t)
		h := map[string]any{}
		for k, vs := range msg.Header {
			h[k] = vs[0]
		}
		if err := s.Validate(h); err != nil {
			t.Errorf("%s: the encoder's headers do not match asyncapi.yaml: %v\n%v", e.Type, err, h)
		}
	}
}
