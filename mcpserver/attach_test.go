package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/mcpserver"
)

// TestMCPAttachments: a tool's attachments reach the host as MCP content: an image as
// image content, a sound as audio content, a text file as a text resource, a PDF as a
// blob resource; an image too large for the event (kept in the outputs bucket by the
// worker) arrives whole.
func TestMCPAttachments(t *testing.T) {
	large := bytes.Repeat([]byte{7}, 300<<10) // over the worker's inline limit (256 KiB)
	files := []toolbus.Attachment{
		{MediaType: "image/png", Data: []byte("png-bytes")},
		{MediaType: "audio/wav", Data: []byte("wav-bytes")},
		{MediaType: "text/csv", Name: "t.csv", Data: []byte("a,b\n1,2\n")},
		{MediaType: "application/pdf", URI: "file:///r.pdf", Data: []byte("%PDF-1.7")},
		{MediaType: "image/jpeg", Data: large},
	}
	p := startPipeline(t, executor.Tool{Name: "attach", Description: "Returns five files.", InputSchema: []byte(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) {
			return executor.Attach("five files", files...), nil
		}})
	cs := mcpClient(t, p, nil)
	res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "attach", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || len(res.Content) != 6 {
		t.Fatalf("got isError %v and %d contents, want the text and 5 attachments: %+v", res.IsError, len(res.Content), res.Content)
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || tc.Text != "five files" {
		t.Errorf("content 0 is %#v, want the text", res.Content[0])
	}
	if c, ok := res.Content[1].(*mcp.ImageContent); !ok || string(c.Data) != "png-bytes" || c.MIMEType != "image/png" {
		t.Errorf("content 1 is %#v, want the PNG image", res.Content[1])
	}
	if c, ok := res.Content[2].(*mcp.AudioContent); !ok || string(c.Data) != "wav-bytes" || c.MIMEType != "audio/wav" {
		t.Errorf("content 2 is %#v, want the WAV audio", res.Content[2])
	}
	if c, ok := res.Content[3].(*mcp.EmbeddedResource); !ok || c.Resource.Text != "a,b\n1,2\n" || c.Resource.MIMEType != "text/csv" || c.Resource.URI == "" {
		t.Errorf("content 3 is %#v, want the CSV as a text resource", res.Content[3])
	}
	if c, ok := res.Content[4].(*mcp.EmbeddedResource); !ok || string(c.Resource.Blob) != "%PDF-1.7" || c.Resource.URI != "file:///r.pdf" {
		t.Errorf("content 4 is %#v, want the PDF as a blob resource", res.Content[4])
	}
	if c, ok := res.Content[5].(*mcp.ImageContent); !ok || !bytes.Equal(c.Data, large) {
		t.Errorf("content 5 is not the large JPEG whole")
	}
	// The large one travelled by reference.
	run, _ := res.Meta[mcpserver.MetaRun].(string)
	evs, err := runlog.Events(p.ctx, p.bus, run)
	if err != nil {
		t.Fatal(err)
	}
	var stored *toolbus.Attachment
	v := audit.Visitor{ToolFinished: func(_ runlog.StoredEvent, tf toolbus.ToolFinished) {
		if len(tf.Attachments) == 5 {
			stored = &tf.Attachments[4]
		}
	}}
	for _, e := range evs {
		v.Visit(e)
	}
	if stored == nil || stored.Ref == "" || len(stored.Data) != 0 || stored.Size != len(large) {
		t.Fatalf("the large attachment in the event is %+v, want a ref and its size", stored)
	}
}
