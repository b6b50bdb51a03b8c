package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

// usageCommands are the commands the top-level usage lists ("planner | executor |
// injector" lists three).
func usageCommands(t *testing.T) []string {
	t.Helper()
	line := regexp.MustCompile(`^  ([a-z]+)((?: \| [a-z]+)*)`)
	var names []string
	for _, l := range strings.Split(usage, "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		names = append(names, m[1])
		for _, alt := range strings.Split(m[2], "|") {
			if alt = strings.TrimSpace(alt); alt != "" {
				names = append(names, alt)
			}
		}
	}
	if len(names) < 15 {
		t.Fatalf("found only %d commands in the usage: %v", len(names), names)
	}
	return names
}

// TestCLIHelpWalk walks every command of the usage: -h and --help print the command's
// usage on stdout, nothing on stderr, exit 0, and start nothing.
func TestCLIHelpWalk(t *testing.T) {
	dir := noServerEnv(t)
	for _, name := range usageCommands(t) {
		for _, h := range []string{"-h", "--help"} {
			t.Run(name+" "+h, func(t *testing.T) {
				args := []string{name, h}
				if name == "version" {
					args = []string{name} // version answers; it has no usage
				}
				code, out, errOut := cli(t, args...)
				wantCode(t, strings.Join(args, " "), code, 0, out, errOut)
				if errOut != "" {
					t.Fatalf("stderr is not empty:\n%s", errOut)
				}
				want := "usage: toolbus " + name
				if name == "version" {
					want = "toolbus "
				}
				wantContains(t, "stdout", out, want)
				wantNoDir(t, dir)
			})
		}
	}
}

// TestClientLogLevel: client commands log warnings only, -v gives info, and the
// variable, when set, is honoured.
func TestClientLogLevel(t *testing.T) {
	tests := []struct {
		level        string
		set, verbose bool
		want         string
	}{
		{"info", false, false, "warn"},
		{"info", false, true, "info"},
		{"debug", true, false, "debug"},
		{"debug", true, true, "debug"},
		{"error", true, false, "error"},
		{"error", true, true, "info"},
	}
	for _, tt := range tests {
		if got := clientLogLevel(tt.level, tt.set, tt.verbose); got != tt.want {
			t.Errorf("clientLogLevel(%q, set=%v, -v=%v) = %q, want %q", tt.level, tt.set, tt.verbose, got, tt.want)
		}
	}
	if !verbose([]string{"x", "-v"}) || verbose([]string{"--", "-v"}) || verbose([]string{"x"}) {
		t.Fatal("verbose: -v before -- only")
	}
}

// TestCLIQuietAndTimers: against a server, client commands print no connection logs
// unless -v; tail and replay know the run's deadline timer; who falls back to the
// account when $USER is unset.
func TestCLIQuietAndTimers(t *testing.T) {
	p := startOpsPipeline(t, map[string]*planner.Script{
		"dx-timer": {Steps: []func(planner.Request) planner.Response{planner.Answer("hi")}},
	})
	t.Setenv("TOOLBUS_LOG_LEVEL", "")
	// A deadline nearer than the injector's acknowledgement wait (30 s): its timer is
	// published at once (a run with a further one that ends at once gets none).
	p.submit("dx-timer", toolbus.Limits{Deadline: time.Now().Add(20 * time.Second).UTC()})
	p.waitStatus("dx-timer", toolbus.RunCompleted)

	code, out, errOut := p.toolbus("runs")
	wantCode(t, "runs", code, 0, out, errOut)
	if errOut != "" {
		t.Fatalf("runs logged on stderr without -v:\n%s", errOut)
	}
	code, out, errOut = p.toolbus("runs", "-v")
	wantCode(t, "runs -v", code, 0, out, errOut)
	wantContains(t, "runs -v stderr", errOut, "connected to NATS")

	code, out, errOut = p.toolbus("replay", "dx-timer")
	wantCode(t, "replay", code, 0, out, errOut)
	wantContains(t, "replay", out, "timer.deadline: the run ends at ")
	if strings.Contains(out, "unknown event type") {
		t.Fatalf("replay does not know an event type:\n%s", out)
	}
	code, out, errOut = p.toolbus("tail", "--all", "dx-timer")
	wantCode(t, "tail --all", code, 0, out, errOut)
	wantContains(t, "tail --all", out, "deadline timer set: the run ends at ", "run dx-timer: completed")
	if strings.Contains(out, "unknown to this version") || errOut != "" {
		t.Fatalf("tail:\n%s\nstderr:\n%s", out, errOut)
	}

	t.Setenv("USER", "")
	if w := who(""); w == "" || w == "unknown" {
		t.Fatalf("who without $USER = %q, want the account or the uid", w)
	}
}
