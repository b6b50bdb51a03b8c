package events_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/invopop/jsonschema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sjs "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/reads"
)

// asyncAPIDir is the Node validator of asyncapi.yaml (from the events package directory).
const asyncAPIDir = "../tools/asyncapi-validate"

// asyncAPISummary is what validate.js --summary prints: the document as the official
// parser resolved it.
type asyncAPISummary struct {
	Version    string              `json:"version"`
	Channels   []asyncAPIChannel   `json:"channels"`
	Messages   []asyncAPIMessage   `json:"messages"`
	Operations []asyncAPIOperation `json:"operations"`
}

// asyncAPIChannel is one channel: its address (empty for a reply channel whose address
// is the requester's inbox), parameters and messages.
type asyncAPIChannel struct {
	ID         string   `json:"id"`
	Address    string   `json:"address"`
	Parameters []string `json:"parameters"`
	Messages   []string `json:"messages"`
}

// asyncAPIMessage is one message with its resolved headers and payload schemas.
type asyncAPIMessage struct {
	ID          string         `json:"id"`
	Name        string         `json:"name"`
	ContentType string         `json:"contentType"`
	Headers     map[string]any `json:"headers"`
	Payload     map[string]any `json:"payload"`
}

// asyncAPIOperation is one operation: a role (its one tag) sends or receives messages.
type asyncAPIOperation struct {
	ID       string   `json:"id"`
	Action   string   `json:"action"`
	Channels []string `json:"channels"`
	Messages []string `json:"messages"`
	Tags     []string `json:"tags"`
	// Reply is the reply of a request/reply operation, nil for others.
	Reply *struct {
		Channel  string   `json:"channel"`
		Address  *string  `json:"address"`
		Messages []string `json:"messages"`
	} `json:"reply"`
}

