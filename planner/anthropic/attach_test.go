package anthropic

import (
	"context"
	"testing"

	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/modeltest"
)

// TestAnthropicAttachments: a tool result's attachments go in its tool_result as the
// Messages API documents them: a PNG as an image block (base64 source), a PDF as a
// document block (base64 source), a CSV as a document block (plain text source), and a
// sound, or a file whose bytes were not read, as a text block that describes it.
func TestAnthropicAttachments(t *testing.T) {
	f, base := newAnthropicServer(t, modeltest.Always(modeltest.Reply{Body: anthropicMessage("end_turn", textBlock("CPU is at 93%."))}))
	m := newTestAnthropic(t, base, nil)
	if _, err := m.Complete(context.Background(), planner.Request{RunID: "r1", Step: 1, Messages: modeltest.AttachmentHistory(), Tools: modeltest.Tools()}); err != nil {
		t.Fatal(err)
	}
	msgs := modeltest.Arr(decodeBody(t, f.LastRequest())["messages"])
	result := modeltest.Obj(modeltest.Arr(modeltest.Obj(msgs[len(msgs)-1])["content"])[0])
	want := `{"content":[` +
		`{"text":"the CPU chart","type":"text"},` +
		`{"source":{"data":"UE5HREFUQQ==","media_type":"image/png","type":"base64"},"type":"image"},` +
		`{"source":{"data":"JVBERi0x","media_type":"application/pdf","type":"base64"},"title":"report.pdf","type":"document"},` +
		`{"source":{"data":"t,cpu\n1,93\n","media_type":"text/plain","type":"text"},"title":"cpu.csv","type":"document"},` +
		`{"text":"[audio attachment: audio/wav, 4 bytes, not shown]","type":"text"},` +
		`{"text":"[image attachment \"big.png\": image/png, 900000 bytes, not shown]","type":"text"}` +
		`],"tool_use_id":"call_img","type":"tool_result"}`
	if got := modeltest.Canon(result); got != want {
		t.Errorf("tool_result\n got %s\nwant %s", got, want)
	}
}
