package faults_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// walkthroughDoc is the tutorial TestWalkthroughAsWritten runs.
const walkthroughDoc = "../docs/walkthrough.md"

var shBlock = regexp.MustCompile("(?s)```sh\n(.*?)```")

// walkthroughScript is every sh block of the walkthrough, in order, as one script, with
// the three changes that let it run beside other tests: free ports for the server
// (4222; its monitoring port off), the MCP door (8930) and the console (8080). A trap
// prints each command that fails, with its status, as "FAILED <status>: <command>".
func walkthroughScript(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(walkthroughDoc)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range shBlock.FindAllStringSubmatch(string(b), -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) < 8 {
		t.Fatalf("%s has %d sh blocks: the walkthrough was not read", walkthroughDoc, len(blocks))
	}
	nats := strconv.Itoa(freePort(t))
	script := strings.NewReplacer(
		"127.0.0.1:4222", "127.0.0.1:"+nats,
		"toolbus server ", "toolbus server -p "+nats+" -m 0 ",
		"127.0.0.1:8930", "127.0.0.1:"+strconv.Itoa(freePort(t)),
		"127.0.0.1:8080", "127.0.0.1:"+strconv.Itoa(freePort(t)),
	).Replace(strings.Join(blocks, "\n"))
	return "trap 'echo \"FAILED $?: $BASH_COMMAND\"' ERR\n" + script
}

// TestWalkthroughAsWritten runs docs/walkthrough.md as written, every command a process
// of its own, from an empty directory with the toolbus binary on the PATH: the accounts
// layout with two teams and a client, the server, the core's roles and each team's
// executor on its own credentials; a run of the client calling both teams' tools stops
// for approval and completes once approved, and its replay holds the invariants; the
// same replay on a team's credentials is refused while the client's succeeds (its
// control); a tool's question is answered; the MCP door and the console on a client's
// credentials call a tool and show the run; day two adds a team, grants, rotates and
// revokes with -push while everything runs. The only commands that fail are the two the
// page says fail.
func TestWalkthroughAsWritten(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("the walkthrough uses curl, which is not installed")
	}
	_, toolbusBin, _ := binaries(t)
	work := t.TempDir()
	script := filepath.Join(t.TempDir(), "walkthrough.sh")
	if err := os.WriteFile(script, []byte(walkthroughScript(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Dir = work
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The script's background processes are in its process group: end them all.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	env := []string{"PATH=" + filepath.Dir(toolbusBin) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + work, "XDG_CONFIG_HOME=" + filepath.Join(work, ".config")}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "TOOLBUS_") && k != "PATH" && k != "HOME" {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	// A file, not a buffer: the background processes keep the script's output open, and
	// Run would wait for a pipe until they end.
	outFile := filepath.Join(t.TempDir(), "walkthrough.log")
	out, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	endGroup(t, cmd.Process.Pid)
	_ = out.Close()
	raw, rerr := os.ReadFile(outFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	log := string(raw)
	defer func() {
		if t.Failed() {
			t.Logf("the walkthrough's output:\n%s", log)
		}
	}()
	if err != nil {
		t.Fatalf("the walkthrough did not end: %v", err)
	}

	var failed []string
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(l, "FAILED ") {
			failed = append(failed, l)
		}
	}
	// The trap names a command of the helpdesk function by its body: the run, exit 3.
	want := []string{
		`FAILED 3: TOOLBUS_NATS_CREDS=tb/client-helpdesk.creds TOOLBUS_NATS_READ_PREFIX=toolbus_read.alice.API "$@"`,
		"FAILED 1: TOOLBUS_NATS_CREDS=tb/executor-search.creds toolbus replay inc-1",
	}
	if !slices.Equal(failed, want) {
		t.Errorf("the commands that failed:\n  %s\nwant only those the page says fail:\n  %s", strings.Join(failed, "\n  "), strings.Join(want, "\n  "))
	}
	// What each step shows, in the order the page shows it.
	steps := []string{
		"hand to the holders of executor-search:\nexecutor-search      tb/executor-search.creds\n",
		"created consumer tool_confirm",
		"decide restart: toolbus approve inc-1 restart",
		"approved call restart restart_service",
		"run inc-1: completed after 3 step(s)", // the replay: its head, then its timeline
		"lookup lookup_incident: succeeded",
		"restart restart_service: succeeded in",
		"(approved by alice)",
		"invariants: ok",
		"these credentials are a team's or a client's account, which holds no stream", // team search's replay
		"answer it: toolbus answer ask-1 call_0",
		`"confirmed": true`,
		`"toolbus/run_id":"mcp-`,
		`\"incident_id\":\"INC-002\"`,
		"\nrestart_service\n", // the console's page of inc-1
		"new       account of team billing: pushed to the running servers",
		`"value": 701`,
		`"slept_ms": 10`,
		"rotated   executor-search",
		`"incident_id": "INC-001"`,
		"catalog: sleep taken out",
	}
	at := 0
	for _, s := range steps {
		i := strings.Index(log[at:], s)
		if i < 0 {
			t.Fatalf("after %q the walkthrough does not show %q", log[max(0, at-80):at], s)
		}
		at += i + len(s)
	}
	// The last `toolbus tools` lists both teams' first tools and not the revoked one.
	table := log[at:]
	for _, tool := range []string{"lookup_incident", "restart_service", "confirm", "calculator"} {
		if !regexp.MustCompile(`(?m)^` + tool + ` `).MatchString(table) {
			t.Errorf("the catalog after the revocation does not list %s", tool)
		}
	}
	if regexp.MustCompile(`(?m)^sleep `).MatchString(table) {
		t.Error("the catalog after the revocation still lists sleep")
	}
}

// endGroup ends the script's background processes (its process group, pgid) and waits
// until none is left: a server still writing its store once the test ended failed the
// removal of the test's directory ("directory not empty"). What outlives SIGTERM by
// half a minute is killed.
func endGroup(t *testing.T, pgid int) {
	t.Helper()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		_ = syscall.Kill(-pgid, sig)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if !groupAlive(pgid) {
				return
			}
		}
		t.Logf("the walkthrough's processes outlived %v by 30 s", sig)
	}
}

// groupAlive reports whether a process of group pgid still runs. A zombie does not: its
// new parent may be slow to reap it, or never do.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false // none left (ESRCH)
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) > 2 && fields[0] != "Z" && fields[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}
