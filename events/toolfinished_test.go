package events_test

import (
	"encoding/json"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// The data of tool.finished is a ToolResult at the top level with the position beside
// it: what the contract documents is what the wire carries.
func TestToolFinishedIsFlat(t *testing.T) {
	tf := toolbus.ToolFinished{RunID: "run-1", Step: 2, CallIndex: 1, CallCount: 3, ToolResult: toolbus.ToolResult{
		CallID: "call_01", Tool: "lookup_incident", Status: toolbus.StatusFailed,
		Error: &toolbus.ToolError{Code: "incident_not_found", Message: "no incident INC-404"}, Content: "x", DurationMS: 12}}
	b, err := json.Marshal(tf)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"run_id", "step", "call_index", "call_count", "call_id", "tool", "status", "error", "content", "duration_ms"} {
		if _, ok := top[k]; !ok {
			t.Errorf("data %s has no top-level %q", b, k)
		}
	}
	if _, ok := top["result"]; ok {
		t.Errorf("data %s still nests the result", b)
	}
	if string(top["status"]) != `"failed"` {
		t.Errorf("status = %s, want \"failed\"", top["status"])
	}
}

// Events written before the contract was made flat ({"result":{...}}) are still in
// streams kept for audit; the decoder reads both shapes into the same value.
func TestToolFinishedDecodesBothShapes(t *testing.T) {
	want := toolbus.ToolFinished{RunID: "run-1", Step: 2, CallIndex: 1, CallCount: 3, ToolResult: toolbus.ToolResult{
		CallID: "call_01", Tool: "calculator", Status: toolbus.StatusSucceeded, Output: json.RawMessage(`{"value":701}`),
		Content: `{"value":701}`, Attempt: 1, DurationMS: 4, Executor: "exec-1"}}
	cases := []struct {
		name string
		data string
	}{
		{"flat", `{"run_id":"run-1","step":2,"call_index":1,"call_count":3,"call_id":"call_01","tool":"calculator","status":"succeeded","output":{"value":701},"content":"{\"value\":701}","attempt":1,"duration_ms":4,"executor":"exec-1"}`},
		{"nested (before v1 was made flat)", `{"run_id":"run-1","step":2,"call_index":1,"call_count":3,"result":{"call_id":"call_01","tool":"calculator","status":"succeeded","output":{"value":701},"content":"{\"value\":701}","attempt":1,"duration_ms":4,"executor":"exec-1"}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Through the codec, as a consumer reads it from the stream.
			msg, err := events.Encode(events.SubjectToolFinished("run-1", "calculator"), events.Meta{
				ID: events.IDToolFinished("run-1", 2, "call_01"), Type: events.TypeToolFinished,
				Source: events.Source("executor", "exec-1"), RunID: "run-1", Step: 2, CallID: "call_01", CallIndex: 1, CallCount: 3,
			}, json.RawMessage(c.data))
			if err != nil {
				t.Fatal(err)
			}
			var got toolbus.ToolFinished
			if _, err := events.Decode(msg, &got); err != nil {
				t.Fatal(err)
			}
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(want)
			if string(gb) != string(wb) {
				t.Fatalf("decoded %s\nwant    %s", gb, wb)
			}
		})
	}
	// Bad data is still an error, not a silent zero value.
	var tf toolbus.ToolFinished
	if err := json.Unmarshal([]byte(`{"run_id":1}`), &tf); err == nil {
		t.Fatal("a number as run_id decoded without error")
	}
}
