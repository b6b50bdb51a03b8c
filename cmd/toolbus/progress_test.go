package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/executor"
)

// crawlTool is a long-running tool (heartbeat timeout hb) that reports progress every
// hb/20 for 2.5 heartbeat timeouts, then answers.
func crawlTool(hb time.Duration) executor.Tool {
	return executor.Tool{Name: "crawl", Description: "crawls for a while, reporting progress", ReadOnly: true,
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 10 * time.Minute, HeartbeatTimeout: hb,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			start, n := time.Now(), 0
			for time.Since(start) < 5*hb/2 {
				n++
				if err := executor.Progress(ctx, float64(n), 0, "crawling"); err != nil {
					return nil, err
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(hb / 20):
				}
			}
			return "crawled", nil
		}}
}

// silentTool is a long-running tool that reports once, then nothing until it is
// stopped.
func silentTool(hb time.Duration) executor.Tool {
	return executor.Tool{Name: "silent", Description: "goes quiet", ReadOnly: true,
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 10 * time.Minute, HeartbeatTimeout: hb,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			_ = executor.Progress(ctx, 1, 10, "started")
			<-ctx.Done()
			return nil, ctx.Err()
		}}
}

// TestProgressReachesTail: a long-running tool that keeps reporting runs past its
// heartbeat timeout and succeeds, and `toolbus tail` shows its progress live, before the
// result.
func TestProgressReachesTail(t *testing.T) {
	const hb = time.Second
	p := startOpsPipeline(t, nil, crawlTool(hb))
	const run = "progress-tail"
	tailed := make(chan string, 1)
	go func() {
		_, out, errOut := p.toolbusCtx(p.ctx, "tail", run, "--color", "never")
		tailed <- out + errOut
	}()
	tc := toolbus.ToolContract{Name: "crawl", Timeout: 10 * time.Minute, HeartbeatTimeout: hb}
	if err := p.bus.StartRun(p.ctx, "/test", callrun.Build(callrun.Spec{RunID: run, Principal: toolbus.Principal{ID: "tester"},
		Tool: tc, Arguments: "{}", Via: "test"}, time.Now())); err != nil {
		t.Fatal(err)
	}
	var out string
	select {
	case out = <-tailed:
	case <-time.After(2 * time.Minute):
		t.Fatal("toolbus tail did not return when the run ended")
	}
	progress := strings.Index(out, ".. call_0 crawl progress ")
	result := strings.Index(out, "<- call_0 crawl: succeeded")
	if progress < 0 || result < 0 || progress > result {
		t.Fatalf("toolbus tail shows no progress of the call before its success:\n%s", out)
	}
	if !strings.Contains(out, "run "+run+": completed") {
		t.Fatalf("the run did not complete:\n%s", out)
	}
}

// TestSilentLongRunningToolTimesOut: a long-running tool that stops reporting is timed
// out after its heartbeat timeout, long before its own timeout (`toolbus call` exits 5).
func TestSilentLongRunningToolTimesOut(t *testing.T) {
	p := startOpsPipeline(t, nil, silentTool(time.Second))
	code, _, errOut := p.toolbus("call", "silent", "{}")
	if code != callrun.ExitTimedOut || !strings.Contains(errOut, "no progress for 1s") {
		t.Fatalf("toolbus call silent: exit %d, %s; want %d and the heartbeat timeout named", code, errOut, callrun.ExitTimedOut)
	}
}

// TestCallShowsProgress: `toolbus call` of a long-running tool shows its progress reports
// on stderr while it runs, as tail does, and prints the output on stdout.
func TestCallShowsProgress(t *testing.T) {
	p := startOpsPipeline(t, nil, crawlTool(time.Second))
	code, out, errOut := p.toolbus("call", "crawl", "{}")
	wantCode(t, "toolbus call crawl", code, 0, out, errOut)
	wantContains(t, "toolbus call crawl", errOut, ".. crawl progress 1: crawling")
	wantContains(t, "toolbus call crawl", out, "crawled")
	if strings.Contains(out, "progress") {
		t.Fatalf("progress on stdout, where the output goes:\n%s", out)
	}
}
