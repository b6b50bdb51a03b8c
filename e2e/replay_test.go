package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/planner"
)

// built is the toolbus binary buildToolbus built, once per test process.
var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

// buildToolbus builds the toolbus command into a temporary directory, once for every
// test that asks (TestMain removes it).
func buildToolbus(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the toolbus binary")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build toolbus with")
	}
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "toolbus-e2e-bin-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "toolbus")
		if out, err := exec.Command(goBin, "build", "-o", built.bin, "github.com/toolbus/toolbus/cmd/toolbus").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// toolbusCLI runs the toolbus binary against the stack's server.
func (s *stack) toolbusCLI(bin string, args ...string) (code int, stdout, stderr string) {
	s.t.Helper()
	cmd := exec.CommandContext(s.ctx, bin, args...)
	cmd.Env = append(os.Environ(), "TOOLBUS_NATS_URL="+s.srv.URL, "TOOLBUS_LOG_LEVEL=warn")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
	default:
		s.t.Fatalf("toolbus %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

// replayJSON is the part of `toolbus replay --json` the tests read.
type replayJSON struct {
	Status     toolbus.RunStatus `json:"status"`
	Transcript []toolbus.Message `json:"transcript"`
	Calls      []struct {
		CallID   string              `json:"call_id"`
		Decision string              `json:"decision"`
		Result   *toolbus.ToolResult `json:"result"`
	} `json:"calls"`
	Violations []struct {
		Code string `json:"code"`
	} `json:"violations"`
	OK bool `json:"ok"`
}

// The toolbus binary audits real runs from the stream: the transcript it rebuilds is
// what the model was sent, every invariant holds, and a forged duplicate result makes it
// exit 1.
func TestReplayCommand(t *testing.T) {
	t.Parallel()
	bin := buildToolbus(t)
	deploy := newDeployTool()
	tool, watch := orderedTool(t, 3)
	model := planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		return replayScripts[req.RunID].Complete(ctx, req)
	})
	s := newStack(t, model, deploy.tool(), tool)
	watch(s.srv.Conn)
	s.startAll()

	// Three calls finishing in reverse order, then an approval, then an answer.
	s.submit("audit-1", toolbus.Limits{})
	s.waitOutcome("audit-1", "waiting for d", waitingFor("d"))
	s.decide("audit-1", "d", true, "ok")
	if ended := s.waitEnd("audit-1", toolbus.RunCompleted, toolbus.RunFailed); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	code, out, errOut := s.toolbusCLI(bin, "replay", "audit-1", "--json")
	if code != 0 {
		t.Fatalf("replay exit %d\n%s\n%s", code, out, errOut)
	}
	var r replayJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !r.OK || r.Status != toolbus.RunCompleted || len(r.Violations) != 0 {
		t.Fatalf("report: %+v", r)
	}
	last, ok := s.seenReq.forStep("audit-1", 2)
	if !ok {
		t.Fatal("no model request for step 2")
	}
	want := append(append([]toolbus.Message(nil), last.Messages...), toolbus.Message{Role: toolbus.RoleAssistant, Content: "audited"})
	if g, w := marshal(t, r.Transcript), marshal(t, want); g != w {
		t.Fatalf("replayed transcript\n%s\nwant what the model was sent\n%s", g, w)
	}
	if r.Calls[3].CallID != "d" || r.Calls[3].Decision != "granted" {
		t.Fatalf("calls %+v", r.Calls)
	}

	code, out, errOut = s.toolbusCLI(bin, "replay", "audit-1")
	if code != 0 || !strings.Contains(out, "invariants: ok") || !strings.Contains(out, "approval.granted d deploy: approval granted by alice: ok") {
		t.Fatalf("replay exit %d\n%s\n%s", code, out, errOut)
	}

	// A cancelled run replays clean: its late cancelled result is allowed.
	s.submit("audit-cancel", toolbus.Limits{})
	s.waitEvents("audit-cancel", events.TypeToolRequested, 1)
	if _, err := s.bus.PublishCancel(s.ctx, "/test", toolbus.Cancel{RunID: "audit-cancel"}); err != nil {
		t.Fatal(err)
	}
	s.waitOutcome("audit-cancel", "cancelled", statusIs(toolbus.RunCancelled))
	s.waitIdle("executor")
	code, out, errOut = s.toolbusCLI(bin, "replay", "audit-cancel")
	if code != 0 || !strings.Contains(out, "run audit-cancel: cancelled") {
		t.Fatalf("replay of the cancelled run: exit %d\n%s\n%s", code, out, errOut)
	}

	code, out, errOut = s.toolbusCLI(bin, "runs")
	if code != 0 || !strings.Contains(out, "audit-1") || !strings.Contains(out, "audit-cancel") {
		t.Fatalf("runs: exit %d\n%s\n%s", code, out, errOut)
	}

	// Forge a second result for a call that has one.
	forged := toolbus.ToolFinished{RunID: "audit-1", Step: 0, CallIndex: 0, CallCount: 3,
		ToolResult: toolbus.ToolResult{CallID: "a", Tool: "ordered", Status: toolbus.StatusSucceeded, Content: `{"n":99}`}}
	if _, err := s.bus.Publish(s.ctx, events.SubjectToolFinished("audit-1", "ordered"), events.Meta{
		ID: "forged", Type: events.TypeToolFinished, Source: "/forger", RunID: "audit-1", CallID: "a", CallCount: 3,
	}, forged); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = s.toolbusCLI(bin, "replay", "audit-1", "--json")
	if code != 1 {
		t.Fatalf("replay of a forged run: exit %d, want 1\n%s\n%s", code, out, errOut)
	}
	r = replayJSON{}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.OK || len(r.Violations) != 1 || r.Violations[0].Code != "duplicate_result" {
		t.Fatalf("violations %+v", r.Violations)
	}
}

var replayScripts = map[string]*planner.Script{
	"audit-1": {Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "ordered", `{"n":0}`), call("b", "ordered", `{"n":1}`), call("c", "ordered", `{"n":2}`)),
		planner.Calls(call("d", "deploy", `{"service":"api"}`)),
		planner.Answer("audited"),
	}},
	"audit-cancel": {Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("s", "sleep", `{"ms":60000}`)),
		planner.Answer("unreachable"),
	}},
}

func marshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
