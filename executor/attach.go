package executor

import (
	"fmt"
	"mime"
	"unicode/utf8"

	"github.com/toolbus/toolbus"
)

// Attachments.
//
// A tool returns images, sounds and files beside its output by returning Attach(out,
// files...): the output becomes Content and Output as any output does, and the files
// become ToolResult.Attachments, in order. Each needs a media type (image/png,
// audio/wav, application/pdf, text/csv, ...) and its bytes; Name and URI are optional.
// The files of a call are bounded: at most MaxAttachments of them, MaxAttachmentBytes
// in all; a call that returns more fails with invalid_tool_output. Text files (text/*,
// JSON, XML, YAML) are redacted like the content; other bytes are passed on as they are.
// The bus worker keeps a file too large for the event in the outputs bucket, as it
// keeps a large output.

// Bounds of the attachments of one call.
const (
	MaxAttachments     = 16
	MaxAttachmentBytes = 8 << 20
)

// Attached is an output with attachments (Attach).
type Attached struct {
	Output any
	Files  []toolbus.Attachment
}

// Attach returns out with files beside it: a tool's Func (or RegisterFunc's function)
// returns it as its output.
func Attach(out any, files ...toolbus.Attachment) Attached {
	return Attached{Output: out, Files: files}
}

// attach checks and keeps the files of a succeeded call.
func (c *call) attach(files []toolbus.Attachment) {
	if len(files) > MaxAttachments {
		c.fail(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput,
			fmt.Sprintf("the tool returned %d attachments, more than %d", len(files), MaxAttachments), false, nil)
		return
	}
	total := 0
	out := make([]toolbus.Attachment, 0, len(files))
	for i, f := range files {
		if _, _, err := mime.ParseMediaType(f.MediaType); err != nil || f.MediaType == "" {
			c.fail(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput,
				fmt.Sprintf("attachment %d has no valid media type (%q)", i, f.MediaType), false, nil)
			return
		}
		if f.Ref != "" {
			c.fail(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput,
				fmt.Sprintf("attachment %d has a ref: a tool returns the bytes (Data), the worker keeps them", i), false, nil)
			return
		}
		if total += len(f.Data); total > MaxAttachmentBytes {
			c.fail(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput,
				fmt.Sprintf("the tool's attachments hold more than %d bytes", MaxAttachmentBytes), false, nil)
			return
		}
		f.Data = append([]byte(nil), f.Data...)
		if f.Kind() == "text" && utf8.Valid(f.Data) {
			s, n := c.e.secretValues().text(string(f.Data))
			f.Data, c.res.Redactions = []byte(s), c.res.Redactions+n
		}
		f.Size = len(f.Data)
		out = append(out, f)
	}
	c.res.Attachments = out
}
