package main

import (
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/planner"
)

// `toolbus run --id X` with an X that names an existing run exits 2 with a clear
// message, and publishes nothing.
func TestRunRefusesAnExistingRunID(t *testing.T) {
	p := startOpsPipeline(t, map[string]*planner.Script{
		"taken-1": {Steps: []func(planner.Request) planner.Response{planner.Answer("done")}},
	})
	p.submit("taken-1", toolbus.Limits{})
	p.waitStatus("taken-1", toolbus.RunCompleted)
	code, stdout, stderr := p.toolbus("run", "--id", "taken-1", "again?")
	wantCode(t, "run with an existing id", code, 2, stdout, stderr)
	wantContains(t, "run with an existing id", stdout+stderr, `run id "taken-1" already exists`)
	first, err := p.bus.RunStartedSeq(p.ctx, "taken-1")
	if err != nil {
		t.Fatal(err)
	}
	later, err := p.bus.EventStream().GetMsg(p.ctx, first+1, jetstream.WithGetMsgSubject(events.SubjectRunStartedAny("taken-1")))
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("a run.started after the first at %d: %v (%v): the refused run published one", first, later, err)
	}
}

// A run that omits -system has no system message: no persona it did not choose; with
// -system it has exactly that one, first.
func TestRunSystemMessageOnlyWhenGiven(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []toolbus.Message
	}{
		{[]string{"hello?"}, []toolbus.Message{{Role: toolbus.RoleUser, Content: "hello?"}}},
		{[]string{"-system", "  ", "hello?"}, []toolbus.Message{{Role: toolbus.RoleUser, Content: "hello?"}}},
		{[]string{"-system", "Be brief.", "hello?"}, []toolbus.Message{{Role: toolbus.RoleSystem, Content: "Be brief."}, {Role: toolbus.RoleUser, Content: "hello?"}}},
	} {
		rs, err := parseRun(Config{}, tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if !slices.EqualFunc(rs.Messages, tc.want, func(a, b toolbus.Message) bool { return a.Role == b.Role && a.Content == b.Content }) {
			t.Errorf("toolbus run %q: messages %+v, want %+v", tc.args, rs.Messages, tc.want)
		}
	}
}

// A run's principal is the user who starts it unless -principal names another (so that
// the same user's toolbus approve may decide on it under the decision policy), and
// -approvers lists who else may decide on it.
func TestRunPrincipalAndApprovers(t *testing.T) {
	t.Setenv("USER", "dana")
	for _, tc := range []struct {
		args      []string
		principal string
		approvers []string
	}{
		{[]string{"hi?"}, "dana", nil},
		{[]string{"-principal", "svc-billing", "hi?"}, "svc-billing", nil},
		{[]string{"-approvers", "erin, ops,", "hi?"}, "dana", []string{"erin", "ops"}},
	} {
		rs, err := parseRun(Config{}, tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if rs.Principal.ID != tc.principal || !slices.Equal(rs.Approvers, tc.approvers) {
			t.Errorf("toolbus run %q: principal %q approvers %q, want %q %q", tc.args, rs.Principal.ID, rs.Approvers, tc.principal, tc.approvers)
		}
	}
}
