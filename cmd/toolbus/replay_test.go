package main

import (
	"encoding/json"
	"flag"
	"strings"
	"testing"
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
