package admin

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/internal/testutil"
)

// docBlock is the first sh block after the anchor in the Markdown file, line by line.
func docBlock(t *testing.T, file, anchor string) []string {
	t.Helper()
	return strings.Split(strings.TrimSpace(docFence(t, file, anchor, "sh")), "\n")
}

// docFence is the first fenced block of language lang after the anchor in the Markdown
// file.
func docFence(t *testing.T, file, anchor, lang string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), `<a id="`+anchor+`"></a>`)
	if !ok {
		t.Fatalf("%s: no anchor %s", file, anchor)
	}
	m := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```").FindStringSubmatch(after)
	if m == nil {
		t.Fatalf("%s: no %s block after %s", file, lang, anchor)
	}
	return m[1]
}

// TestAdminDayTwoAsWritten runs docs/deployment-and-security.md's "Day two with toolbus
// admin" as written, in a new directory, with the binary: toolbus admin init (the
// accounts layout), add-team alpha, toolbus server on the generated auth-jwt.conf (a
// process), toolbus init with the admin's credentials, and toolbus admin grant -push.
// Two changes only, so that it runs beside other tests: a free port for 4222, and
// -m 0 for the server (the generated config's monitoring port is fixed). Team alpha's
// user is connected from the start of the server: before the grant it cannot reach
// newtool's queue, after the push that same connection (never reconnected) does, and
// the server was neither restarted nor reloaded. Beyond the block: a new team added
// with -push connects at once (the full resolver), and after a reload a team added
// without -push connects but a grant made without -push is not applied, until toolbus
// admin push.
func TestAdminDayTwoAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a server")
	}
	lines := docBlock(t, filepath.Join("..", "..", "..", "..", "docs", "deployment-and-security.md"), "day-two-admin")
	work := t.TempDir()
	bin := filepath.Join(t.TempDir(), "toolbus")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/toolbus/toolbus/cmd/toolbus").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	port := freePort(t)
	env := []string{"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + work, "XDG_CONFIG_HOME=" + filepath.Join(work, ".config")}
	ctx := eventstest.Context(t, 2*time.Minute)
	var server *exec.Cmd
	serverLog := &testutil.Buffer{}
	var alpha *nats.Conn
	// A team reaches a queue by its pulls (no consumer info: events/teamqueue): a pull
	// that takes nothing is answered 404 by a queue it reaches, "no responders" otherwise.
	newtool := "JS.core.API.CONSUMER.MSG.NEXT." + events.QueueStreamName(events.DefaultStream) + "." + events.ToolConsumer("newtool")
	probe := []byte(`{"batch":1,"max_bytes":1,"no_wait":true}`)
	ran := 0
	for _, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ran++
		line = strings.ReplaceAll(line, "127.0.0.1:4222", "127.0.0.1:"+strconv.Itoa(port))
		switch {
		case strings.HasPrefix(line, "export "):
			env = append(env, strings.TrimPrefix(line, "export "))
		case strings.HasSuffix(line, "&"):
			if !strings.HasPrefix(line, "toolbus server ") {
				t.Fatalf("a background line that is not the server: %s", line)
			}
			server = exec.Command("sh", "-c", "exec "+strings.TrimSpace(strings.TrimSuffix(line, "&"))+" -m 0")
			server.Dir, server.Env, server.Stderr = work, env, serverLog
			if err := server.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = server.Process.Signal(syscall.SIGTERM)
				_ = server.Wait()
				if t.Failed() {
					t.Logf("server log:\n%s", serverLog)
				}
			})
			// Team alpha's executor user, connected as its executors are.
			eventstest.Eventually(t, 30*time.Second, func() error {
				var err error
				alpha, err = nats.Connect("nats://127.0.0.1:"+strconv.Itoa(port), nats.UserCredentials(filepath.Join(work, "tb", "executor-alpha.creds")))
				return err
			})
			t.Cleanup(alpha.Close)
		default:
			if strings.Contains(line, "admin grant") {
				// The queue exists (toolbus init): alpha cannot reach it before the grant.
				if _, err := alpha.RequestWithContext(ctx, newtool, probe); err == nil {
					t.Fatalf("alpha reaches newtool's queue before the grant")
				}
			}
			out := shell(t, ctx, work, env, line)
			if strings.Contains(line, "admin grant") {
				for _, want := range []string{"changed   account of team alpha: pushed to the running servers, applied at once",
					"unchanged (files byte for byte as they were): admin, planner, injector, executor-alpha, account TOOLBUS"} {
					if !strings.Contains(out, want) {
						t.Errorf("grant -push does not say %q:\n%s", want, out)
					}
				}
			}
		}
	}
	if ran != 6 || server == nil || alpha == nil {
		t.Fatalf("ran %d lines of the block (server %v): want the 6 of init, add-team, server, export, init, grant", ran, server != nil)
	}
	// The same connection reaches newtool's queue: the push applied the grant.
	eventstest.Eventually(t, 10*time.Second, func() error {
		m, err := alpha.RequestWithContext(ctx, newtool, probe)
		if err != nil {
			return err
		}
		if st := m.Header.Get("Status"); st != "404" && st != "409" {
			return &testError{st + " " + m.Header.Get("Description")}
		}
		return nil
	})
	// Beyond the block: a new team pushed is taken at once (the full resolver stores its
	// account): its credentials connect and its import of the core's JetStream API
	// answers; a tool revoked with -push is taken from alpha's connection at once.
	out := shell(t, ctx, work, env, "toolbus admin add-team -dir tb gamma web -push")
	if !strings.Contains(out, "new       account of team gamma: pushed to the running servers") || strings.Contains(out, "reload needed") {
		t.Errorf("add-team -push does not say it pushed the new account:\n%s", out)
	}
	gamma, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(port), nats.UserCredentials(filepath.Join(work, "tb", "executor-gamma.creds")), nats.NoReconnect())
	if err != nil {
		t.Fatalf("gamma's credentials after add-team -push, with no reload: %v", err)
	}
	t.Cleanup(gamma.Close)
	// web has no queue yet (no toolbus init --tools web): its catalog entry's direct get
	// answers (not found) through the import.
	web := "JS.core.API.DIRECT.GET.KV_toolbus_tools.$KV.toolbus_tools.web"
	if _, err := gamma.RequestWithContext(ctx, web, nil); err != nil {
		t.Errorf("gamma's import of web's queue: %v", err)
	}
	shell(t, ctx, work, env, "toolbus admin revoke -dir tb alpha newtool -push")
	eventstest.Eventually(t, 10*time.Second, func() error {
		if _, err := alpha.RequestWithContext(ctx, newtool, probe); err == nil {
			return &testError{"alpha still reaches newtool's queue after the revoke"}
		}
		return nil
	})
	// The stream toolbus init made is where it was: the core account kept its key.
	if out := shell(t, ctx, work, env, "TOOLBUS_NATS_CREDS=tb/admin.creds toolbus runs"); strings.Contains(out, "does not exist") {
		t.Errorf("toolbus runs after the edits:\n%s", out)
	}
	if r := alpha.Stats().Reconnects; r != 0 {
		t.Errorf("alpha's connection reconnected %d times", r)
	}
	if server.ProcessState != nil || strings.Contains(strings.ToLower(serverLog.String()), "reloaded") {
		t.Errorf("the server exited or reloaded:\n%s", serverLog)
	}
	// A grant and a new team without -push, then a reload: the full resolver takes the
	// preload's new account (delta connects) but applies no changed one (nats-server
	// 2.15.2), so the edit says to push, and only the push gives gamma newtool's queue.
	out = shell(t, ctx, work, env, "toolbus admin grant -dir tb gamma newtool")
	if !strings.Contains(out, "changed   account of team gamma: push it (system.creds: toolbus admin push") {
		t.Errorf("grant without -push does not say to push:\n%s", out)
	}
	shell(t, ctx, work, env, "toolbus admin add-team -dir tb delta search")
	if err := server.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(strings.ToLower(serverLog.String()), "reloaded") {
			return &testError{"the server has not logged the reload"}
		}
		return nil
	})
	delta, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(port), nats.UserCredentials(filepath.Join(work, "tb", "executor-delta.creds")), nats.NoReconnect())
	if err != nil {
		t.Fatalf("delta's credentials after the reload: %v", err)
	}
	delta.Close()
	if _, err := gamma.Request(newtool, probe, time.Second); err == nil {
		t.Error("the reload gave gamma newtool's queue: the edit may say a reload applies it")
	}
	shell(t, ctx, work, env, "toolbus admin push -dir tb")
	eventstest.Eventually(t, 10*time.Second, func() error {
		m, err := gamma.RequestWithContext(ctx, newtool, probe)
		if err != nil {
			return err
		}
		if st := m.Header.Get("Status"); st != "404" && st != "409" {
			return &testError{st + " " + m.Header.Get("Description")}
		}
		return nil
	})
}

type testError struct{ s string }

func (e *testError) Error() string { return "consumer info: " + e.s }

// shell runs one line of the block with sh in dir: its output; a failure fails the test.
func shell(t *testing.T, ctx context.Context, dir string, env []string, line string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	return string(out)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
