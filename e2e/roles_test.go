package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/console"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/telemetry"
)

// The feature matrix under least privilege: every feature end to end, each role on its
// own credentials of each kind (user/password, nkeys, JWT), servers started from the
// shipped deploy/nats files. Each feature is done with the credentials of the role that
// does it in production (the client approves, cancels, lists and reads; the workers
// serve), and no role may hit a permission violation.

// matrixModel answers by the kind of run, named in its id: "<kind>-<credentials>".
func matrixModel() planner.Model {
	return planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		kind, _, _ := strings.Cut(req.RunID, "-")
		if req.Step > 0 {
			return planner.Answer("done")(req), nil
		}
		switch kind {
		case "approve", "deny":
			return planner.Calls(call("d", "deploy", `{"service":"api"}`))(req), nil
		case "cancel", "deadline":
			return planner.Calls(call("h", "hold", `{}`))(req), nil
		case "output":
			return planner.Calls(call("o", "big_output", `{"bytes":2000000}`))(req), nil
		case "mcp":
			return planner.Calls(call("m", "everything__echo", `{"message":"through the bus"}`))(req), nil
		default:
			return planner.Calls(call("a", "noop", `{}`), call("b", "calculator", `{"expression":"2+3"}`))(req), nil
		}
	})
}

// feature is one row of the matrix: it runs the feature as the roles do and checks its
// outcome.
type feature struct {
	name string
	run  func(t *testing.T, s *secured, run string)
}

