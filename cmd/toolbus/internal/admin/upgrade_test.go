package admin

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// upgradeFixture is a deployment the last version before the write service (commit
// 9c054fc) made with toolbus admin init, add-team alpha calc and add-client alice alice
// (its README says how): the accounts layout with a memory resolver.
const upgradeFixture = "testdata/upgrade-9c054fc"

// TestUpgradeFrom9c054fc runs docs/deployment-and-security.md's "Upgrading to the write
// service" as written on a copy of upgradeFixture, served as the previous version left
// it (an in-process server on its auth-jwt.conf, the core set up by toolbus init).
// Before: team alpha's result and claim are stored straight from its account and a
// roll-up of its own key is stored too. Then the block: toolbus admin push (the CLI's
// Main), the reload (the server's ReloadOptions on the rewritten auth-jwt.conf) and the
// injector restarted with the new injector.creds (its write service, as the injector
// runs it). After, with alpha's and alice's credential files as the old version wrote
// them (alpha's connection open since before the push; alice's account unused until
// then, so the memory resolver takes it only from the reload): alpha's result and claim
// and alice's start are stored through the write service, and alpha's roll-up is
// refused by it.
func TestUpgradeFrom9c054fc(t *testing.T) {
	lines := docBlock(t, filepath.Join("..", "..", "..", "..", "docs", "deployment-and-security.md"), "upgrade-write-service")
	ctx := eventstest.Context(t, time.Minute)
	l := newLiveAdmin(t, ctx)
	copyTree(t, upgradeFixture, l.dir)
	opts, err := server.ProcessConfigFile(filepath.Join(l.dir, "auth-jwt.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := opts.AccountResolver.(*server.MemAccResolver); !ok {
		t.Fatalf("the fixture's resolver is %T, want the memory resolver of 9c054fc", opts.AccountResolver)
	}
	l.srv = eventstest.StartServer(t, opts)
	if _, _, err := provision.Setup(ctx, l.must("admin.creds"), events.Config{}, provision.WithTools([]string{"calc"}, 30*time.Second, 10)); err != nil {
		t.Fatal(err)
	}
	adminJS, err := jetstream.New(l.must("admin.creds"))
	if err != nil {
		t.Fatal(err)
	}
	alpha := l.must("executor-alpha.creds")
	alphaJS, err := jetstream.NewWithAPIPrefix(alpha, accounts.CoreAPIPrefix)
	if err != nil {
		t.Fatal(err)
	}
	w := upgradeWriter{t: t, js: alphaJS, admin: adminJS}

	// The old deployment: alpha writes straight to the core's streams, roll-ups too.
	w.stored(events.DefaultStream)(w.result("r1"))
	w.stored("KV_" + store.BucketClaims)(w.claim("r1", ""))
	w.stored("KV_" + store.BucketClaims)(w.claim("r1", "sub"))

	// The upgrade, as the note words it.
	svc := runUpgradeNote(t, l, opts, lines)
	for _, f := range []string{"executor-alpha.creds", "client-alice.creds"} {
		if !sameFile(t, filepath.Join(upgradeFixture, f), filepath.Join(l.dir, f)) {
			t.Errorf("%s changed: the note says the tenants' credential files do not", f)
		}
	}
	// The tenant accounts got the default limits (the old deployment.json names none).
	for _, f := range []string{"team-alpha.jwt", "account-client-alice.jwt"} {
		b, err := os.ReadFile(filepath.Join(l.dir, f))
		if err != nil {
			t.Fatal(err)
		}
		ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		if d := accounts.DefaultTenantLimits; ac.Limits.Conn != int64(d.Conns) || ac.Limits.Subs != int64(d.Subs) {
			t.Errorf("%s's limits after the push: %d connections, %d subscriptions, want %+v", f, ac.Limits.Conn, ac.Limits.Subs, d)
		}
	}

	// Alpha's connection from before, unchanged credentials: through the write service.
	w.svc = svc
	w.through(func() { w.stored(events.DefaultStream)(w.result("r2")) })
	w.through(func() { w.stored("KV_" + store.BucketClaims)(w.claim("r2", "")) })
	var apiErr *jetstream.APIError
	if _, err := w.claim("r2", "sub"); !errors.As(err, &apiErr) || apiErr.ErrorCode != events.WriteRefusedErrCode {
		t.Errorf("alpha's roll-up of its own claim after the upgrade: %v, want the write service's refusal (err_code %d)", err, events.WriteRefusedErrCode)
	}
	if m, err := w.lastOf("KV_"+store.BucketClaims, "$KV."+store.BucketClaims+"."+store.ClaimKey("calc", "r2", 1, "c1")); err != nil || !bytes.Contains(m.Data, []byte("alpha-1")) {
		t.Errorf("alpha's claim after the refused roll-up: %v, want alpha-1's (the roll-up not stored)", err)
		if m != nil {
			t.Logf("the claim holds %s", m.Data)
		}
	}
	if _, refused := svc.Counts(); refused != 1 {
		t.Errorf("the write service refused %d writes, want the roll-up", refused)
	}
	if alpha.Stats().Reconnects != 0 || alpha.IsClosed() {
		t.Error("alpha's connection did not stay through the upgrade")
	}
	// Alice's unchanged credentials start a run as alice, through the write service.
	aliceJS, err := jetstream.New(l.must("client-alice.creds"))
	if err != nil {
		t.Fatal(err)
	}
	w.last = events.SubjectRunStarted("r3", "alice")
	w.through(func() {
		w.stored(events.DefaultStream)(aliceJS.Publish(ctx, events.SubjectRunStarted("r3", "alice"), []byte(`{"run_id":"r3"}`)))
	})
}

// runUpgradeNote runs the lines of the note on l's deployment, whose server was
// started with opts: toolbus admin through Main, the reload as ReloadOptions of the
// rewritten auth-jwt.conf, the injector as the write service it runs on its
// credentials (returned). A line it does not know fails the test.
func runUpgradeNote(t *testing.T, l *liveAdmin, opts *server.Options, lines []string) *intake.Service {
	t.Helper()
	var svc *intake.Service
	url, ran := "", 0
	for _, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ran++
		switch {
		case strings.HasPrefix(line, "export TOOLBUS_NATS_URL="):
			url = l.srv.ClientURL()
		case strings.HasPrefix(line, "toolbus admin "):
			out := l.adm(url, withoutDir(t, strings.Fields(strings.TrimPrefix(line, "toolbus admin ")))...)
			for _, want := range []string{"changed   account TOOLBUS: pushed", "changed   account of team alpha: pushed",
				"reload needed: the running servers have not loaded account of client alice (no connection has used it since they started)",
				"hand to the holders of injector:",
				"unchanged (files byte for byte as they were): admin, planner, executor, client, executor-alpha, client-alice"} {
				if !strings.Contains(out, want) {
					t.Errorf("%s does not say %q:\n%s", line, want, out)
				}
			}
		case strings.HasPrefix(line, "kill -HUP "):
			newOpts, err := server.ProcessConfigFile(filepath.Join(l.dir, "auth-jwt.conf"))
			if err != nil {
				t.Fatal(err)
			}
			newOpts.Host, newOpts.Port, newOpts.HTTPHost, newOpts.HTTPPort = opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort
			newOpts.StoreDir, newOpts.NoLog, newOpts.NoSigs = opts.StoreDir, true, true
			if err := l.srv.ReloadOptions(newOpts); err != nil {
				t.Fatalf("reload: %v", err)
			}
		case line == "TOOLBUS_NATS_CREDS=tb/injector.creds toolbus injector":
			// What the injector runs of it: the write service on its connection.
			svc = intaketest.ServeIntake(t, l.must("injector.creds"), intake.Limits{})
		default:
			t.Fatalf("a line of the note this test does not run: %s", line)
		}
	}
	if ran != 4 || svc == nil {
		t.Fatalf("ran %d lines of the note (injector %v): want export, push, reload, injector", ran, svc != nil)
	}
	return svc
}

