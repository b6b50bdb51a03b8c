package admin

import (
	"context"
	"fmt"

	"errors"
	"github.com/nats-io/nats.go"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// New tenants on a live deployment in operator mode (the accounts layout, the
// generated auth-jwt.conf on an in-process server that is never reloaded): add-team
// gamma -push and add-client carol -push. With the full resolver toolbus admin init
// writes, the push stores the new accounts: gamma's executor credentials connect at once
// and use their imports (consumer info and a pull of web's queue, the ack, a result
// published through the import and acknowledged by the core's stream), team alpha's
// running connection cannot reach web's queue nor publish its result, and carol starts
// a run as carol. With -memory-resolver (the control, what auth-jwt.conf had before)
// the same push skips the new accounts and says a reload is needed: gamma and carol are
// refused until one.
func TestAdminNewTenantsNeedNoReload(t *testing.T) {
	for _, tc := range []struct {
		name string
		init []string
		full bool
	}{
		{name: "full resolver", full: true},
		{name: "memory resolver", init: []string{"-memory-resolver"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := eventstest.Context(t, time.Minute)
			l := newLiveAdmin(t, ctx)
			adm, connect, must := l.adm, l.connect, l.must
			adm("", append([]string{"init"}, tc.init...)...)
			adm("", "add-team", "alpha", "calc")
			srv, opts := l.serve(provision.WithTools([]string{"calc", "web"}, 30*time.Second, 10))
			if _, ok := opts.AccountResolver.(*server.DirAccResolver); ok != tc.full {
				t.Fatalf("auth-jwt.conf's resolver is %T", opts.AccountResolver)
			}
			loaded := srv.ConfigTime()
			url := srv.ClientURL()
			adminNC := must("admin.creds")
			alpha := must("executor-alpha.creds")
			alphaJS, err := jetstream.NewWithAPIPrefix(alpha, "JS.core.API")
			if err != nil {
				t.Fatal(err)
			}
			if err := probeQueue(ctx, alpha, "calc"); err != nil {
				t.Fatalf("alpha's own queue (the control): %v", err)
			}

			out := adm(url, "add-team", "gamma", "web", "-push") + adm(url, "add-client", "carol", "carol", "-push")
			if !tc.full {
				for _, want := range []string{"reload needed: the running servers have not loaded account of team gamma (new)",
					"reload needed: the running servers have not loaded account of client carol (new)"} {
					if !strings.Contains(out, want) {
						t.Errorf("-push with a memory resolver does not say %q:\n%s", want, out)
					}
				}
				for _, creds := range []string{"executor-gamma.creds", "client-carol.creds"} {
					if nc, err := connect(creds); err == nil {
						nc.Close()
						t.Errorf("%s connects with a memory resolver and no reload", creds)
					}
				}
				return
			}
			for _, want := range []string{"new       account of team gamma: pushed to the running servers; hand out its users' files",
				"new       account of client carol: pushed to the running servers; hand out its users' files"} {
				if !strings.Contains(out, want) {
					t.Errorf("-push does not say %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "reload needed") || strings.Contains(out, "kill -HUP") {
				t.Errorf("-push with a full resolver asks for a reload in operator mode:\n%s", out)
			}

			// Gamma's executors, on the credentials add-team printed: a call of web
			// queued by the core, pulled and acknowledged through gamma's imports, and
			// its result stored in the core's stream.
			adminJS, err := jetstream.New(adminNC)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := adminJS.Publish(ctx, events.SubjectToolRequested("r1", "web"), []byte(`{"run_id":"r1"}`)); err != nil {
				t.Fatalf("the core queues a call of web: %v", err)
			}
			gamma := must("executor-gamma.creds")
			gammaJS, err := jetstream.NewWithAPIPrefix(gamma, "JS.core.API")
			if err != nil {
				t.Fatal(err)
			}
			// A team pulls its queue by name (no consumer info: events/teamqueue).
			m, err := gamma.RequestWithContext(ctx, queueNext("web"), []byte(`{"batch":1,"expires":5000000000}`))
			if err != nil || m.Header.Get("Status") != "" {
				t.Fatalf("gamma pulls web's queue through its import: %v %v", err, m)
			}
			if events.CallSubject(m.Subject, m.Header) != events.SubjectToolRequested("r1", "web") {
				t.Errorf("gamma pulled %s", m.Subject)
			}
			if _, err := gamma.RequestWithContext(ctx, m.Reply, []byte("+ACK")); err != nil {
				t.Errorf("gamma acknowledges the call: %v", err)
			}
			ack, err := gammaJS.Publish(ctx, events.SubjectToolFinished("r1", "web"), []byte(`{"run_id":"r1"}`))
			if err != nil || ack.Stream != events.DefaultStream {
				t.Fatalf("gamma's result through its import: %v %v", ack, err)
			}

			// Another team's connection reaches none of it.
			if err := probeQueue(ctx, alpha, "web"); err == nil {
				t.Error("alpha reaches gamma's queue of web")
			}
			if _, err := alphaJS.Publish(ctx, events.SubjectToolFinished("r2", "web"), []byte(`{"run_id":"r2"}`)); err == nil {
				t.Error("alpha's result of web is stored")
			}
			stream, err := adminJS.Stream(ctx, events.DefaultStream)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := stream.GetLastMsgForSubject(ctx, events.SubjectToolFinished("r2", "web")); !errors.Is(err, jetstream.ErrMsgNotFound) {
				t.Errorf("alpha's result of web in the core's stream: %v", err)
			}

			// Carol's client, on the credentials add-client printed, starts a run as carol.
			carolJS, err := jetstream.New(must("client-carol.creds"))
			if err != nil {
				t.Fatal(err)
			}
			if ack, err := carolJS.Publish(ctx, events.SubjectRunStarted("r3", "carol"), []byte(`{}`)); err != nil || ack.Stream != events.DefaultStream {
				t.Fatalf("carol starts a run: %v %v", ack, err)
			}
			if !srv.ConfigTime().Equal(loaded) || alpha.Stats().Reconnects != 0 || alpha.IsClosed() {
				t.Error("the server reloaded, or alpha's connection did not stay")
			}
		})
	}
}

// init's resolver: a full one in the accounts layout, its directory under -store, else
// under -dir, or where -resolver-dir says; a memory one with -memory-resolver and
// -one-account, which take no -resolver-dir.
func TestInitResolver(t *testing.T) {
	base := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string // the full resolver's directory; "": a memory resolver
		code int
	}{
		{name: "default", want: filepath.Join(base, "default", "d", ResolverSubdir)},
		{name: "store", args: []string{"-store", filepath.Join(base, "data")}, want: filepath.Join(base, "data", ResolverSubdir)},
		{name: "resolver-dir", args: []string{"-resolver-dir", filepath.Join(base, "jwt")}, want: filepath.Join(base, "jwt")},
		{name: "memory", args: []string{"-memory-resolver"}},
		{name: "one account", args: []string{"-one-account"}},
		{name: "one account with a dir", args: []string{"-one-account", "-resolver-dir", base}, code: 2},
		{name: "memory with a dir", args: []string{"-memory-resolver", "-resolver-dir", base}, code: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(base, tc.name, "d")
			code, out, errOut := admin(t, append([]string{"init", "-dir", dir}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, out, errOut)
			}
			if code != 0 {
				return
			}
			d, err := open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if d.settings.ResolverDir != tc.want {
				t.Errorf("deployment.json's resolver_dir %q, want %q", d.settings.ResolverDir, tc.want)
			}
			opts, err := server.ProcessConfigFile(filepath.Join(dir, "auth-jwt.conf"))
			if err != nil {
				t.Fatal(err)
			}
			switch r := opts.AccountResolver.(type) {
			case *server.DirAccResolver:
				// Parsing the config opens (makes) the directory.
				if fi, err := os.Stat(tc.want); tc.want == "" || err != nil || !fi.IsDir() {
					t.Errorf("a full resolver, want %q: %v", tc.want, err)
				}
				if !strings.Contains(out, "has a full resolver: the server stores the account JWTs in "+tc.want) {
					t.Errorf("init does not say where the resolver stores:\n%s", out)
				}
			case *server.MemAccResolver:
				if tc.want != "" {
					t.Errorf("a memory resolver, want a full one in %s", tc.want)
				}
			default:
				t.Errorf("resolver %T", r)
			}
		})
	}
}

// queueNext is the pull subject of a tool's queue as a team account imports it.
func queueNext(tool string) string {
	return "JS.core.API.CONSUMER.MSG.NEXT." + events.QueueStreamName(events.DefaultStream) + "." + events.ToolConsumer(tool)
}

// probeQueue pulls nothing from a tool's queue (no_wait, one byte): nil when the queue
// answers (404 or 409), an error when nobody does (no import, or no queue).
func probeQueue(ctx context.Context, nc *nats.Conn, tool string) error {
	m, err := nc.RequestWithContext(ctx, queueNext(tool), []byte(`{"batch":1,"max_bytes":1,"no_wait":true}`))
	if err != nil {
		return err
	}
	if st := m.Header.Get("Status"); st != "404" && st != "409" {
		return fmt.Errorf("queue of %s answered %s %s", tool, st, m.Header.Get("Description"))
	}
	return nil
}