func matrixFeatures(deploy *deployTool, held <-chan string) []feature {
	return []feature{
		{"approve", func(t *testing.T, s *secured, run string) {
			s.start(run, toolbus.Limits{})
			s.waitOutcome(run, toolbus.RunWaitingForApproval)
			s.decide(run, "d", true)
			s.waitOutcome(run, toolbus.RunCompleted)
			if r := s.result(run, "d"); r.Status != toolbus.StatusSucceeded {
				t.Fatalf("approved call: %+v", r)
			}
		}},
		{"deny", func(t *testing.T, s *secured, run string) {
			before := deploy.total()
			s.start(run, toolbus.Limits{})
			s.waitOutcome(run, toolbus.RunWaitingForApproval)
			s.decide(run, "d", false)
			s.waitOutcome(run, toolbus.RunCompleted)
			if r := s.result(run, "d"); r.Status != toolbus.StatusRejected || r.Code() != toolbus.CodeApprovalDenied {
				t.Fatalf("denied call: %+v", r)
			}
			if n := deploy.total(); n != before {
				t.Fatalf("a denied call ran (%d runs, %d before)", n, before)
			}
		}},
		{"cancel", func(t *testing.T, s *secured, run string) {
			s.start(run, toolbus.Limits{})
			waitHeld(t, held, run)
			if _, err := s.buses["client"].PublishCancel(s.ctx, events.Source("cli", "matrix"), toolbus.Cancel{RunID: run, Reason: "matrix"}); err != nil {
				t.Fatalf("client cancels: %v", err)
			}
			s.waitOutcome(run, toolbus.RunCancelled)
			if r := s.result(run, "h"); r.Status != toolbus.StatusCancelled {
				t.Fatalf("call of the cancelled run: %+v", r)
			}
		}},
		{"deadline", func(t *testing.T, s *secured, run string) {
			s.start(run, toolbus.Limits{Deadline: time.Now().Add(3 * time.Second)})
			ended := s.waitOutcome(run, toolbus.RunLimitReached)
			if ended.Code != toolbus.LimitDeadline {
				t.Fatalf("outcome %+v, want limit_reached/deadline", ended)
			}
			if r := s.result(run, "h"); r.Status != toolbus.StatusTimedOut {
				t.Fatalf("call past the deadline: %+v", r)
			}
		}},
		{"tools", func(t *testing.T, s *secured, _ string) {
			// What `toolbus tools` reads: the catalog and the live instances.
			client := s.buses["client"]
			cs, err := client.Store().Contracts(s.ctx)
			if err != nil {
				t.Fatalf("client lists the catalog: %v", err)
			}
			var names []string
			for _, c := range cs {
				names = append(names, c.Name)
			}
			for _, want := range []string{"calculator", "deploy", "hold", "noop"} {
				if !slices.Contains(names, want) {
					t.Fatalf("catalog %v has no %s", names, want)
				}
			}
			ins, err := client.Store().Instances(s.ctx)
			if err != nil || len(ins) == 0 {
				t.Fatalf("client lists instances: %v %+v", err, ins)
			}
		}},
		{"tail", func(t *testing.T, s *secured, run string) {
			// `toolbus tail` follows every run from now on; `toolbus run` follows its own.
			client := s.buses["client"]
			all, err := runlog.Watch(s.ctx, client, events.FilterAll, false)
			if err != nil {
				t.Fatalf("client tails: %v", err)
			}
			one, err := runlog.Watch(s.ctx, client, events.SubjectRun(run), true)
			if err != nil {
				t.Fatalf("client follows a run: %v", err)
			}
			s.start(run, toolbus.Limits{})
			for name, w := range map[string]*runlog.Watcher{"tail": all, "run": one} {
				waitWatched(t, s.ctx, w, name, events.SubjectRunEnded(run, toolbus.RunCompleted))
			}
		}},
		{"runs", func(t *testing.T, s *secured, run string) {
			s.start(run, toolbus.Limits{})
			s.waitOutcome(run, toolbus.RunCompleted)
			runs, err := s.buses["client"].Store().Runs(s.ctx)
			if err != nil {
				t.Fatalf("client lists runs: %v", err)
			}
			if !slices.ContainsFunc(runs, func(r store.RunState) bool { return r.RunID == run && r.Status == toolbus.RunCompleted }) {
				t.Fatalf("run %s not listed as completed: %+v", run, runs)
			}
		}},
		{"output", func(t *testing.T, s *secured, run string) {
			// A large output goes to the object store; the console shows it whole.
			s.start(run, toolbus.Limits{})
			s.waitOutcome(run, toolbus.RunCompleted)
			r := s.result(run, "o")
			if r.Status != toolbus.StatusSucceeded || r.Truncated == nil || r.Truncated.Ref == "" {
				t.Fatalf("large output not kept in the object store: %+v", r)
			}
			data, err := s.buses["client"].Store().Output(s.ctx, r.Truncated.Ref)
			if err != nil || len(data) != r.Truncated.OriginalBytes {
				t.Fatalf("client reads the output: %d bytes, %v; want %d", len(data), err, r.Truncated.OriginalBytes)
			}
		}},
		{"mcp", func(t *testing.T, s *secured, run string) {
			// A tool of an MCP server (TOOLBUS_MCP_CONFIG), served by the executor role.
			s.start(run, toolbus.Limits{})
			s.waitOutcome(run, toolbus.RunCompleted)
			if r := s.result(run, "m"); r.Status != toolbus.StatusSucceeded || !strings.Contains(r.Content, "through the bus") {
				t.Fatalf("MCP tool call: %+v", r)
			}
		}},
		{"console", func(t *testing.T, s *secured, run string) {
			// The console's actions (approve, deny, cancel over HTTP, as a signed-in user)
			// on the client's credentials.
			srv := consoleOn(t, s, "erin")
			act := func(path string, form url.Values) {
				t.Helper()
				req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("Authorization", "Bearer "+srv.token)
				c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusSeeOther {
					t.Fatalf("POST %s: %d %s", path, resp.StatusCode, body)
				}
			}
			for _, granted := range []bool{true, false} {
				r, path, want := "approve-"+run, "/approve", toolbus.StatusSucceeded
				if !granted {
					r, path, want = "deny-"+run, "/deny", toolbus.StatusRejected
				}
				s.start(r, toolbus.Limits{})
				s.waitOutcome(r, toolbus.RunWaitingForApproval)
				act("/runs/"+r+path, url.Values{"call": {"d"}, "reason": {"matrix"}})
				s.waitOutcome(r, toolbus.RunCompleted)
				if got := s.result(r, "d"); got.Status != want {
					t.Fatalf("%s through the console: %+v, want %s", path, got, want)
				}
				evs, err := runlog.Events(s.ctx, s.buses["client"], r)
				if err != nil {
					t.Fatal(err)
				}
				if rep := audit.Analyze(r, evs); len(rep.Calls) == 0 || rep.Calls[0].DecidedBy != "erin" {
					t.Fatalf("%s through the console: decided by %+v, want erin", path, rep.Calls)
				}
			}
			c := "cancel-" + run
			s.start(c, toolbus.Limits{})
			waitHeld(t, held, c)
			act("/runs/"+c+"/cancel", url.Values{"reason": {"matrix"}})
			if ended := s.waitOutcome(c, toolbus.RunCancelled); !strings.Contains(ended.Reason, "erin") {
				t.Fatalf("cancelled through the console: %q, want it to name erin", ended.Reason)
			}
		}},
		{"replay", func(t *testing.T, s *secured, run string) {
			s.start(run, toolbus.Limits{})
			s.waitOutcome(run, toolbus.RunCompleted)
			// What `toolbus replay` reads and checks.
			evs, err := runlog.Events(s.ctx, s.buses["client"], run)
			if err != nil {
				t.Fatalf("client reads the run: %v", err)
			}
			r := audit.Analyze(run, evs)
			if r.Status != toolbus.RunCompleted || len(r.Violations) != 0 {
				t.Fatalf("replay: status %s, violations %+v", r.Status, r.Violations)
			}
		}},
	}
}

