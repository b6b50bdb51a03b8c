package executor_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestAttachments: a tool returns files beside its output (executor.Attach); they are
// checked (media type, count, bytes), text files are redacted, and the output is the
// content as ever.
func TestAttachments(t *testing.T) {
	const secret = "s3cr3t-value-of-the-test"
	png := []byte{0x89, 'P', 'N', 'G', 0, 1, 2}
	big := bytes.Repeat([]byte{1}, executor.MaxAttachmentBytes/2+1)
	many := make([]toolbus.Attachment, executor.MaxAttachments+1)
	for i := range many {
		many[i] = toolbus.Attachment{MediaType: "image/png", Data: png}
	}
	cases := []struct {
		name  string
		files []toolbus.Attachment
		// want: the attachments' media types and data, or the failure's message part
		want    []toolbus.Attachment
		failure string
	}{
		{name: "image and text", files: []toolbus.Attachment{
			{MediaType: "image/png", Data: png, Name: "chart.png"},
			{MediaType: "text/plain", URI: "test://x", Data: []byte("token " + secret)},
		}, want: []toolbus.Attachment{
			{MediaType: "image/png", Data: png, Name: "chart.png", Size: len(png)},
			{MediaType: "text/plain", URI: "test://x", Data: []byte("token [REDACTED]"), Size: len("token [REDACTED]")},
		}},
		{name: "no media type", files: []toolbus.Attachment{{Data: png}}, failure: "attachment 0 has no valid media type"},
		{name: "bad media type", files: []toolbus.Attachment{{MediaType: "image/", Data: png}}, failure: "no valid media type"},
		{name: "a ref", files: []toolbus.Attachment{{MediaType: "image/png", Ref: "kv://x"}}, failure: "has a ref"},
		{name: "too many", files: many, failure: "more than 16"},
		{name: "too large", files: []toolbus.Attachment{{MediaType: "application/pdf", Data: big}, {MediaType: "application/pdf", Data: big}}, failure: "more than 8388608 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := executor.NewRegistry()
			if err := executor.RegisterFunc(reg, executor.Tool{Name: "draw"}, func(context.Context, struct{}) (executor.Attached, error) {
				return executor.Attach("here it is", tc.files...), nil
			}); err != nil {
				t.Fatal(err)
			}
			if tool, _ := reg.Lookup("draw"); len(tool.OutputSchema) != 0 {
				t.Errorf("an Attached output derives an output schema: %s", tool.OutputSchema)
			}
			ex := testutil.Must(executor.New(reg, executor.WithSecrets(secret)))
			res := ex.Execute(context.Background(), toolbus.ToolCall{CallID: "c1", Tool: "draw", Arguments: "{}"}, toolbus.Principal{ID: "p"})
			if tc.failure != "" {
				if res.Status != toolbus.StatusFailed || res.Code() != toolbus.CodeInvalidToolOutput || !strings.Contains(res.Error.Message, tc.failure) || len(res.Attachments) != 0 {
					t.Fatalf("got %s %s %+v with %d attachments, want invalid_tool_output %q", res.Status, res.Code(), res.Error, len(res.Attachments), tc.failure)
				}
				return
			}
			if res.Status != toolbus.StatusSucceeded || res.Content != "here it is" {
				t.Fatalf("got %s %q, want succeeded with the text", res.Status, res.Content)
			}
			if len(res.Attachments) != len(tc.want) {
				t.Fatalf("got %d attachments, want %d", len(res.Attachments), len(tc.want))
			}
			for i, w := range tc.want {
				g := res.Attachments[i]
				if g.MediaType != w.MediaType || g.Name != w.Name || g.URI != w.URI || g.Size != w.Size || !bytes.Equal(g.Data, w.Data) {
					t.Errorf("attachment %d is %+v, want %+v", i, g, w)
				}
			}
			if res.Redactions != 1 {
				t.Errorf("redactions %d, want 1 (the text attachment's secret)", res.Redactions)
			}
		})
	}
}

// TestAttachmentKind: the kind of an attachment by its media type, and the line that
// stands for it where its bytes cannot go.
func TestAttachmentKind(t *testing.T) {
	for mt, want := range map[string]string{
		"image/png": "image", "IMAGE/JPEG": "image", "audio/wav": "audio", "text/csv": "text",
		"application/json": "text", "application/vnd.api+json": "text", "application/pdf": "file", "application/octet-stream": "file",
	} {
		if got := (toolbus.Attachment{MediaType: mt}).Kind(); got != want {
			t.Errorf("Kind(%s) = %s, want %s", mt, got, want)
		}
	}
	got := toolbus.Attachment{MediaType: "application/pdf", Name: "report.pdf", Size: 2048}.Describe()
	if want := `[file attachment "report.pdf": application/pdf, 2048 bytes, not shown]`; got != want {
		t.Errorf("Describe() = %s, want %s", got, want)
	}
}
