package store_test

import (
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/store"
)

// TestWithholdForeignRefs: a result keeps exactly the references of its own call's
// output and attachments (the control); one naming another tool's, run's, step's or
// call's output, or another attachment index, is dropped and said so in its content,
// and the caller's attachments are not changed.
func TestWithholdForeignRefs(t *testing.T) {
	o := store.OutputOwner{Tool: "snap", Run: "r1", Step: 2, CallID: "c.1"}
	own := store.OutputRefPrefix + store.OutputKey("snap", "r1", 2, "c.1")
	for _, foreign := range []string{
		store.OutputRefPrefix + store.OutputKey("search", "r1", 2, "c.1"),
		store.OutputRefPrefix + store.OutputKey("snap", "r2", 2, "c.1"),
		store.OutputRefPrefix + store.OutputKey("snap", "r1", 1, "c.1"),
		store.OutputRefPrefix + store.OutputKey("snap", "r1", 2, "c.2"),
		own + ".a2", own + ".a1.0", "kv://elsewhere/x",
	} {
		atts := []toolbus.Attachment{{MediaType: "image/png", Ref: own + ".a0"}, {MediaType: "image/png", Ref: foreign}}
		r := toolbus.ToolResult{Content: "pictures", Truncated: &toolbus.Truncation{Ref: foreign}, Attachments: atts}
		if n := store.WithholdForeignRefs(o, &r); n != 2 {
			t.Errorf("%s: withheld %d, want 2", foreign, n)
		}
		if r.Truncated.Ref != "" || r.Attachments[1].Ref != "" || r.Attachments[0].Ref != own+".a0" {
			t.Errorf("%s: refs after: output %q, attachments %q %q", foreign, r.Truncated.Ref, r.Attachments[0].Ref, r.Attachments[1].Ref)
		}
		if !strings.HasPrefix(r.Content, "pictures\n") || !strings.Contains(r.Content, store.WithheldRefMarker+"attachment 1") ||
			!strings.Contains(r.Content, store.WithheldRefMarker+"the whole output") {
			t.Errorf("%s: content %q", foreign, r.Content)
		}
		if atts[1].Ref != foreign {
			t.Errorf("the caller's attachments were changed")
		}
	}
	r := toolbus.ToolResult{Content: "x", Truncated: &toolbus.Truncation{Ref: own}}
	if n := store.WithholdForeignRefs(o, &r); n != 0 || r.Truncated.Ref != own || r.Content != "x" {
		t.Errorf("control: the call's own output: withheld %d, %+v", n, r)
	}
}