// The matrix: every feature, with each role on its own credentials of each kind.
func TestRolesFeatureMatrix(t *testing.T) {
	t.Parallel()
	for _, kind := range credentialKinds() {
		t.Run(kind.name, func(t *testing.T) {
			url, opts := kind.start(t)
			deploy := newDeployTool()
			held := make(chan string, 16)
			s := startSecuredWith(t, url, opts, matrixModel(), deploy.tool(), holdUntilDone(held), mcpEchoTool(t))
			for _, f := range matrixFeatures(deploy, held) {
				t.Run(f.name, func(t *testing.T) {
					f.run(t, s, f.name+"-"+kind.name)
					if v := s.viol.all(); len(v) > 0 {
						t.Fatalf("permission violations: %v", v)
					}
				})
			}
		})
	}
}

// consoleServer is a web console served over the client's bus, and the token of its user.
type consoleServer struct {
	*httptest.Server
	token string
}

// consoleOn serves the web console (package console) over the client's credentials with
// one user, user.
func consoleOn(t *testing.T, s *secured, user string) consoleServer {
	t.Helper()
	token := door.NewToken()
	path := writeFile(t, t.TempDir(), "console-users", []byte(door.Entry(user, token, nil)+"\n"))
	src, err := door.NewSource("", path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := console.New(s.ctx, s.buses["client"], console.Options{Users: src, Instance: "matrix"}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return consoleServer{srv, token}
}

// mcpEchoTool is the echo tool of server-everything (an MCP server over stdio, as
// TOOLBUS_MCP_CONFIG configures one), as the executor serves it: everything__echo.
func mcpEchoTool(t *testing.T) executor.Tool {
	t.Helper()
	mods := mcpModules(t)
	reg := executor.NewRegistry()
	p, err := mcptools.New(reg, mcptools.Config{MCPServers: map[string]mcptools.Server{
		"everything": {
			Command: "node",
			Args:    []string{filepath.Join(mods, "@modelcontextprotocol", "server-everything", "dist", "index.js"), "stdio"},
			Policy:  mcptools.Policy{AllowTools: []string{"echo"}},
		},
	}}, mcptools.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	// The server lives as long as the test: Start's context may bound its process.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	tool, ok := reg.Lookup("everything__echo")
	if !ok {
		t.Fatalf("server-everything serves %v, no echo", p.Tools())
	}
	return tool
}

// holdUntilDone is a tool that reports its run and blocks until its context ends.
func holdUntilDone(held chan<- string) executor.Tool {
	return executor.Tool{
		Name: "hold", Description: "waits until cancelled", InputSchema: objectSchema, ReadOnly: true,
		Timeout: 5 * time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			held <- ci.RunID
			<-ctx.Done()
			return nil, ctx.Err()
		},
	}
}

func waitHeld(t *testing.T, held <-chan string, run string) {
	t.Helper()
	timeout := time.After(120 * time.Second)
	for {
		select {
		case r := <-held:
			if r == run {
				return
			}
		case <-timeout:
			t.Fatalf("the call of %s never started", run)
		}
	}
}

func waitWatched(t *testing.T, ctx context.Context, w *runlog.Watcher, name, subject string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ev, ok, err := w.Next(ctx, time.Second)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if ok && ev.Subject == subject {
			return
		}
	}
	t.Fatalf("%s never saw %s", name, subject)
}

// start submits a run as the client.
func (s *secured) start(run string, limits toolbus.Limits) {
	s.t.Helper()
	err := s.buses["client"].StartRun(s.ctx, events.Source("cli", "matrix"), toolbus.RunStarted{
		RunID: run, Principal: toolbus.Principal{ID: "matrix"}, Limits: limits,
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "go"}},
	})
	if err != nil {
		s.t.Fatalf("client starts %s: %v", run, err)
	}
}