// parseAsyncAPI validates asyncapi.yaml with the official AsyncAPI parser and returns
// the resolved document. Without Node or the parser's packages the test is skipped on a
// developer machine, and fails under CI (CI set), where make test installs them with npm ci.
func parseAsyncAPI(t *testing.T) asyncAPISummary {
	t.Helper()
	testutil.NeedNPMPackage(t, asyncAPIDir, "node_modules/@asyncapi/parser/package.json")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
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
	// Events are the messages with CloudEvents headers; the others are the core's
	// services (TestAsyncAPITenancy).
	var nEvents int
	for _, m := range doc.Messages {
		if _, ok := headerConst(m.Headers, "ce-type"); ok {
			nEvents++
		}
	}
	if nEvents != len(contractTypes(t)) {
		t.Errorf("%d event messages, the contract has %d event types", nEvents, len(contractTypes(t)))
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

// The sample tokens the channel parameters of the core's services stand for.
var serviceTokens = map[string]string{
	"{run}": "run-1", "{tool}": "calc", "{identity}": "alice", "{team}": "alpha",
	"{stream}": events.DefaultStream, "{subject}": "toolbus.run-1.tool.finished.calc",
}

// serviceAddress fills a channel address's parameters with serviceTokens.
func serviceAddress(address string) string {
	for p, v := range serviceTokens {
		address = strings.ReplaceAll(address, p, v)
	}
	return address
}

// asyncAPIService is one channel of the core's services of the accounts layout: the
// subject the Go helpers build of serviceTokens, the roles that send and receive on it,
// and for a request/reply service the messages of its reply.
type asyncAPIService struct {
	channel, subject string
	sender, receiver string
	request          string
	replyChannel     string
	reply            []string
	wantParams       []string
}

func tenancyServices() []asyncAPIService {
	subj := serviceTokens["{subject}"]
	api := events.ReadAPIPrefix("alice") + "." // the JetStream API's subjects follow the prefix
	return []asyncAPIService{
		{"runEndedNotice", events.SubjectRunEndedFor("run-1", "calc"), "injector", "executor", "runEndedNotice", "", nil, []string{"run", "tool"}},
		{"readStreamInfo", api + "STREAM.INFO." + events.DefaultStream, "client", "injector", "readStreamInfoRequest", "readStreamInfoReply", []string{"readStreamInfoReply"}, []string{"identity", "stream"}},
		{"readDirectGet", api + "DIRECT.GET." + events.DefaultStream, "client", "injector", "readDirectGetRequest", "readDirectGetReply", []string{"readDirectGetReply"}, []string{"identity", "stream"}},
		{"readDirectGetBySubject", api + "DIRECT.GET." + events.DefaultStream + "." + subj, "client", "injector", "readDirectGetBySubjectRequest", "readDirectGetReply", []string{"readDirectGetReply"}, []string{"identity", "stream", "subject"}},
		{"readRuns", events.ReadRunsSubject("alice"), "client", "injector", "readRunsRequest", "readRunsReply", []string{"readRunsReply"}, []string{"identity"}},
		{"readTools", events.ReadToolsSubject("alice"), "client", "injector", "readToolsRequest", "readToolsReply", []string{"readToolsReply"}, []string{"identity"}},
		{"readFollow", events.FollowSubject("alice", "run-1"), "client", "injector", "readFollowRequest", "readFollowReply", []string{"readDirectGetReply"}, []string{"identity", "run"}},
		{"toolQuestionState", events.ToolQuestionSubject("calc"), "executor", "injector", "toolQuestionQuery", "toolQuestionStateReply", []string{"toolQuestionStateReply"}, []string{"tool"}},
		{"teamWrite", events.TeamWriteSubject("alpha", subj), "executor", "injector", "tenantWrite", "writeReply", []string{"writeAck", "writeRefused"}, []string{"team", "subject"}},
		{"clientWrite", events.ClientWriteSubject("alice", subj), "client", "injector", "tenantWrite", "writeReply", []string{"writeAck", "writeRefused"}, []string{"identity", "subject"}},
	}
}

// compileSchema compiles a schema of the resolved document (a payload or headers).
func compileSchema(t *testing.T, name string, s any) *sjs.Schema {
	t.Helper()
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := sjs.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := sjs.NewCompiler()
	c.AssertFormat()
	url := "mem://asyncapi/" + name
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	out, err := c.Compile(url)
	if err != nil {
		t.Fatalf("%s schema: %v", name, err)
	}
	return out
}

// validateJSON validates data (JSON bytes) against s.
func validateJSON(t *testing.T, what string, s *sjs.Schema, data []byte) error {
	t.Helper()
	doc, err := sjs.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: not JSON: %w: %s", what, err, data)
	}
	if err := s.Validate(doc); err != nil {
		return fmt.Errorf("%s: %s does not match asyncapi.yaml: %w", what, data, err)
	}
	return nil
}

// matchGoType checks that the object schema s of the document has exactly the JSON
// fields of the Go type of v (reflected as schemas/ is generated), the same required
// ones, their JSON types, and enums within the Go type's.
func matchGoType(t *testing.T, what string, s map[string]any, v any) {
	t.Helper()
	r := &jsonschema.Reflector{AllowAdditionalProperties: true, ExpandedStruct: true, Anonymous: true,
		Mapper: func(rt reflect.Type) *jsonschema.Schema {
			if rt == runStatusType {
				return enum(toolbus.RunRunning, toolbus.RunCompleted, toolbus.RunWaitingForApproval, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled)
			}
			return nil
		}}
	gen := r.Reflect(v)
	props, _ := s["properties"].(map[string]any)
	var goNames []string
	for p := gen.Properties.Oldest(); p != nil; p = p.Next() {
		goNames = append(goNames, p.Key)
		d, ok := props[p.Key].(map[string]any)
		if !ok {
			t.Errorf("%s: asyncapi.yaml has no property %s of %T", what, p.Key, v)
			continue
		}
		if p.Value.Type != "" && d["type"] != p.Value.Type {
			t.Errorf("%s: property %s has type %v, %T has %s", what, p.Key, d["type"], v, p.Value.Type)
		}
		if denum, ok := d["enum"].([]any); ok {
			for _, e := range denum {
				if !slices.Contains(p.Value.Enum, e) {
					t.Errorf("%s: property %s allows %v, which %T does not have", what, p.Key, e, v)
				}
			}
		}
	}
	var docNames []string
	for k := range props {
		docNames = append(docNames, k)
	}
	slices.Sort(goNames)
	slices.Sort(docNames)
	if !slices.Equal(goNames, docNames) {
		t.Errorf("%s: properties %v, %T has %v", what, docNames, v, goNames)
	}
	var docReq []string
	for _, r := range s["required"].([]any) {
		docReq = append(docReq, r.(string))
	}
	goReq := slices.Clone(gen.Required)
	slices.Sort(goReq)
	slices.Sort(docReq)
	if !slices.Equal(goReq, docReq) {
		t.Errorf("%s: required %v, %T requires %v", what, docReq, v, goReq)
	}
}

// asyncapi.yaml describes the core's services of the accounts layout as the code has
// them: each channel's address is the subject of the Go helpers (events.SubjectRunEndedFor,
// ReadAPIPrefix, ReadRunsSubject, ToolQuestionSubject, TeamWriteSubject,
// ClientWriteSubject) with its parameters; a role sends and another receives, with the
// same reply for request/reply services (a dynamic reply channel: the requester's
// inbox); the payloads have the fields of the Go types (events.RunEndedNotice,
// QuestionQuery, QuestionState, store.RunState, jetstream.PubAck), accept values the Go
// types make, and accept what the running read and write services answer.
func TestAsyncAPITenancy(t *testing.T) {
	doc := parseAsyncAPI(t)
	msgs := map[string]int{}
	for i, m := range doc.Messages {
		msgs[m.ID] = i
	}
	onService := map[string]bool{}
	addresses := map[string]string{}
	for _, svc := range tenancyServices() {
		i := slices.IndexFunc(doc.Channels, func(c asyncAPIChannel) bool { return c.ID == svc.channel })
		if i < 0 {
			t.Errorf("asyncapi.yaml has no channel %s", svc.channel)
			continue
		}
		ch := doc.Channels[i]
		addresses[svc.channel] = serviceAddress(ch.Address)
		if got := serviceAddress(ch.Address); got != svc.subject {
			t.Errorf("channel %s: address %s is %s, the Go helpers build %s", ch.ID, ch.Address, got, svc.subject)
		}
		if !slices.Equal(ch.Parameters, svc.wantParams) {
			t.Errorf("channel %s: parameters %v, want %v", ch.ID, ch.Parameters, svc.wantParams)
		}
		if !slices.Equal(ch.Messages, []string{svc.request}) {
			t.Errorf("channel %s: messages %v, want %s", ch.ID, ch.Messages, svc.request)
		}
		onService[svc.request] = true
		for _, r := range svc.reply {
			onService[r] = true
		}
		for _, role := range []struct{ tag, action string }{{svc.sender, "send"}, {svc.receiver, "receive"}} {
			j := slices.IndexFunc(doc.Operations, func(op asyncAPIOperation) bool {
				return op.Action == role.action && slices.Equal(op.Tags, []string{role.tag}) && slices.Equal(op.Channels, []string{ch.ID})
			})
			if j < 0 {
				t.Errorf("channel %s: no operation where %s %ss", ch.ID, role.tag, role.action)
				continue
			}
			op := doc.Operations[j]
			if !slices.Equal(op.Messages, []string{svc.request}) {
				t.Errorf("operation %s: messages %v, want %s", op.ID, op.Messages, svc.request)
			}
			switch {
			case svc.reply == nil && op.Reply != nil:
				t.Errorf("operation %s: a reply on a channel nobody answers", op.ID)
			case svc.reply != nil && op.Reply == nil:
				t.Errorf("operation %s: no reply, the service answers %v", op.ID, svc.reply)
			case svc.reply != nil:
				if op.Reply.Channel != svc.replyChannel || op.Reply.Address != nil || !slices.Equal(op.Reply.Messages, svc.reply) {
					t.Errorf("operation %s: reply on %s (address %v) with %v, want %v on %s, the requester's inbox (address null)",
						op.ID, op.Reply.Channel, op.Reply.Address, op.Reply.Messages, svc.reply, svc.replyChannel)
				}
			}
		}
	}
	// Every message is an event of the contract (TestAsyncAPI) or one of these.
	for _, m := range doc.Messages {
		if _, ok := headerConst(m.Headers, "ce-type"); !ok && !onService[m.ID] {
			t.Errorf("message %s is neither an event nor on a service this test knows", m.ID)
		}
	}
	payload := func(id string) map[string]any {
		i, ok := msgs[id]
		if !ok {
			t.Fatalf("asyncapi.yaml has no message %s", id)
		}
		return doc.Messages[i].Payload
	}
	// The payloads are the Go types.
	notice, query, state := payload("runEndedNotice"), payload("toolQuestionQuery"), payload("toolQuestionStateReply")
	matchGoType(t, "runEndedNotice", notice, events.RunEndedNotice{})
	matchGoType(t, "toolQuestionQuery", query, events.QuestionQuery{})
	matchGoType(t, "toolQuestionStateReply", state, events.QuestionState{})
	if a, _ := state["properties"].(map[string]any)["answer"].(map[string]any); a["$id"] != events.DataSchema(events.TypeToolAnswer) {
		t.Errorf("toolQuestionStateReply: answer is %v, want the schema of tool.answer data", a["$id"])
	}
	runs := payload("readRunsReply")
	items, _ := runs["items"].(map[string]any)
	matchGoType(t, "readRunsReply items", items, store.RunState{})
	ack, _ := payload("writeAck")["oneOf"].([]any)
	if len(ack) != 2 {
		t.Fatalf("writeAck: payload oneOf %v, want the pub ack and the stream's error", ack)
	}
	matchGoType(t, "writeAck", ack[0].(map[string]any), jetstream.PubAck{})

	schemas := map[string]*sjs.Schema{}
	for id := range onService {
		schemas[id] = compileSchema(t, id, payload(id))
	}
	schemas["readRunsReply"] = compileSchema(t, "readRunsReply", runs)
	// Values the Go types make.
	answer := toolbus.ToolAnswer{RunID: "run-1", Step: 2, CallID: "c1", Tool: "calc", Attempt: 1, Seq: 1, Action: "accept", Content: json.RawMessage(`{"ok":true}`), Who: "alice"}
	for _, c := range []struct {
		msg string
		v   any
	}{
		{"runEndedNotice", events.RunEndedNotice{RunID: "run-1", Status: toolbus.RunCancelled}},
		{"toolQuestionQuery", events.QuestionQuery{RunID: "run-1", Step: 2, CallID: "c1", Seq: 1}},
		{"toolQuestionStateReply", events.QuestionState{Asked: true, Answer: &answer}},
		{"toolQuestionStateReply", events.QuestionState{Asked: false}},
		{"toolQuestionStateReply", events.QuestionState{Error: "call c1 of step 2 of run run-1 is no call of tool calc"}},
		{"readRunsReply", []store.RunState{{RunID: "run-1", Status: toolbus.RunFailed, Step: 3, Code: "tool_failed", Reason: "r",
			StartedAt: time.Now(), UpdatedAt: time.Now(), Ended: &toolbus.RunEnded{RunID: "run-1", Status: toolbus.RunFailed}}}},
		{"writeAck", jetstream.PubAck{Stream: events.DefaultStream, Sequence: 7}},
		{"writeAck", jetstream.PubAck{Stream: events.DefaultStream, Sequence: 7, Duplicate: true}},
	} {
		data, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if err := validateJSON(t, c.msg, schemas[c.msg], data); err != nil {
			t.Error(err)
		}
	}
	// What a subscriber must not take for those.
	for _, c := range []struct{ msg, data string }{
		{"runEndedNotice", `{"run_id":"run-1","status":"completed"}`},
		{"toolQuestionQuery", `{"run_id":"run-1","step":"2","call_id":"c1","seq":1}`},
		{"toolQuestionStateReply", `{"answer":null}`},
		{"writeAck", `{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":429,"err_code":10801,"description":"x"},"stream":"TOOLBUS","seq":1}`},
		{"writeRefused", `{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":429,"err_code":10800,"description":"x"}}`},
		{"readDirectGetRequest", `{"seq":1}`},
	} {
		if err := validateJSON(t, c.msg, schemas[c.msg], []byte(c.data)); err == nil {
			t.Errorf("%s: asyncapi.yaml accepts %s", c.msg, c.data)
		}
	}
	testTenancyServicesLive(t, doc, addresses, schemas)
}

// testTenancyServicesLive sends requests on the document's addresses (filled with
// serviceTokens) to the running read and write services (packages reads and intake) and
// validates what they answer against the document's messages.
func testTenancyServicesLive(t *testing.T, doc asyncAPISummary, addr map[string]string, schemas map[string]*sjs.Schema) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, 2*time.Minute)
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reads.New(bus, nil).Serve(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("reads: %v", err)
		}
	})
	intaketest.ServeIntake(t, bus.Conn(), intake.Limits{})
	// A quota of one byte a second and a burst of 250 bytes, spent by a first write (its
	// subject, data and intake.MessageOverhead): the next is over it (a write over the
	// burst itself is refused for good, 400).
	quota := eventstest.RunJetStream(t)
	intaketest.ServeIntake(t, quota.Conn, intake.Limits{BytesPerSecond: 1, Burst: 250})

	for _, r := range []struct{ run, principal string }{{"run-1", "alice"}, {"run-2", "bob"}} {
		if err := bus.StartRun(ctx, "test", toolbus.RunStarted{RunID: r.run, Principal: toolbus.Principal{ID: r.principal},
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "hi"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.Store().CreateRunState(ctx, r.run, time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.Store().RecordEnd(ctx, 1, toolbus.RunEnded{RunID: r.run, Status: toolbus.RunFailed, Code: "tool_failed", Reason: "r"}); err != nil {
			t.Fatal(err)
		}
	}
	request := func(nc *nats.Conn, subject string, hdr nats.Header, data []byte) *nats.Msg {
		t.Helper()
		var m *nats.Msg
		eventstest.Eventually(t, 30*time.Second, func() error { // the services subscribe as they start
			var err error
			m, err = nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data})
			return err
		})
		return m
	}
	check := func(what, msg string, data []byte) {
		t.Helper()
		if err := validateJSON(t, what, schemas[msg], data); err != nil {
			t.Error(err)
		}
	}
	i := slices.IndexFunc(doc.Messages, func(m asyncAPIMessage) bool { return m.ID == "readDirectGetReply" })
	if i < 0 {
		t.Fatal("asyncapi.yaml has no message readDirectGetReply")
	}
	getHeaders := compileSchema(t, "readDirectGetReply headers", doc.Messages[i].Headers)
	checkGet := func(what string, m *nats.Msg, status string) {
		t.Helper()
		h := map[string]any{}
		for k, vs := range m.Header {
			h[k] = vs[0]
		}
		if err := getHeaders.Validate(h); err != nil {
			t.Errorf("%s: the read service's headers %v do not match asyncapi.yaml: %v", what, h, err)
		}
		if got := m.Header.Get("Status"); got != status {
			t.Errorf("%s: status %q (%s), want %q", what, got, m.Header.Get("Description"), status)
		}
	}
	refused := func(what string, m *nats.Msg, code int) {
		t.Helper()
		check(what, "writeRefused", m.Data)
		if err := validateJSON(t, what, schemas["writeAck"], m.Data); err == nil {
			t.Errorf("%s: the refusal %s passes for an acknowledgement", what, m.Data)
		}
		var r struct {
			Error struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(m.Data, &r) != nil || r.Error.Code != code {
			t.Errorf("%s: %s, want code %d", what, m.Data, code)
		}
	}
	written := serviceTokens["{subject}"]
	other := func(channel, subject string) string { return strings.Replace(addr[channel], written, subject, 1) }

	// The write service: the stream's ack, its refusals.
	m := request(bus.Conn(), addr["teamWrite"], nil, []byte(`{"written":true}`))
	check("team write", "writeAck", m.Data)
	if err := validateJSON(t, "team write", schemas["writeRefused"], m.Data); err == nil {
		t.Errorf("team write: the ack %s passes for a refusal", m.Data)
	}
	m = request(bus.Conn(), other("clientWrite", "toolbus.run-1.run.cancel.alice"), nil, []byte(`{"reason":"x","who":"alice"}`))
	check("client write", "writeAck", m.Data)
	refused("team write of an outcome", request(bus.Conn(), other("teamWrite", "toolbus.run-1.run.completed"), nil, []byte(`{}`)), 400)
	refused("team roll-up", request(bus.Conn(), addr["teamWrite"], nats.Header{"Nats-Rollup": {"all"}}, []byte(`{}`)), 400)
	refused("client write of a result", request(bus.Conn(), addr["clientWrite"], nil, []byte(`{}`)), 400)
	request(quota.Conn, other("clientWrite", "toolbus.run-1.run.cancel.alice"), nil, []byte(`{"reason":"`+strings.Repeat("x", 80)+`"}`))
	refused("client over its quota", request(quota.Conn, other("clientWrite", "toolbus.run-1.run.cancel.alice"), nil, []byte(`{"reason":"x"}`)), 429)

	// The read service.
	m = request(bus.Conn(), addr["readRuns"], nil, nil)
	check("runs", "readRunsReply", m.Data)
	var runs []store.RunState
	if err := json.Unmarshal(m.Data, &runs); err != nil || len(runs) != 1 || runs[0].RunID != "run-1" {
		t.Errorf("runs of alice: %s (%v), want run-1 only", m.Data, err)
	}
	m = request(bus.Conn(), addr["readTools"], nil, nil)
	check("tools", "readToolsReply", m.Data)
	var tools []toolbus.ToolContract
	if err := json.Unmarshal(m.Data, &tools); err != nil {
		t.Errorf("tools of alice: %s (%v)", m.Data, err)
	}
	m = request(bus.Conn(), addr["readStreamInfo"], nil, nil)
	check("stream info", "readStreamInfoReply", m.Data)
	if strings.Contains(string(m.Data), `"error"`) {
		t.Errorf("stream info: %s", m.Data)
	}
	m = request(bus.Conn(), strings.Replace(addr["readStreamInfo"], "."+events.DefaultStream, ".KV_"+store.BucketClaims, 1), nil, nil)
	check("stream info of the claims", "readStreamInfoReply", m.Data)
	if !strings.Contains(string(m.Data), `"error"`) {
		t.Errorf("stream info of the claims: %s, want an error", m.Data)
	}
	m = request(bus.Conn(), addr["readDirectGetBySubject"], nil, nil)
	checkGet("direct get by subject", m, "")
	if string(m.Data) != `{"written":true}` || m.Header.Get(jetstream.SubjectHeader) != written {
		t.Errorf("direct get by subject: %s on %s, want the team's write", m.Data, m.Header.Get(jetstream.SubjectHeader))
	}
	checkGet("direct get of bob's run", request(bus.Conn(), strings.Replace(addr["readDirectGetBySubject"], "run-1", "run-2", 1), nil, nil), "404")
	body := []byte(`{"seq":1,"next_by_subj":"toolbus.run-1.>"}`)
	check("direct get request", "readDirectGetRequest", body)
	m = request(bus.Conn(), addr["readDirectGet"], nil, body)
	checkGet("direct get", m, "")
	if !strings.HasPrefix(m.Header.Get(jetstream.SubjectHeader), "toolbus.run-1.run.started.") {
		t.Errorf("direct get: %s, want run-1's run.started", m.Header.Get(jetstream.SubjectHeader))
	}
	checkGet("direct get by sequence alone", request(bus.Conn(), addr["readDirectGet"], nil, []byte(`{"seq":1}`)), "400")

	// The state of questions.
	q, _ := json.Marshal(events.QuestionQuery{RunID: "run-1", Step: 0, CallID: "c1", Seq: 1})
	m = request(bus.Conn(), addr["toolQuestionState"], nil, q)
	check("question state", "toolQuestionStateReply", m.Data)
	var st events.QuestionState
	if err := json.Unmarshal(m.Data, &st); err != nil || st.Error == "" {
		t.Errorf("question state of a call that is not calc's: %s (%v), want an error", m.Data, err)
	}
}
