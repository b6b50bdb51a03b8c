package console

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// serveTeam runs an executor instance of team serving tool (which needs approval) until
// the test ends, and waits until the catalog lists it with its owner.
func serveTeam(t *testing.T, p *pipeline, team, instance, tool string) {
	t.Helper()
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: tool, Description: team + "'s tool", NeedsApproval: true,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func:        func(context.Context, json.RawMessage) (any, error) { return team + " answered", nil }}); err != nil {
		t.Fatal(err)
	}
	w := testutil.Must(worker.New(p.bus, testutil.Must(executor.New(reg)), worker.Config{
		WorkerConfig: workerconfig.WorkerConfig{Instance: instance, Grace: time.Second, Logger: p.Log}, Team: team}))
	ctx, stop := context.WithCancel(p.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	eventstest.Eventually(t, time.Minute, func() error {
		owners, err := (&server{bus: p.bus}).owners(p.ctx)
		if err != nil {
			return err
		}
		if owners[tool] != team {
			return fmt.Errorf("%s not in the catalog as %s's yet", tool, team)
		}
		return nil
	})
}

// teamUsers writes an access list of hank (team hr), erin (team search) and dave (no
// teams) and returns the console serving it and their tokens.
func teamUsers(t *testing.T, p *pipeline) (string, consoleUsers) {
	t.Helper()
	users := consoleUsers{"hank": door.NewToken(), "erin": door.NewToken(), "dave": door.NewToken()}
	lines := door.Entry("hank", users["hank"], []string{"hr"}) + "\n" + door.Entry("erin", users["erin"], []string{"search"}) +
		"\n" + door.Entry("dave", users["dave"], nil) + "\n"
	path := filepath.Join(t.TempDir(), "console-users")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := door.NewSource("", path)
	if err != nil {
		t.Fatal(err)
	}
	return startConsole(t, p, Options{Users: src}).URL, users
}

// getHead is get that reads the body only of an answer that is no 200 (a live stream
// that was let in is not read, it never ends).
func getHead(t *testing.T, u, token string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// liveSubjects follows the console's live stream of every run as token and sends the
// subject of each event it forwards.
func liveSubjects(t *testing.T, ctx context.Context, base, token string) <-chan string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("live stream: %s", resp.Status)
	}
	out := make(chan string, 1024)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			var n struct{ Subject string }
			if ok && json.Unmarshal([]byte(data), &n) == nil && n.Subject != "" {
				out <- n.Subject
			}
		}
	}()
	return out
}