// upgradeWriter writes as a team's executor does, on js, and checks with admin what
// the core's streams hold.
type upgradeWriter struct {
	t     *testing.T
	js    jetstream.JetStream
	admin jetstream.JetStream
	svc   *intake.Service // the write service once it runs
	last  string          // the subject of the last write
}

// result publishes a result of calc in run.
func (w *upgradeWriter) result(run string) (*jetstream.PubAck, error) {
	subject := events.SubjectToolFinished(run, "calc")
	w.last = subject
	return w.js.Publish(w.t.Context(), subject, []byte(`{"run_id":"`+run+`"}`))
}

// claim creates alpha's claim of a call of calc in run (a compare-and-set on no
// revision, as store.ClaimCall), or with rollup (a Nats-Rollup value) writes over it.
func (w *upgradeWriter) claim(run, rollup string) (*jetstream.PubAck, error) {
	subject := "$KV." + store.BucketClaims + "." + store.ClaimKey("calc", run, 1, "c1")
	w.last = subject
	m := nats.NewMsg(subject)
	m.Data = []byte(`{"instance":"alpha-1","attempt":1}`)
	var opts []jetstream.PublishOpt
	if rollup != "" {
		m.Header.Set("Nats-Rollup", rollup)
		m.Data = []byte(`{"instance":"rolled-up","attempt":1}`)
	} else {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(0))
	}
	return w.js.PublishMsg(w.t.Context(), m, opts...)
}

