package admin

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// liveAdmin is a deployment toolbus admin keeps in dir and, once serve ran, the
// in-process server of its auth-jwt.conf with the core set up and the injector's write
// service running on the generated credentials.
type liveAdmin struct {
	t   *testing.T
	ctx context.Context
	dir string
	srv *server.Server
}

func newLiveAdmin(t *testing.T, ctx context.Context) *liveAdmin {
	return &liveAdmin{t: t, ctx: ctx, dir: filepath.Join(t.TempDir(), "d")}
}

// adm runs toolbus admin args on the deployment (url: the server to push to) and
// returns what it printed; a non-zero exit fails the test.
func (l *liveAdmin) adm(url string, args ...string) string {
	l.t.Helper()
	var out, errOut bytes.Buffer
	if code := Main(l.ctx, append(args, "-dir", l.dir), url, &out, &errOut); code != 0 {
		l.t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errOut.String())
	}
	return out.String()
}

// serve starts the server of the deployment's auth-jwt.conf, sets the core up as
// toolbus init does (with setup's options) with admin.creds, and runs the write service
// with injector.creds; it returns the server and the options it was started with.
func (l *liveAdmin) serve(setup ...provision.Option) (*server.Server, *server.Options) {
	l.t.Helper()
	opts, err := server.ProcessConfigFile(filepath.Join(l.dir, "auth-jwt.conf"))
	if err != nil {
		l.t.Fatal(err)
	}
	l.srv = eventstest.StartServer(l.t, opts)
	if _, _, err := provision.Setup(l.ctx, l.must("admin.creds"), events.Config{}, setup...); err != nil {
		l.t.Fatal(err)
	}
	// The injector's write service: tenants' writes reach the core through it.
	intaketest.ServeIntake(l.t, l.must("injector.creds"), intake.Limits{})
	return l.srv, opts
}

// connect connects with a credentials file: a name in the deployment's directory, or
// a path.
func (l *liveAdmin) connect(creds string) (*nats.Conn, error) {
	if !filepath.IsAbs(creds) {
		creds = filepath.Join(l.dir, creds)
	}
	return nats.Connect(l.srv.ClientURL(), nats.UserCredentials(creds), nats.NoReconnect(), nats.Timeout(5*time.Second))
}

// must is connect for the test (closed when it ends); an error fails the test.
func (l *liveAdmin) must(creds string) *nats.Conn {
	l.t.Helper()
	nc, err := l.connect(creds)
	if err != nil {
		l.t.Fatalf("connect with %s: %v", filepath.Base(creds), err)
	}
	l.t.Cleanup(nc.Close)
	return nc
}