// waitOutcome waits, reading as the client, for the run's latest outcome to be status.
func (s *secured) waitOutcome(run string, status toolbus.RunStatus) toolbus.RunEnded {
	s.t.Helper()
	var last toolbus.RunEnded
	eventstest.Eventually(s.t, 60*time.Second, func() error {
		evs, err := runlog.Events(s.ctx, s.buses["client"], run)
		if err != nil {
			return err
		}
		found := false
		for _, ev := range evs {
			if ev.IsRunEnded() {
				if err := ev.Decode(&last); err != nil {
					return err
				}
				found = true
			}
		}
		if !found || last.Status != status {
			return fmt.Errorf("run %s: latest outcome %q (%s: %s), want %s (violations %v)", run, last.Status, last.Code, last.Reason, status, s.viol.all())
		}
		return nil
	})
	return last
}

// decide approves or denies a call of the run's current step as `toolbus approve|deny`.
func (s *secured) decide(run, callID string, granted bool) {
	s.t.Helper()
	client := s.buses["client"]
	step, err := client.Store().CurrentStep(s.ctx, run)
	if err != nil {
		s.t.Fatalf("client reads the step of %s: %v", run, err)
	}
	if _, err := client.PublishApproval(s.ctx, events.Source("cli", "matrix"), step,
		toolbus.Approval{RunID: run, CallID: callID, Who: "alice", Why: "matrix"}, granted); err != nil {
		s.t.Fatalf("client decides: %v", err)
	}
}

// result returns the stored result of a call, read as the client. It polls: the result
// may be stored after the run's outcome (a cancelled run ends before its executor hands
// back the cancelled call), and the client reads the read mirror, which follows the
// stream.
func (s *secured) result(run, callID string) toolbus.ToolResult {
	s.t.Helper()
	var res *toolbus.ToolResult
	eventstest.Eventually(s.t, 30*time.Second, func() error {
		evs, err := runlog.Events(s.ctx, s.buses["client"], run)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if ev.Meta.Type != events.TypeToolFinished {
				continue
			}
			var tf toolbus.ToolFinished
			if err := ev.Decode(&tf); err != nil {
				return err
			}
			if tf.ToolResult.CallID == callID {
				res = &tf.ToolResult
				return nil
			}
		}
		return fmt.Errorf("run %s has no result for %s", run, callID)
	})
	return *res
}