// stored checks a publish of the last write: it fails the test unless stream
// acknowledged it and, once the write service runs, the core reads it back (a direct
// get: only after the reload, for nats-server 2.15.2 reads its options unlocked in a
// direct get, which the race detector reports against a later reload).
func (w *upgradeWriter) stored(stream string) func(*jetstream.PubAck, error) {
	return func(ack *jetstream.PubAck, err error) {
		w.t.Helper()
		if err != nil || ack.Stream != stream {
			w.t.Fatalf("%s: %v %v, want stored in %s", w.last, ack, err, stream)
		}
		if w.svc == nil {
			return
		}
		if _, err := w.lastOf(stream, w.last); err != nil {
			w.t.Errorf("%s is not in %s: %v", w.last, stream, err)
		}
	}
}

// lastOf is the last message of subject in stream.
func (w *upgradeWriter) lastOf(stream, subject string) (*jetstream.RawStreamMsg, error) {
	s, err := w.admin.Stream(w.t.Context(), stream)
	if err != nil {
		return nil, err
	}
	return s.GetLastMsgForSubject(w.t.Context(), subject)
}

// through runs write and fails the test unless the write service admitted it.
func (w *upgradeWriter) through(write func()) {
	w.t.Helper()
	before, _ := w.svc.Counts()
	write()
	// The service counts a write once it forwarded it, in its own goroutine: the
	// acknowledgement it relays may come first.
	eventstest.Eventually(w.t, 5*time.Second, func() error {
		if after, _ := w.svc.Counts(); after != before+1 {
			return fmt.Errorf("the write service admitted %d writes of %s, want 1: the write went past it", after-before, w.last)
		}
		return nil
	})
}

// withoutDir is args with the note's -dir tb taken out (liveAdmin.adm gives its own).
func withoutDir(t *testing.T, args []string) []string {
	t.Helper()
	for i, a := range args {
		if a == "-dir" && i+1 < len(args) && args[i+1] == "tb" {
			return append(args[:i:i], args[i+2:]...)
		}
	}
	t.Fatalf("toolbus admin %v: no -dir tb", args)
	return nil
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	ba, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ba, bb)
}

// copyTree copies the directory from into to (made), every file 0600 as init writes.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}
