package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/golden"
	"github.com/toolbus/toolbus/internal/timeline"
)

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseInterleaved(t *testing.T) {
	tests := []struct {
		args       []string
		pos, why   string
		whoFlagVal string
	}{
		{[]string{"run-1", "call_1", "--reason", "because", "--who", "ann"}, "run-1 call_1", "because", "ann"},
		{[]string{"--reason=x", "run-1", "call_1"}, "run-1 call_1", "x", ""},
		{[]string{"run-1", "--reason", "y", "call_1"}, "run-1 call_1", "y", ""},
		{[]string{"run-1", "--", "--call"}, "run-1 --call", "", ""},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		why := fs.String("reason", "", "")
		by := fs.String("who", "", "")
		pos, err := parseInterleaved(fs, tt.args)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(pos, " ") != tt.pos || *why != tt.why || *by != tt.whoFlagVal {
			t.Errorf("%q: pos %q reason %q who %q", tt.args, pos, *why, *by)
		}
	}
}

func TestWriteRuns(t *testing.T) {
	now := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	runs := []store.RunState{
		{RunID: "run-old", Status: toolbus.RunCompleted, Step: 2, StartedAt: now.Add(-26 * time.Hour), UpdatedAt: now.Add(-25 * time.Hour)},
		{RunID: "run-new", Status: toolbus.RunWaitingForApproval, Step: 0, Reason: "1 call(s) need approval", StartedAt: now.Add(-12 * time.Second), UpdatedAt: now.Add(-11 * time.Second)},
		{RunID: "run-mid", Status: toolbus.RunLimitReached, Step: 9, Code: "max_steps", Reason: "max steps 10 reached", StartedAt: now.Add(-3*time.Minute - 4*time.Second), UpdatedAt: now.Add(-2 * time.Minute)},
	}
	var out bytes.Buffer
	if err := timeline.WriteRuns(&out, runs, now, false); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "runs.txt"), out.Bytes())
}
