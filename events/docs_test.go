package events_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/testutil"
)

// Sentinels of the documented subjects and ids: docData fills every event's data with
// them, and docPlaceholders turns them into the placeholders CONTRACT.md writes.
const (
	docRun  = "RUNX"
	docTool = "TOOLX"
	docCall = "CALLX"
	docStep = 7
	// docPrincipal and docActor are the identity tokens a run.started and an approval or
	// cancel end in.
	docPrincipal = "PRINCIPALX"
	docActor     = "ACTORX"
)

// docData returns data of event type typ filled with the sentinels: run docRun, step
// docStep, call docCall of tool docTool (call 1 of 4), one pending call.
func docData(t *testing.T, typ string) any {
	call := toolbus.ToolCall{CallID: docCall, Tool: docTool}
	switch typ {
	case events.TypeRunStarted:
		return toolbus.RunStarted{RunID: docRun, Principal: toolbus.Principal{ID: docPrincipal}}
	case events.TypeModelRequested:
		return toolbus.ModelRequested{RunID: docRun, Step: docStep}
	case events.TypeModelResponded:
		return toolbus.ModelResponded{RunID: docRun, Step: docStep}
	case events.TypeToolRequested:
		return toolbus.ToolRequested{RunID: docRun, Step: docStep, CallIndex: 1, CallCount: 4, Call: call}
	case events.TypeToolFinished:
		return toolbus.ToolFinished{RunID: docRun, Step: docStep, CallIndex: 1, CallCount: 4,
			ToolResult: toolbus.ToolResult{CallID: docCall, Tool: docTool, Status: toolbus.StatusSucceeded}}
	case events.TypeToolWaiting:
		return toolbus.ToolWaiting{RunID: docRun, Step: docStep, CallIndex: 1, CallCount: 4, Call: call}
	case events.TypeToolProgress:
		return toolbus.ToolProgress{RunID: docRun, Step: docStep, CallID: docCall, Tool: docTool, Attempt: 1, Seq: 1}
	case events.TypeToolLog:
		return toolbus.ToolLog{RunID: docRun, Step: docStep, CallID: docCall, Tool: docTool, Attempt: 1, Seq: 1, Level: "info"}
	case events.TypeToolQuestion:
		return toolbus.ToolQuestion{RunID: docRun, Step: docStep, CallID: docCall, Tool: docTool, Attempt: 1, Seq: 1}
	case events.TypeToolAnswer:
		return toolbus.ToolAnswer{RunID: docRun, Step: docStep, CallID: docCall, Tool: docTool, Attempt: 1, Seq: 1, Who: docActor}
	case events.TypeApprovalGranted, events.TypeApprovalDenied:
		return toolbus.Approval{RunID: docRun, CallID: docCall, Who: docActor}
	case events.TypeRunCancel:
		return toolbus.Cancel{RunID: docRun, Who: docActor}
	case events.TypeRunTimer:
		return events.RunTimer{RunID: docRun}
	}
	if s, ok := strings.CutPrefix(typ, "toolbus.run."); ok {
		return toolbus.RunEnded{RunID: docRun, Status: toolbus.RunStatus(s), Pending: []toolbus.ToolCall{call}}
	}
	t.Fatalf("event type %s: no data in docData (add it, and its row to the subject table of CONTRACT.md)", typ)
	return nil
}

// docPlaceholders writes a subject or id built from the sentinels as CONTRACT.md does.
func docPlaceholders(s string) string {
	return strings.NewReplacer(docRun, "<run>", docTool, "<tool>", docCall, "<call_id>", "/7/", "/<step>/",
		docPrincipal, "<principal>", docActor, "<actor>").Replace(s)
}

// The subject table of CONTRACT.md names every event type of the code, each with the
// subject and id its envelope constructor builds (the ones every worker publishes
// with), and no type the code does not have: an event type added, renamed or moved to
// another subject without its line in the contract fails here.
func TestContractSubjects(t *testing.T) {
	rows := testutil.MarkdownTable(t, "../CONTRACT.md", "| CloudEvents `type` | subject | id |")
	type doc struct{ subject, id string }
	documented := map[string]doc{}
	for _, r := range rows {
		if len(r) < 3 {
			t.Fatalf("CONTRACT.md subject table: row %q has fewer than 3 cells", r)
		}
		typ := testutil.CodeCell(r[0])
		if typ == "" {
			t.Errorf("CONTRACT.md subject table: the first cell of %q is not one `type`", r)
			continue
		}
		if _, dup := documented[typ]; dup {
			t.Errorf("CONTRACT.md subject table: %s has two rows", typ)
		}
		first := func(cell string) string {
			if spans := testutil.CodeSpans(cell); len(spans) > 0 {
				return spans[0]
			}
			return ""
		}
		documented[typ] = doc{first(r[1]), first(r[2])}
	}
	for _, typ := range contractTypes(t) {
		e := envelopeOf(t, typ, docStep, docData(t, typ))
		want := doc{docPlaceholders(e.Subject), docPlaceholders(e.Meta.ID)}
		if typ == events.TypeRunEnded(toolbus.RunWaitingForApproval) {
			// The id of a waiting outcome ends in the set of pending calls (one here).
			pending := docData(t, typ).(toolbus.RunEnded).Pending
			want.id = strings.TrimSuffix(want.id, "/"+events.PendingSet(pending)) + "/<pending>"
		}
		if typ == events.TypeToolProgress || typ == events.TypeToolLog || typ == events.TypeToolQuestion || typ == events.TypeToolAnswer {
			// The id of a report ends in its attempt and sequence number (1 and 1 here).
			want.id = strings.TrimSuffix(want.id, "/1/1") + "/<attempt>/<seq>"
		}
		got, ok := documented[typ]
		if !ok {
			t.Errorf("CONTRACT.md has no row for event type %s (subject `%s`, id `%s`)", typ, want.subject, want.id)
			continue
		}
		delete(documented, typ)
		if got.subject != want.subject {
			t.Errorf("CONTRACT.md: %s is published on `%s`, the table says `%s`", typ, want.subject, got.subject)
		}
		if got.id != want.id {
			t.Errorf("CONTRACT.md: the id of %s is `%s`, the table says `%s`", typ, want.id, got.id)
		}
	}
	for typ := range documented {
		t.Errorf("CONTRACT.md documents event type %s, which is not in events.EventTypes", typ)
	}
}

// CONTRACT.md links the schema of every event type (the files of schemas/, which
// TestSchemasUpToDate keeps true to the Go types), and links no schema that is not there.
func TestContractLinksSchemas(t *testing.T) {
	raw, err := os.ReadFile("../CONTRACT.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, typ := range contractTypes(t) {
		link := "(schemas/" + events.SchemaFile(typ) + ")"
		if !strings.Contains(text, link) {
			t.Errorf("CONTRACT.md does not link the schema of %s %s", typ, link)
		}
	}
	for _, m := range regexp.MustCompile(`\(schemas/([^)]+\.json)\)`).FindAllStringSubmatch(text, -1) {
		if _, err := os.Stat(filepath.Join(schemaDir, m[1])); err != nil {
			t.Errorf("CONTRACT.md links schemas/%s: %v", m[1], err)
		}
	}
}
