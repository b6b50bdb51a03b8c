package openai

import (
	"context"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/modeltest"
)

// TestOpenAIResponsesAttachments: a tool result's attachments go in its
// function_call_output as the Responses API documents them: the output becomes a list
// of input_text, input_image (a PNG as a data URL), input_file (a PDF as a data URL with
// its file name), the CSV's text, and lines that describe a sound and a file whose bytes
// were not read.
func TestOpenAIResponsesAttachments(t *testing.T) {
	f, base := newResponsesServer(t, modeltest.Always(modeltest.Reply{Body: responseBody("completed", respMessage("CPU is at 93%."))}))
	m := newTestResponses(t, base, func(o *ResponsesOptions) { o.Stateless = true })
	if _, err := m.Complete(context.Background(), planner.Request{RunID: "r1", Step: 1, Messages: modeltest.AttachmentHistory(), Tools: modeltest.Tools()}); err != nil {
		t.Fatal(err)
	}
	var out any
	for _, iv := range modeltest.Arr(decodeBody(t, f.LastRequest())["input"]) {
		if it := modeltest.Obj(iv); it["type"] == "function_call_output" && it["call_id"] == "call_img" {
			out = it["output"]
		}
	}
	want := `[` +
		`{"text":"the CPU chart","type":"input_text"},` +
		`{"detail":"auto","image_url":"data:image/png;base64,UE5HREFUQQ==","type":"input_image"},` +
		`{"file_data":"data:application/pdf;base64,JVBERi0x","filename":"report.pdf","type":"input_file"},` +
		`{"text":"t,cpu\n1,93\n","type":"input_text"},` +
		`{"text":"[audio attachment: audio/wav, 4 bytes, not shown]","type":"input_text"},` +
		`{"text":"[image attachment \"big.png\": image/png, 900000 bytes, not shown]","type":"input_text"}]`
	if got := modeltest.Canon(out); got != want {
		t.Errorf("function_call_output output\n got %s\nwant %s", got, want)
	}
}

// TestOpenAIChatAttachments: Chat Completions tool messages take text only, so each
// attachment is a line that describes it, and the model is told why.
func TestOpenAIChatAttachments(t *testing.T) {
	f, base := newChatServer(t, modeltest.Always(modeltest.Reply{Body: chatCompletion(map[string]any{"content": "CPU is at 93%."}, "stop")}))
	m := newTestChat(t, base, nil)
	if _, err := m.Complete(context.Background(), planner.Request{RunID: "r1", Step: 1, Messages: modeltest.AttachmentHistory(), Tools: modeltest.Tools()}); err != nil {
		t.Fatal(err)
	}
	msgs := modeltest.Arr(decodeBody(t, f.LastRequest())["messages"])
	tool := modeltest.Obj(msgs[len(msgs)-1])
	content, _ := tool["content"].(string)
	if tool["role"] != "tool" || tool["tool_call_id"] != "call_img" {
		t.Fatalf("last message %v, want the tool message", tool)
	}
	for _, want := range []string{
		"the CPU chart\n",
		`[image attachment "cpu.png": image/png, 7 bytes, not shown]`,
		`[file attachment "report.pdf": application/pdf, 6 bytes, not shown]`,
		`[text attachment "cpu.csv": text/csv, 11 bytes, not shown]`,
		"[audio attachment: audio/wav, 4 bytes, not shown]",
		"passes tool results as text only",
	} {
		if !strings.Contains(content, want) {
			t.Errorf("tool message %q lacks %q", content, want)
		}
	}
	if strings.Contains(content, "UE5HREFUQQ") || strings.Contains(content, "PNGDATA") {
		t.Errorf("tool message %q carries an attachment's bytes", content)
	}
}
