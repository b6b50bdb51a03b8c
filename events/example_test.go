package events_test

import (
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// Encode a tool.finished event in binary content mode and decode it back.
func ExampleEncode() {
	msg, err := events.Encode(events.SubjectToolFinished("run-1", "calculator"), events.Meta{
		ID:   events.IDToolFinished("run-1", 0, "call_1"),
		Type: events.TypeToolFinished, Source: events.Source("executor", "e1"),
		RunID: "run-1", CallID: "call_1", CallIndex: 0, CallCount: 1,
	}, toolbus.ToolFinished{RunID: "run-1", CallCount: 1, ToolResult: toolbus.ToolResult{
		CallID: "call_1", Tool: "calculator", Status: toolbus.StatusSucceeded, Content: `{"value":701}`}})
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.Subject)
	fmt.Println(msg.Header.Get("ce-type"), msg.Header.Get("Nats-Msg-Id"))

	var tf toolbus.ToolFinished
	meta, err := events.Decode(msg, &tf)
	if err != nil {
		panic(err)
	}
	fmt.Println(meta.RunID, meta.CallID, tf.ToolResult.Status, tf.ToolResult.Content)
	// Output:
	// toolbus.run-1.tool.finished.calculator
	// toolbus.tool.finished run-1/0/call_1/tool.finished
	// run-1 call_1 succeeded {"value":701}
}
