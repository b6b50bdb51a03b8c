package fair

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// TestReleaseKeysFromAttributes: the scheduler keys a result and reads a staged call
// from the event's attributes and data without events.Decode; the keys equal those the
// full decode gives (structured mode, the fallback), and a result without the call
// attributes is still keyed from its data.
func TestReleaseKeysFromAttributes(t *testing.T) {
	meta := events.Meta{ID: "e1", Type: events.TypeToolFinished, Source: "toolbus/test", RunID: "r1", Step: 3, CallID: "c7", HasCall: true}
	data := toolbus.ToolFinished{RunID: "r1", Step: 3, ToolResult: toolbus.ToolResult{CallID: "c7", Tool: "sleep", Status: toolbus.StatusSucceeded}}
	subject := "toolbus.r1.tool.finished.sleep"
	want := store.ClaimKey("sleep", "r1", 3, "c7")
	bin, err := events.Encode(subject, meta, data)
	if err != nil {
		t.Fatal(err)
	}
	structured, err := events.EncodeStructured(subject, meta, data)
	if err != nil {
		t.Fatal(err)
	}
	bare, _ := events.Encode(subject, meta, data)
	bare.Header.Del("ce-" + events.ExtCallID)
	for name, m := range map[string]*nats.Msg{"binary": bin, "structured": structured, "no call attributes": bare} {
		if got, ok := finishedKey(m); !ok || got != want {
			t.Errorf("%s: finishedKey = %q, %v; want %q", name, got, ok, want)
		}
	}

	req := toolbus.ToolRequested{RunID: "r1", Step: 3, Call: toolbus.ToolCall{CallID: "c7", Tool: "sleep"}, Principal: toolbus.Principal{ID: "alice", Roles: []string{"user"}}}
	rmeta := events.Meta{ID: "e2", Type: events.TypeToolRequested, Source: "toolbus/test", RunID: "r1", Step: 3, CallID: "c7", HasCall: true}
	rsubject := "toolbus.r1.tool.requested.sleep"
	rbin, err := events.Encode(rsubject, rmeta, req)
	if err != nil {
		t.Fatal(err)
	}
	rstructured, err := events.EncodeStructured(rsubject, rmeta, req)
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]*nats.Msg{"binary": rbin, "structured": rstructured} {
		got, err := decodeStaged(m.Subject, m.Header, m.Data)
		if err != nil || got.RunID != "r1" || got.Step != 3 || got.Call.CallID != "c7" || got.Call.Tool != "sleep" || got.Principal.ID != "alice" {
			t.Errorf("%s: decodeStaged = %+v, %v", name, got, err)
		}
	}
}
