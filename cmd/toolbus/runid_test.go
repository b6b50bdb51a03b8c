package main

import (
	"testing"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/planner"
)

// `toolbus run --id X` with an X that names an existing run exits 2 with a clear
// message, and publishes nothing.
func TestRunRefusesAnExistingRunID(t *testing.T) {
	p := startOpsPipeline(t, map[string]*planner.Script{
		"taken-1": {Steps: []func(planner.Request) planner.Response{planner.Answer("done")}},
	})
	p.submit("taken-1", events.Limits{})
	p.waitStatus("taken-1", events.RunCompleted)
	before, err := p.bus.Stream.Info(p.ctx)
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := p.toolbus("run", "--id", "taken-1", "again?")
	wantCode(t, "run with an existing id", code, 2, stdout, stderr)
	wantContains(t, "run with an existing id", stdout+stderr, `run id "taken-1" already exists`)
	after, err := p.bus.Stream.Info(p.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.LastSeq != before.State.LastSeq {
		t.Fatalf("the refused run published %d events", after.State.LastSeq-before.State.LastSeq)
	}
}
