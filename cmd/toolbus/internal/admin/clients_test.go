package admin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
)

// Clients in their own accounts, day two, on a running server in operator mode (the
// accounts layout), with each resolver: add-client -push writes only the new client's
// files and its account (the core's JWT not at all) and the server takes the new client
// at once (the full resolver) or after one reload (-memory-resolver); rotate -push changes only that client's credentials and its account, and
// cuts the old credentials at once; remove-client -push revokes the client (its
// connection is cut, its old credentials are refused) and no other client notices;
// remove-team -push cuts the team's executors the same way.
func TestAdminClientAccounts(t *testing.T) {
	for _, tc := range []struct {
		name string
		init []string
	}{{"full resolver", nil}, {"memory resolver", []string{"-memory-resolver"}}} {
		t.Run(tc.name, func(t *testing.T) { testClientAccounts(t, tc.init) })
	}
}

func testClientAccounts(t *testing.T, initArgs []string) {
	ctx := eventstest.Context(t, time.Minute)
	l := newLiveAdmin(t, ctx)
	adm, connect, must, dir := l.adm, l.connect, l.must, l.dir
	adm("", append([]string{"init"}, initArgs...)...)
	adm("", "add-team", "alpha", "calc")
	adm("", "add-client", "alice", "alice")
	srv, opts := l.serve()
	url := srv.ClientURL()
	start := func(nc *nats.Conn, id, run string) {
		t.Helper()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if ack, err := js.Publish(ctx, events.SubjectRunStarted(run, id), []byte(`{}`)); err != nil || ack.Stream != events.DefaultStream {
			t.Fatalf("%s starts %s: %v %v", id, run, ack, err)
		}
	}
	refused := func(creds, who string) {
		t.Helper()
		eventstest.Eventually(t, 10*time.Second, func() error {
			if nc, err := connect(creds); err == nil {
				nc.Close()
				return &testError{who + " still connects"}
			}
			return nil
		})
	}
	keep := func(name string) string { // a copy of a user's credentials as they are now
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name+".creds"))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), name+".creds")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	changed := func(before map[string][]byte, want ...string) {
		t.Helper()
		got := slices.DeleteFunc(diff(before, files(t, dir)), func(f string) bool { return slices.Contains(configs, f) })
		if slices.Sort(want); !slices.Equal(got, want) {
			t.Errorf("changed files %v, want %v", got, want)
		}
	}
	alice := must(filepath.Join(dir, "client-alice.creds"))
	start(alice, "alice", "r1")
	alpha := must(filepath.Join(dir, "executor-alpha.creds"))
	oldAlpha := keep("executor-alpha")

	before := files(t, dir)
	out := adm(url, "add-client", "-push", "bob", "bob")
	changed(before, "account-client-bob.jwt", "account-client-bob.nk", "client-bob.creds")
	if _, full := opts.AccountResolver.(*server.DirAccResolver); full {
		if !strings.Contains(out, "new       account of client bob: pushed to the running servers") {
			t.Errorf("add-client -push does not say it pushed the new account:\n%s", out)
		}
	} else {
		if !strings.Contains(out, "reload needed: the running servers have not loaded account of client bob (new)") {
			t.Errorf("add-client -push does not say the new account needs a reload:\n%s", out)
		}
		refused(filepath.Join(dir, "client-bob.creds"), "bob, before the reload,")
		newOpts, err := server.ProcessConfigFile(filepath.Join(dir, "auth-jwt.conf"))
		if err != nil {
			t.Fatal(err)
		}
		newOpts.Host, newOpts.Port, newOpts.HTTPHost, newOpts.HTTPPort = opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort
		newOpts.StoreDir, newOpts.NoLog, newOpts.NoSigs = opts.StoreDir, true, true
		if err := srv.ReloadOptions(newOpts); err != nil {
			t.Fatalf("reload: %v", err)
		}
	}
	bob := must(filepath.Join(dir, "client-bob.creds"))
	start(bob, "bob", "r2")

	oldBob := keep("client-bob")
	before = files(t, dir)
	out = adm(url, "rotate", "-push", "client-bob")
	if !strings.Contains(out, "changed   account of client bob: pushed to the running servers") {
		t.Errorf("rotate -push does not say it pushed bob's account:\n%s", out)
	}
	changed(before, "account-client-bob.jwt", "client-bob.creds")
	eventstest.Eventually(t, 10*time.Second, func() error {
		if !bob.IsClosed() {
			return &testError{"bob's connection on the rotated credentials is not cut"}
		}
		return nil
	})
	refused(oldBob, "bob's rotated credentials")
	start(must(filepath.Join(dir, "client-bob.creds")), "bob", "r3")

	oldAlice := keep("client-alice")
	before = files(t, dir)
	out = adm(url, "remove-client", "-push", "alice")
	if !strings.Contains(out, "removed   account of client alice: pushed to the running servers, applied at once") {
		t.Errorf("remove-client -push does not say it pushed alice's account:\n%s", out)
	}
	changed(before, "account-client-alice.jwt", "client-alice.creds")
	eventstest.Eventually(t, 10*time.Second, func() error {
		if !alice.IsClosed() {
			return &testError{"alice's connection is not cut"}
		}
		return nil
	})
	refused(oldAlice, "removed alice")
	start(must(filepath.Join(dir, "client-bob.creds")), "bob", "r4")

	// A removed team likewise: its account stays, with no import and its user revoked,
	// so a push cuts its executors at once.
	out = adm(url, "remove-team", "-push", "alpha")
	if !strings.Contains(out, "removed   account of team alpha: pushed to the running servers, applied at once") {
		t.Errorf("remove-team -push does not say it pushed alpha's account:\n%s", out)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		if !alpha.IsClosed() {
			return &testError{"alpha's executor connection is not cut"}
		}
		return nil
	})
	refused(oldAlpha, "removed team alpha")
	start(must(filepath.Join(dir, "client-bob.creds")), "bob", "r5")
}
