package faults_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
)

// TestFaultQuestionSurvivesRestarts: a tool asks its run's caller a question
// (executor.Ask) and waits; every process is killed -9 while it waits (executor,
// planner, injector and the nats-server) and started again, the server on the same
// store. Two runs ask: q-between is answered with the real CLI (`toolbus answer`, as the
// run's principal) while only the server is back, q-after once everything is back and
// the executor re-ran its call and waits for the question it found asked. Both runs
// complete, each tool's result carries the answer and comes from the re-run (attempt
// 2), the tool's side effect (after the answer) happened exactly once per run, and each
// run holds exactly one tool.question and one tool.answer: the re-run did not ask again.
func TestFaultQuestionSurvivesRestarts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	start := time.Now()
	e := newEnv(t, 1)
	file := filepath.Join(e.dir, "side-effects")
	const tool = "ask_append"
	roles := func(n int) *proc {
		e.faultbusRole("planner", fmt.Sprintf("planner-%d", n), "TOOLBUS_MODEL="+tool+":1x1:0-0")
		e.toolbusRole("injector", fmt.Sprintf("injector-%d", n))
		return e.faultbusRole("executor", fmt.Sprintf("exec-%d", n), "TOOLBUS_ACK_WAIT=2s",
			"TOOLBUS_FAULT_ASK_TOOL="+tool, "TOOLBUS_FAULT_APPEND_FILE="+file)
	}
	roles(1)
	e.waitReady([]string{tool}, "planner", "injector", "executor")
	runs := []string{"q-between", "q-after"}
	e.submit(runs)
	e.eventually("both calls ask", 60*time.Second, func() error {
		for _, run := range runs {
			if n := e.count(events.SubjectToolQuestion(run, tool)); n != 1 {
				return fmt.Errorf("run %s: %d questions", run, n)
			}
		}
		return nil
	})

	// Everything dies while the calls wait, nothing was answered or finished.
	e.mu.Lock()
	workers := append([]*proc(nil), e.procs...)
	e.mu.Unlock()
	for _, p := range workers {
		p.kill()
	}
	node := e.nodes[0]
	node.proc.kill()
	if n := e.count(events.FilterToolFinished); n > 0 {
		t.Fatalf("%d results before the kill", n)
	}
	e.restartNode(node)

	answer := func(run string) {
		t.Helper()
		p := startProc(t, e.dir, "answer-"+run, e.toolbus, []string{"answer", run, "c0", `{"account":"savings"}`, "--who", "faults"},
			[]string{"TOOLBUS_NATS_URL=" + e.urls()})
		p.expect()
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			t.Fatalf("toolbus answer %s did not end:\n%s", run, p.logTail(20))
		}
		if code := p.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(p.logText(), "answered the question of call c0") {
			t.Fatalf("toolbus answer %s exited %d:\n%s", run, code, p.logTail(20))
		}
	}
	answer("q-between") // no worker is running
	exec := roles(2)
	e.eventually("q-after's call runs again and waits for the question asked before", 60*time.Second, func() error {
		for _, l := range strings.Split(exec.logText(), "\n") {
			if strings.Contains(l, "not asked again") && strings.Contains(l, "run_id=q-after") {
				return nil
			}
		}
		return fmt.Errorf("exec-2 does not wait yet:\n%s", exec.logTail(5))
	})
	answer("q-after")
	e.waitCompleted(runs, 60*time.Second)

	tl := e.tally()
	st := e.checkRuns(tl, runs, 1, 1)
	for _, run := range runs {
		for k, fs := range tl[run].finished {
			for _, f := range fs {
				if r := f.ToolResult; r.Attempt != 2 || !strings.Contains(r.Content, `"account":"savings"`) || !strings.Contains(r.Content, `"by":"faults"`) {
					t.Errorf("run %s call %v: attempt %d, content %s; want the re-run's result with the principal's answer", run, k, r.Attempt, r.Content)
				}
			}
		}
		for _, filter := range []string{events.SubjectToolQuestion(run, tool), events.FilterToolAnswers(run)} {
			if n := e.count(filter); n != 1 {
				t.Errorf("run %s: %d events on %s, want exactly 1", run, n, filter)
			}
		}
	}
	checkSideEffects(t, file, runs, 1, 1)
	for key, lines := range scanLines(t, file) {
		if f := strings.Fields(lines[0]); len(f) < 5 || f[1] != "exec-2" || f[2] != "2" || f[4] != "savings" {
			t.Errorf("side effect of %s: %q, want exec-2 at attempt 2 with the answer", key, lines)
		}
	}
	t.Logf("%s; test took %v", st, time.Since(start).Round(time.Millisecond))
}
