package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/")

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		i := 0
		for i < len(g) && i < len(w) && g[i] == w[i] {
			i++
		}
		line := func(l []string) string {
			if i < len(l) {
				return l[i]
			}
			return "(end of file)"
		}
		t.Fatalf("%s differs from the output at line %d (go test -update rewrites it):\ngot:  %s\nwant: %s", path, i+1, line(g), line(w))
	}
}

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
	runs := []events.RunState{
		{RunID: "run-old", Status: toolbus.RunCompleted, Step: 2, StartedAt: now.Add(-26 * time.Hour), UpdatedAt: now.Add(-25 * time.Hour)},
		{RunID: "run-new", Status: toolbus.RunWaitingForApproval, Step: 0, Reason: "1 call(s) need approval", StartedAt: now.Add(-12 * time.Second), UpdatedAt: now.Add(-11 * time.Second)},
		{RunID: "run-mid", Status: toolbus.RunLimitReached, Step: 9, Code: "max_steps", Reason: "max steps 10 reached", StartedAt: now.Add(-3*time.Minute - 4*time.Second), UpdatedAt: now.Add(-2 * time.Minute)},
	}
	var out bytes.Buffer
	if err := writeRuns(&out, runs, now, false); err != nil {
		t.Fatal(err)
	}
	golden(t, filepath.Join("testdata", "runs.txt"), out.Bytes())
}
