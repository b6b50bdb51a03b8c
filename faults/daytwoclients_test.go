package faults_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/events"
)

// clientDayTwo is the clients' part of checkDayTwoDisturbsNobody, run while team alpha's
// loop runs: the administrator adds client carol, rotates its user and removes it, each
// with -push as docs/commands.md writes them (no reload). Each command pushes carol's
// account only; carol's credentials work at once (a call of append_a and its replay as
// carol: the control), the rotated ones too while the old file is refused, and after
// remove-client the last file is refused. Each of carol's calls ran once, at its first
// delivery. It returns the commands' output.
func clientDayTwo(t *testing.T, e *env, admin func(...string) string, toolbusBin, url, genDir, sideEffects string) string {
	t.Helper()
	credsFile := filepath.Join(genDir, "client-carol.creds")
	cli := func(args ...string) (string, int) {
		t.Helper()
		p := startProc(t, e.dir, "carol-"+args[0]+"-"+args[len(args)-1], toolbusBin, args, []string{"TOOLBUS_NATS_URL=" + url,
			"TOOLBUS_NATS_CREDS=" + credsFile, "TOOLBUS_NATS_READ_PREFIX=" + events.ReadAPIPrefix("carol"), "USER=carol"})
		p.expect()
		select {
		case <-p.done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("toolbus %s as client-carol did not end:\n%s", strings.Join(args, " "), p.logTail(20))
		}
		return p.logText(), p.cmd.ProcessState.ExitCode()
	}
	works := func(run string) {
		t.Helper()
		if out, code := cli("call", "--id", run, "append_a", `{"ms":1}`); code != 0 {
			t.Fatalf("toolbus call as client-carol (%s): exit %d:\n%s", run, code, out)
		}
		if out, code := cli("replay", run); code != 0 || !strings.Contains(out, "append_a") {
			t.Errorf("toolbus replay of %s as client-carol: exit %d:\n%s", run, code, out)
		}
	}
	// connect is nil when the file's user connects; refused polls until the server refuses it.
	connect := func(file string) error {
		nc, err := nats.Connect(url, nats.UserCredentials(file), nats.NoReconnect(), nats.Timeout(5*time.Second))
		if err == nil {
			nc.Close()
		}
		return err
	}
	refused := func(what, file string) {
		t.Helper()
		e.eventually(what+" refused", 30*time.Second, func() error {
			err := connect(file)
			if err == nil {
				return errors.New("it still connects")
			}
			if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				return err
			}
			return nil
		})
	}
	saved := func(name string) string {
		t.Helper()
		p := filepath.Join(e.dir, name)
		if err := os.WriteFile(p, readFile(t, credsFile), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	onlyCarol := func(cmd, out string) {
		t.Helper()
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if !strings.Contains(l, ": pushed") {
				continue
			}
			if n++; !strings.Contains(l, "account of client carol: pushed") {
				t.Errorf("%s pushed another account than carol's: %q", cmd, l)
			}
		}
		if n == 0 || strings.Contains(out, "reload needed") {
			t.Errorf("%s did not push carol's account alone, with no reload:\n%s", cmd, out)
		}
	}

	out := admin("add-client", "-push", "carol", "carol")
	onlyCarol("add-client", out)
	works("carol-1")
	old := saved("client-carol-1.creds")
	o := admin("rotate", "client-carol", "-push")
	onlyCarol("rotate client-carol", o)
	out += o
	if bytes.Equal(readFile(t, old), readFile(t, credsFile)) {
		t.Fatalf("rotate client-carol left its credentials as they were")
	}
	refused("client-carol's credentials from before the rotation", old)
	works("carol-2")
	last := saved("client-carol-2.creds")
	if err := connect(last); err != nil {
		t.Fatalf("client-carol's rotated credentials (control): %v", err)
	}
	o = admin("remove-client", "carol", "-push")
	onlyCarol("remove-client", o)
	out += o
	refused("client-carol's credentials after remove-client", last)

	ran := scanLines(t, sideEffects)
	for _, run := range []string{"carol-1", "carol-2"} {
		switch key := run + "/0/" + callrun.CallID; {
		case len(ran[key]) != 1:
			t.Errorf("client-carol's call %s ran %d times", key, len(ran[key]))
		case strings.Fields(ran[key][0])[2] != "1":
			t.Errorf("client-carol's call %s was delivered again: %q", key, ran[key][0])
		}
	}
	return out
}
