package planner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/planner"
)

// TestModelGetsStoredAttachments: an image too large for the event (kept in the outputs
// bucket by the worker, by reference) reaches the model whole on the next step: the
// planner reads its bytes before it calls the model; a smaller one, in the event, too.
func TestModelGetsStoredAttachments(t *testing.T) {
	img := bytes.Repeat([]byte{9}, 300<<10) // over the worker's inline limit (256 KiB)
	pdf := bytes.Repeat([]byte{7}, 100<<10) // inline, but over the join state's budget
	var (
		mu   sync.Mutex
		seen []toolbus.Attachment
	)
	model := planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		if req.Step == 0 {
			return planner.Response{Message: toolbus.Message{ToolCalls: []toolbus.ToolCall{{CallID: "c1", Tool: "snap", Arguments: "{}"}}}}, nil
		}
		mu.Lock()
		defer mu.Unlock()
		for _, m := range req.Messages {
			seen = append(seen, m.Attachments...)
		}
		return planner.Response{Message: toolbus.Message{Content: "seen"}}, nil
	})
	p := testpipe.Start(t, 2*time.Minute, model, executor.Tool{Name: "snap", Description: "Takes a picture.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) {
			return executor.Attach("a picture", toolbus.Attachment{MediaType: "image/png", Data: img},
				toolbus.Attachment{MediaType: "application/pdf", Data: pdf}), nil
		}})
	p.SubmitAs("att-1", "tester", "take a picture", toolbus.Limits{})
	p.WaitStatus("att-1", toolbus.RunCompleted)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0].Ref == "" || !bytes.Equal(seen[0].Data, img) {
		t.Fatalf("the model saw %d attachments (ref %q, %d bytes), want the stored image whole", len(seen), refOf(seen), dataLen(seen))
	}
	if seen[1].Ref != "" || !bytes.Equal(seen[1].Data, pdf) {
		t.Fatalf("the model saw the PDF with ref %q and %d bytes, want it whole from the event", seen[1].Ref, len(seen[1].Data))
	}
}

func refOf(a []toolbus.Attachment) string {
	if len(a) == 0 {
		return ""
	}
	return a[0].Ref
}

func dataLen(a []toolbus.Attachment) int {
	if len(a) == 0 {
		return 0
	}
	return len(a[0].Data)
}