// TestConsoleTeamsSeeTheirOwn: console users whose line names teams see the tools and
// executor instances of their teams (and of no team), the runs they started or that
// called their teams' tools, and nothing else: another run's page, raw events and live
// stream answer 403, the stream of every run forwards none of its events, and its
// decisions and cancel are refused with 403 and nothing is recorded. In a run they see,
// they decide only their teams' calls, and cancel only runs they started. A user
// without teams sees and decides everything. What decides is what the core wrote: a
// team's empty log line in a run that never called its tool shows that run to none of
// its users; a run whose start names a user as approver is theirs to see. In a shared
// run a team's user reads its own tool's call in full and the other team's withheld,
// its owner named, on the run page and in the raw events.
func TestConsoleTeamsSeeTheirOwn(t *testing.T) {
	scripts := map[string]*planner.Script{}
	for _, run := range []string{"t-hr", "t-mixed", "t-hr2", "t-appr"} {
		calls := []toolbus.ToolCall{call("p", "payroll", `{"employee":"hr-secret-7"}`)}
		if run == "t-mixed" {
			calls = append(calls, call("w", "websearch", `{"q":"search-own-3"}`))
		}
		scripts[run] = &planner.Script{Steps: []func(planner.Request) planner.Response{planner.Calls(calls...), planner.Answer("done")}}
	}
	for _, run := range []string{"t-erin", "t-erin2"} {
		scripts[run] = &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("c", "calculator", `{"expression":"1+1"}`)), planner.Answer("2")}}
	}
	p := startPipeline(t, scripts)
	serveTeam(t, p, "hr", "hr-1", "payroll")
	serveTeam(t, p, "search", "search-1", "websearch")
	base, users := teamUsers(t, p)
	hank, erin, dave := users["hank"], users["erin"], users["dave"]

	p.SubmitAs("t-hr", "alice", "pay", toolbus.Limits{})
	p.SubmitAs("t-mixed", "alice", "pay and search", toolbus.Limits{})
	p.SubmitAs("t-erin", "erin", "add", toolbus.Limits{})
	p.WaitStatus("t-hr", toolbus.RunWaitingForApproval)
	p.WaitStatus("t-mixed", toolbus.RunWaitingForApproval)
	p.WaitStatus("t-erin", toolbus.RunCompleted)

	// The attack: team search writes one empty log line of its own tool into alice's
	// t-hr, which never called websearch. Who sees a run is decided by what the core
	// wrote (its calls, its principal), so erin still may not see t-hr (below; the
	// control: she sees t-mixed, which really called websearch).
	if _, err := p.bus.PublishEvent(p.ctx, events.ToolLogEvent("/search/exec", toolbus.ToolLog{
		RunID: "t-hr", CallID: "p", Tool: "websearch", Attempt: 1, Seq: 1, Level: "info"})); err != nil {
		t.Fatal(err)
	}

	// A run of alice's that names erin as an approver: its start, as stored, makes it
	// erin's to see, each call in full (as the read service gives approvers their runs).
	if err := p.bus.StartRun(p.ctx, "/test", toolbus.RunStarted{RunID: "t-appr", Model: "script", Principal: toolbus.Principal{ID: "alice"},
		Approvers: []string{"erin"}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "pay, erin approves"}}}); err != nil {
		t.Fatal(err)
	}
	p.WaitStatus("t-appr", toolbus.RunWaitingForApproval)
	if code, body := get(t, base+"/runs/t-appr", erin); code != http.StatusOK || !strings.Contains(body, "hr-secret-7") || strings.Contains(body, "withheld") {
		t.Fatalf("erin, t-appr's approver, reads its page: %d, want 200 with payroll's arguments in full:\n%s", code, body)
	}

	runsOf := func(token string) string {
		t.Helper()
		code, body := get(t, base+"/?n=200", token)
		if code != http.StatusOK {
			t.Fatalf("runs list: %d %s", code, body)
		}
		return body
	}
	for who, c := range map[string]struct {
		token     string
		sees, not []string
	}{
		"hank (hr)":       {hank, []string{"t-hr", "t-mixed", "t-appr"}, []string{"t-erin"}},
		"erin (search)":   {erin, []string{"t-erin", "t-mixed", "t-appr"}, []string{"t-hr"}},
		"dave (no teams)": {dave, []string{"t-hr", "t-mixed", "t-erin", "t-appr"}, nil},
	} {
		body := runsOf(c.token)
		for _, run := range c.sees {
			if !strings.Contains(body, `href="/runs/`+run+`"`) {
				t.Errorf("%s: the runs list lacks %s", who, run)
			}
		}
		for _, run := range c.not {
			if strings.Contains(body, run+`"`) {
				t.Errorf("%s: the runs list shows %s", who, run)
			}
			for _, path := range []string{"/runs/" + run, "/runs/" + run + "/events", "/runs/" + run + "/events.json", "/events?run=" + run} {
				if code, body := getHead(t, base+path, c.token); code != http.StatusForbidden || !strings.Contains(body, "may not see run "+run) {
					t.Errorf("%s GET %s: %d %q, want 403 that says why", who, path, code, body)
				}
			}
		}
	}

	// Tools and instances: owner and team shown, other teams' hidden.
	for who, c := range map[string]struct {
		token     string
		sees, not []string
	}{
		"hank": {hank, []string{`data-tool="payroll"`, `data-tool="calculator"`, `data-instance="hr-1" data-team="hr"`, `data-owner="hr"`}, []string{"websearch", "search-1"}},
		"erin": {erin, []string{`data-tool="websearch"`, `data-tool="calculator"`, `data-instance="search-1" data-team="search"`}, []string{"payroll", "hr-1"}},
		"dave": {dave, []string{`data-tool="websearch"`, `data-tool="payroll"`, `data-instance="hr-1"`, `data-instance="search-1"`}, nil},
	} {
		code, body := get(t, base+"/tools", c.token)
		if code != http.StatusOK {
			t.Fatalf("%s tools: %d %s", who, code, body)
		}
		wantContains(t, who+"'s tools page", body, c.sees...)
		for _, s := range c.not {
			if strings.Contains(body, s) {
				t.Errorf("%s's tools page shows %s", who, s)
			}
		}
	}

	// Decisions: erin cannot touch t-hr; in t-mixed hank decides payroll, erin websearch.
	decide := func(token, run, callID string) (int, string) {
		return post(t, base+"/runs/"+run+"/approve", token, url.Values{"call": {callID}})
	}
	if code, body := decide(erin, "t-hr", "p"); code != http.StatusForbidden || !strings.Contains(body, "may not see run t-hr") {
		t.Fatalf("erin approves t-hr: %d %s, want 403", code, body)
	}
	if code, body := post(t, base+"/runs/t-hr/cancel", erin, url.Values{}); code != http.StatusForbidden {
		t.Fatalf("erin cancels t-hr: %d %s, want 403", code, body)
	}
	if code, body := post(t, base+"/runs/t-hr/cancel", hank, url.Values{}); code != http.StatusForbidden || !strings.Contains(body, "cancels only the runs they started") {
		t.Fatalf("hank cancels alice's t-hr: %d %s, want 403", code, body)
	}
	_, body := get(t, base+"/runs/t-mixed", hank)
	wantContains(t, "hank's t-mixed page", body, `id="decide-p"`, `formaction="/runs/t-mixed/approve"`, "not yours to decide")
	if strings.Contains(body, `id="cancel"`) {
		t.Error("hank is offered to cancel alice's run")
	}
	if code, body := decide(hank, "t-mixed", "w"); code != http.StatusForbidden || !strings.Contains(body, "team search's") {
		t.Fatalf("hank approves search's websearch: %d %s, want 403", code, body)
	}
	if _, err := p.bus.Store().StepDecision(p.ctx, "t-hr", 0, "p"); err == nil {
		t.Fatal("a refused decision was recorded")
	}
	if _, err := p.bus.Store().StepDecision(p.ctx, "t-mixed", 0, "w"); err == nil {
		t.Fatal("a refused decision was recorded")
	}
	for _, d := range []struct{ token, run, call string }{{hank, "t-mixed", "p"}, {erin, "t-mixed", "w"}, {dave, "t-hr", "p"}} {
		if code, body := decide(d.token, d.run, d.call); code != http.StatusSeeOther {
			t.Fatalf("approve %s %s: %d %s", d.run, d.call, code, body)
		}
	}
	p.WaitStatus("t-mixed", toolbus.RunCompleted)
	p.WaitStatus("t-hr", toolbus.RunCompleted)

	// In the shared t-mixed each team's user reads its own tool's call in full (its
	// arguments and output) and the other team's withheld, its owner named, on the run
	// page (timeline, details, transcript) and in the raw events; dave (no teams) reads
	// both.
	for who, c := range map[string]struct {
		token, owner string
		full, hidden []string
	}{
		"hank": {hank, "team search", []string{"hr-secret-7", "hr answered"}, []string{"search-own-3", "search answered"}},
		"erin": {erin, "team hr", []string{"search-own-3", "search answered"}, []string{"hr-secret-7", "hr answered"}},
		"dave": {dave, "", []string{"hr-secret-7", "hr answered", "search-own-3", "search answered"}, nil},
	} {
		for _, path := range []string{"/runs/t-mixed", "/runs/t-mixed/events", "/runs/t-mixed/events.json"} {
			code, body := get(t, base+path, c.token)
			if code != http.StatusOK {
				t.Fatalf("%s GET %s: %d %s", who, path, code, body)
			}
			wantContains(t, who+" "+path, body, c.full...)
			for _, h := range c.hidden {
				if strings.Contains(body, h) {
					t.Errorf("%s GET %s shows the other team's %q", who, path, h)
				}
			}
			if c.owner != "" && !strings.Contains(body, "withheld: a call of "+c.owner) {
				t.Errorf("%s GET %s: nothing says the call of %s was withheld", who, path, c.owner)
			}
		}
	}

	// The live stream of every run: erin hears her own run, never hr's.
	sctx, stop := context.WithCancel(p.ctx)
	defer stop()
	erinLive, hankLive := liveSubjects(t, sctx, base, erin), liveSubjects(t, sctx, base, hank)
	p.SubmitAs("t-hr2", "alice", "pay again", toolbus.Limits{})
	p.WaitStatus("t-hr2", toolbus.RunWaitingForApproval)
	p.SubmitAs("t-erin2", "erin", "add again", toolbus.Limits{})
	p.WaitStatus("t-erin2", toolbus.RunCompleted)
	follow := func(who string, ch <-chan string, until string) []string {
		t.Helper()
		var got []string
		deadline := time.After(time.Minute)
		for {
			select {
			case s, ok := <-ch:
				if !ok {
					t.Fatalf("%s's stream ended; got %v", who, got)
				}
				got = append(got, s)
				if strings.HasPrefix(s, until) {
					return got
				}
			case <-deadline:
				t.Fatalf("%s's stream never forwarded %s; got %v", who, until, got)
			}
		}
	}
	for _, s := range follow("erin", erinLive, "toolbus.t-erin2.run.completed") {
		if strings.Contains(s, "t-hr2") {
			t.Fatalf("erin's live stream forwarded %s", s)
		}
	}
	follow("hank", hankLive, "toolbus.t-hr2.run.waiting_for_approval")
}