// A permission violation is never silent: with an executor role that may not read the
// approvals (the shipped permissions before the fix), a call that needs approval ends at
// once as failed/permission_denied naming the subject the credentials miss, the run fails
// with that code, the violation is counted, and the executor's /readyz turns not ready.
func TestRolesPermissionViolationNotSilent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := readDeployFile(t, "permissions.conf")
	exec0 := strings.Index(conf, "EXECUTOR = {")
	exec1 := strings.Index(conf, "INJECTOR = {")
	var kept []string
	for _, line := range strings.Split(conf[exec0:exec1], "\n") {
		if !strings.Contains(line, "KV_toolbus_approvals") {
			kept = append(kept, line)
		}
	}
	writeFile(t, dir, "permissions.conf", []byte(conf[:exec0]+strings.Join(kept, "\n")+conf[exec1:]))
	for _, f := range []string{"auth-users.conf", "single.conf"} {
		writeFile(t, dir, f, []byte(readDeployFile(t, f)))
	}
	pw, vars := newPasswords()
	srv := startConfigured(t, filepath.Join(dir, "auth-users.conf"), vars)
	opts := map[string][]nats.Option{}
	for _, role := range allRoles {
		opts[role] = []nats.Option{nats.UserInfo(role, pw[role])}
	}
	deploy := newDeployTool()
	s := startSecuredWith(t, srv.ClientURL(), opts, matrixModel(), deploy.tool(), holdUntilDone(make(chan string, 16)))

	m := telemetry.New()
	m.Observer("executor").Serving(nil)
	m.WatchPermissions(s.buses["executor"], testLogger())
	h := httptest.NewServer(m.Handler(nil))
	t.Cleanup(h.Close)
	readyz := func() (int, string) {
		resp, err := http.Get(h.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before any violation: %d %s", code, body)
	}

	const missing = "$JS.API.DIRECT.GET.KV_toolbus_approvals"
	start := time.Now()
	s.start("approve-denied", toolbus.Limits{})
	ended := s.waitOutcome("approve-denied", toolbus.RunFailed)
	t.Logf("the run failed %v after it started: %s", time.Since(start).Round(time.Millisecond), ended.Reason)
	if ended.Code != toolbus.CodePermissionDenied {
		t.Fatalf("outcome %+v, want failed/permission_denied", ended)
	}
	r := s.result("approve-denied", "d")
	if r.Status != toolbus.StatusFailed || r.Code() != toolbus.CodePermissionDenied || !strings.Contains(r.Error.Message, missing) {
		t.Fatalf("result %+v, want failed/permission_denied naming %s", r, missing)
	}
	if r.Attempt > 1 {
		t.Fatalf("the call was delivered %d times: a permission error is not retried", r.Attempt)
	}
	if n := deploy.total(); n != 0 {
		t.Fatalf("the tool ran %d times without its approval being read", n)
	}
	code, body := readyz()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, missing) {
		t.Fatalf("/readyz after the violation: %d %s, want 503 naming %s", code, body, missing)
	}
	if v := counterValue(t, m, telemetry.MetricPermissionDenied); v < 1 {
		t.Fatalf("%s = %v, want at least 1", telemetry.MetricPermissionDenied, v)
	}
}

// The planner and the injector do not stall on a permission their credentials miss
// either: each ends the run at once as failed/permission_denied, with a reason naming the
// missing subject. The planner here may not record the assistant message (the history
// bucket), the injector may not ask for a step (model.requested).
func TestRolesPlannerInjectorPermissionDenied(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		role, block, section, next, run, missing string
	}{
		{"planner", "PLANNER = {", `"$KV.toolbus_history.>"`, "EXECUTOR = {", "plain-planner-denied", "$KV.toolbus_history."},
		{"injector", "INJECTOR = {", `"toolbus.*.model.requested"`, "CLIENT = {", "plain-injector-denied", ".model.requested"},
	} {
		t.Run(c.role, func(t *testing.T) {
			dir := t.TempDir()
			conf := readDeployFile(t, "permissions.conf")
			i0, i1 := strings.Index(conf, c.block), strings.Index(conf, c.next)
			var kept []string
			for _, line := range strings.Split(conf[i0:i1], "\n") {
				if strings.TrimSpace(line) != c.section {
					kept = append(kept, line)
				}
			}
			if len(kept) == len(strings.Split(conf[i0:i1], "\n")) {
				t.Fatalf("%s has no %s to take away", c.block, c.section)
			}
			writeFile(t, dir, "permissions.conf", []byte(conf[:i0]+strings.Join(kept, "\n")+conf[i1:]))
			for _, f := range []string{"auth-users.conf", "single.conf"} {
				writeFile(t, dir, f, []byte(readDeployFile(t, f)))
			}
			pw, vars := newPasswords()
			srv := startConfigured(t, filepath.Join(dir, "auth-users.conf"), vars)
			opts := map[string][]nats.Option{}
			for _, role := range allRoles {
				opts[role] = []nats.Option{nats.UserInfo(role, pw[role])}
			}
			s := startSecuredWith(t, srv.ClientURL(), opts, matrixModel())
			start := time.Now()
			s.start(c.run, toolbus.Limits{})
			ended := s.waitOutcome(c.run, toolbus.RunFailed)
			t.Logf("the run failed %v after it started: %s", time.Since(start).Round(time.Millisecond), ended.Reason)
			if ended.Code != toolbus.CodePermissionDenied || !strings.Contains(ended.Reason, c.missing) || !strings.Contains(ended.Reason, c.role) {
				t.Fatalf("outcome %+v, want failed/permission_denied naming the %s and %s", ended, c.role, c.missing)
			}
			if !strings.Contains(strings.Join(s.viol.of(c.role), "\n"), c.missing) {
				t.Fatalf("no violation of the %s on %s: %v", c.role, c.missing, s.viol.all())
			}
		})
	}
}

func readDeployFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", "nats", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// counterValue reads a counter without labels from the metrics' registry.
func counterValue(t *testing.T, m *telemetry.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// Readers cannot exhaust shared limits: readers create no consumer (direct gets), the
// client and the planner may create none, and `toolbus init` bounds every stream where
// a consumer could still be made. With every such stream filled to its limit (the read
// mirror by the executor role, which may still create consumers there, the buckets by
// the admin), a restarting planner and `toolbus mcp` still read the catalog, the client
// still lists runs and tools, follows and reads runs, and a run completes.
func TestRolesReadersCannotExhaustConsumers(t *testing.T) {
	t.Parallel()
	kind := credentialKinds()[0]
	url, opts := kind.start(t)
	s := startSecured(t, url, opts)
	admin := s.buses["admin"]
	fill := map[string]*events.Bus{
		events.ReadMirrorName(events.DefaultStream): s.buses["executor"],
		"KV_" + store.BucketTools:                   admin,
		"KV_" + store.BucketInstances:               admin,
		"KV_" + store.BucketRuns:                    admin,
	}
	for name, by := range fill {
		st, err := admin.JetStream().Stream(s.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		if c.MaxConsumers != provision.ReaderMaxConsumers || c.ConsumerLimits.InactiveThreshold != provision.ReaderConsumerInactive {
			t.Fatalf("%s: max_consumers %d, inactive threshold %v: toolbus init sets %d and %v", name,
				c.MaxConsumers, c.ConsumerLimits.InactiveThreshold, provision.ReaderMaxConsumers, provision.ReaderConsumerInactive)
		}
		// Full is full: the admin lowers the limit to what the stream holds plus a few
		// (4,000 consumer creates under -race took a minute and a half), then the role
		// fills it to the limit.
		const room = 16
		info, err := st.Info(s.ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.MaxConsumers = info.State.Consumers + room
		if _, err := admin.JetStream().UpdateStream(s.ctx, c); err != nil {
			t.Fatalf("%s: lower max_consumers: %v", name, err)
		}
		for i := 0; ; i++ {
			_, err := by.JetStream().CreateConsumer(s.ctx, name, jetstream.ConsumerConfig{Durable: fmt.Sprintf("fill_%d", i), AckPolicy: jetstream.AckNonePolicy})
			if err != nil {
				if !strings.Contains(err.Error(), "maximum consumers limit reached") {
					t.Fatalf("%s: consumer %d: %v", name, i, err)
				}
				if i != room {
					t.Fatalf("%s full after %d consumers, want %d", name, i, room)
				}
				break
			}
		}
	}
	if v := s.viol.all(); len(v) > 0 {
		t.Fatalf("violations while filling: %v", v)
	}
	// A planner that starts now, and `toolbus mcp` (client credentials), read the catalog.
	for _, role := range []string{"planner", "client"} {
		cat, err := s.buses[role].Store().WatchCatalog(s.ctx, nil)
		if err != nil {
			t.Fatalf("%s reads the catalog with every reader stream full: %v", role, err)
		}
		if _, ok := cat.Lookup("calculator"); !ok || len(cat.Tools(nil)) == 0 {
			t.Fatalf("%s: catalog without calculator: %+v", role, cat.Tools(nil))
		}
	}
	log := testLogger()
	cat, err := s.buses["planner"].Store().WatchCatalog(s.ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(s.ctx)
	done := make(chan error, 1)
	go func() {
		done <- must(planner.New(s.buses["planner"], secModel(), cat, planner.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "planner-2", Grace: time.Second, Logger: log}})).Run(pctx)
	}()
	t.Cleanup(func() { stop(); <-done })
	// Two planners now serve; the run completes and the client reads it every way.
	tail, err := runlog.Watch(s.ctx, s.buses["client"], events.FilterAll, false)
	if err != nil {
		t.Fatalf("client tails with every reader stream full: %v", err)
	}
	s.runOnce("full-1")
	s.clientReads("full-1")
	waitWatched(t, s.ctx, tail, "tail", events.SubjectRunEnded("full-1", toolbus.RunCompleted))
	if cs, err := s.buses["client"].Store().Contracts(s.ctx); err != nil || len(cs) == 0 {
		t.Fatalf("client lists tools: %v %d", err, len(cs))
	}
	if ins, err := s.buses["client"].Store().Instances(s.ctx); err != nil || len(ins) == 0 {
		t.Fatalf("client lists instances: %v %d", err, len(ins))
	}
}

// The planner learns ends from the outcome events and the run states' writes (core
// NATS): with the shipped credentials, the planner may follow both; an executor may not
// follow the run states' writes (the follower says so, and a worker then reads run
// states) nor write one: a terminal run state an executor forges for someone's run is
// refused by the server, and the run goes on and completes.
func TestRolesRunStateWritesFollowed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, f := range []string{"permissions.conf", "auth-users.conf", "single.conf"} {
		writeFile(t, dir, f, []byte(readDeployFile(t, f)))
	}
	pw, vars := newPasswords()
	srv := startConfigured(t, filepath.Join(dir, "auth-users.conf"), vars)
	opts := map[string][]nats.Option{}
	for _, role := range allRoles {
		opts[role] = []nats.Option{nats.UserInfo(role, pw[role])}
	}
	s := startSecuredWith(t, srv.ClientURL(), opts, matrixModel())

	listen := func(role string) error {
		t.Helper()
		seen := &violations{}
		nc, err := connectAs(t, srv.ClientURL(), role, seen, opts[role]...)
		if err != nil {
			t.Fatal(err)
		}
		bus, err := events.Open(s.ctx, nc, events.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ends := follow.Outcomes(bus)
		ends.FollowRunStates()
		defer ends.Close()
		return ends.Listen(s.ctx)
	}
	if err := listen("planner"); err != nil {
		t.Fatalf("the planner follows run ends: %v", err)
	}
	if err := listen("executor"); !errors.Is(err, follow.ErrNoOutcomeSubscription) {
		t.Fatalf("an executor follows the run states' writes: %v, want ErrNoOutcomeSubscription", err)
	}

	const run = "plain-forged-end"
	s.start(run, toolbus.Limits{})
	seen := &violations{}
	nc, err := connectAs(t, srv.ClientURL(), "executor", seen, opts["executor"]...)
	if err != nil {
		t.Fatal(err)
	}
	subject := "$KV." + store.BucketRuns + "." + run
	forged := []byte(`{"run_id":"` + run + `","status":"failed","step":0}`)
	if err := publishAndFlush(s.ctx, nc, subject, forged, nil); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 15*time.Second, func() error {
		if !seen.has("executor", subject) {
			return fmt.Errorf("no permissions violation on %s (got %v)", subject, seen.all())
		}
		return nil
	})
	if ended := s.waitOutcome(run, toolbus.RunCompleted); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
}
