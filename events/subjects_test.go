package events_test

import (
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

func TestSubjects(t *testing.T) {
	tests := []struct{ got, want string }{
		{events.SubjectRunStarted("r1", "alice"), "toolbus.r1.run.started.alice"},
		{events.SubjectRunStarted("r1", ""), "toolbus.r1.run.started._none"},
		{events.SubjectModelRequested("r1"), "toolbus.r1.model.requested"},
		{events.SubjectModelResponded("r1"), "toolbus.r1.model.responded"},
		{events.SubjectToolRequested("r1", "lookup_incident"), "toolbus.r1.tool.requested.lookup_incident"},
		{events.SubjectToolRequested("r1", "bad.name"), "toolbus.r1.tool.requested._unknown"},
		{events.SubjectToolRequested("r1", "a b"), "toolbus.r1.tool.requested._unknown"},
		{events.SubjectToolFinished("r1", "calc"), "toolbus.r1.tool.finished.calc"},
		{events.SubjectApproval("r1", true, "bob"), "toolbus.r1.approval.granted.bob"},
		{events.SubjectApproval("r1", false, "bob"), "toolbus.r1.approval.denied.bob"},
		{events.SubjectRunCancel("r1", "carol"), "toolbus.r1.run.cancel.carol"},
		{events.SubjectRunCancel("r1", ""), "toolbus.r1.run.cancel._none"},
		{events.IdentityToken("bad.id"), ""},
		{events.IdentityToken("a b"), ""},
		{events.SubjectRunEnded("r1", toolbus.RunLimitReached), "toolbus.r1.run.limit_reached"},
		{events.SubjectRun("r1"), "toolbus.r1.>"},
		{events.FilterToolRequestedFor("calc"), "toolbus.*.tool.requested.calc"},
		{events.IDToolFinished("r1", 3, "call_0"), "r1/3/call_0/tool.finished"},
		{events.IDToolRequested("r1", 3, "call_0", true), "r1/3/call_0/tool.requested/decided"},
		{events.IDModelRequested("r1", 0), "r1/0/model.requested"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if run, ok := events.RunIDFromSubject("toolbus.abc-1.tool.finished.x"); !ok || run != "abc-1" {
		t.Errorf("RunIDFromSubject = %q %v", run, ok)
	}
	if _, ok := events.RunIDFromSubject("other.abc"); ok {
		t.Error("RunIDFromSubject accepted a foreign subject")
	}
}

func TestNames(t *testing.T) {
	for name, want := range map[string]bool{
		"lookup_incident": true, "a": true, "A-b_9": true, "": false, "a.b": false, "a b": false, "é": false,
		strings.Repeat("a", 65): false, strings.Repeat("a", 64): true,
	} {
		if got := toolbus.ValidToolName(name); got != want {
			t.Errorf("ValidToolName(%q) = %v", name, got)
		}
	}
	for id, want := range map[string]bool{"run-1": true, "": false, "a.b": false, "a*": false, "a>": false} {
		if got := toolbus.ValidRunID(id); got != want {
			t.Errorf("ValidRunID(%q) = %v", id, got)
		}
	}
}

// A run's final outcome is told by its subject alone (the read service ends a follow on
// it, follow.Follower stops): a terminal status, not waiting_for_approval, not a start or
// a cancel, whose subjects have a fifth token.
func TestIsFinalOutcome(t *testing.T) {
	for subject, want := range map[string]bool{
		events.SubjectRunEnded("r1", toolbus.RunCompleted):          true,
		events.SubjectRunEnded("r1", toolbus.RunCancelled):          true,
		events.SubjectRunEnded("r1", toolbus.RunWaitingForApproval): false,
		events.SubjectRunStarted("r1", "alice"):                     false,
		events.SubjectRunCancel("r1", "alice"):                      false,
		events.SubjectToolFinished("r1", "completed"):               false,
		"other.r1.run.completed":                                    false,
	} {
		if got := events.IsFinalOutcome(subject); got != want {
			t.Errorf("IsFinalOutcome(%s) = %v, want %v", subject, got, want)
		}
	}
}
