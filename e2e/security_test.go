package e2e_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// Security: every role connects with its own credentials to a server that requires
// them, configured by the files of deploy/nats (loaded as they are, only the addresses
// and the store directory changed), and may publish only what its role publishes.

var secRoles = []string{"planner", "executor", "injector", "client"}

// startConfigured starts an embedded server from a deploy/nats config file on a random
// port of 127.0.0.1, with its store in a temp dir and no monitoring port.
func startConfigured(t *testing.T, file string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(filepath.Join("..", "deploy", "nats", file))
	if err != nil {
		t.Fatalf("deploy/nats/%s: %v", file, err)
	}
	return startSecServer(t, opts)
}

func startSecServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPHost, opts.HTTPPort = "", 0
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// violations records the permission errors the server sends to each connection.
type violations struct {
	mu   sync.Mutex
	list []string
}

func (v *violations) add(s string) {
	v.mu.Lock()
	v.list = append(v.list, s)
	v.mu.Unlock()
}

func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.list)
}

func (v *violations) of(role string) []string {
	var out []string
	for _, s := range v.all() {
		if strings.HasPrefix(s, role+": ") {
			out = append(out, s)
		}
	}
	return out
}

// connectAs connects as role with opts, recording permission violations.
func connectAs(t *testing.T, url, role string, v *violations, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	opts = append([]nats.Option{
		nats.Name("toolbus " + role), nats.Timeout(2 * time.Second), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if v != nil && strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				v.add(role + ": " + err.Error())
			}
		}),
	}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// secured is a pipeline whose roles each connect with their own credentials.
type secured struct {
	t     *testing.T
	ctx   context.Context
	viol  *violations
	conns map[string]*nats.Conn
	buses map[string]*events.Bus
	wg    sync.WaitGroup
	stop  context.CancelFunc
}

func secModel() planner.Model {
	return &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "calculator", `{"expression":"2+3"}`)),
		planner.Answer("done"),
	}}
}

// startSecured connects every role with its options and starts the planner, executor
// and injector; the client connection submits runs.
func startSecured(t *testing.T, url string, opts map[string][]nats.Option) *secured {
	t.Helper()
	ctx := eventstest.Context(t, 2*time.Minute)
	s := &secured{t: t, ctx: ctx, viol: &violations{}, conns: map[string]*nats.Conn{}, buses: map[string]*events.Bus{}}
	for _, role := range secRoles {
		nc, err := connectAs(t, url, role, s.viol, opts[role]...)
		if err != nil {
			t.Fatalf("%s connects: %v", role, err)
		}
		bus, err := events.Open(ctx, nc, events.Config{})
		if err != nil {
			t.Fatalf("%s opens the bus: %v", role, err)
		}
		s.conns[role], s.buses[role] = nc, bus
	}
	wctx, stop := context.WithCancel(ctx)
	s.stop = stop
	t.Cleanup(s.shutdown)
	run := func(name string, f func(context.Context) error) {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := f(wctx); err != nil && wctx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo", "diag"); err != nil {
		t.Fatal(err)
	}
	log := testLogger()
	run("executor", executor.NewWorker(s.buses["executor"], executor.New(reg, executor.WithInstance("sec-executor"), executor.WithLogger(log)),
		executor.WorkerConfig{Instance: "sec-executor", Grace: time.Second, Logger: log}).Run)
	eventstest.Eventually(t, 10*time.Second, func() error {
		cat, err := s.buses["planner"].WatchCatalog(ctx, nil)
		if err != nil {
			return err
		}
		if _, ok := cat.Lookup("calculator"); !ok {
			return errors.New("no calculator in the catalog yet")
		}
		return nil
	})
	cat, err := s.buses["planner"].WatchCatalog(wctx, log)
	if err != nil {
		t.Fatal(err)
	}
	run("planner", planner.New(s.buses["planner"], secModel(), cat, planner.Config{Instance: "sec-planner", Grace: time.Second, Logger: log}).Run)
	run("injector", injector.New(s.buses["injector"], injector.Config{Instance: "sec-injector", Grace: time.Second, Logger: log}).Run)
	return s
}

func (s *secured) shutdown() {
	s.stop()
	s.wg.Wait()
}

// runOnce submits a run as the client and waits for it to complete.
func (s *secured) runOnce(run string) {
	t := s.t
	t.Helper()
	client := s.buses["client"]
	err := client.StartRun(s.ctx, events.Source("cli", "sec"), events.RunStarted{
		RunID: run, Principal: events.Principal{ID: "sec-tester"},
		Messages: []events.Message{{Role: events.RoleUser, Content: "2+3?"}},
	})
	if err != nil {
		t.Fatalf("client starts a run: %v", err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		if _, err := client.Stream.GetLastMsgForSubject(s.ctx, events.SubjectRunEnded(run, events.RunCompleted)); err != nil {
			return fmt.Errorf("run %s not completed: %w (violations %v)", run, err, s.viol.all())
		}
		return nil
	})
	if v := s.viol.all(); len(v) > 0 {
		t.Fatalf("the roles hit permission violations: %v", v)
	}
}

// forbidden checks that role may not publish an event on subject: the server refuses it
// (a permissions violation) and the stream does not store it.
func (s *secured) forbidden(role, subject string) {
	t := s.t
	t.Helper()
	js, err := jetstream.New(s.conns[role])
	if err != nil {
		t.Fatal(err)
	}
	msg := encodeOrFail(t, subject, events.Meta{ID: "forged-" + role + "-" + subject, Type: events.TypeRunStarted, Source: "/evil"}, map[string]string{"run_id": "evil"})
	ctx, cancel := context.WithTimeout(s.ctx, time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, msg); err == nil {
		t.Fatalf("%s published to %s", role, subject)
	}
	eventstest.Eventually(t, 5*time.Second, func() error {
		for _, v := range s.viol.of(role) {
			if strings.Contains(v, subject) {
				return nil
			}
		}
		return fmt.Errorf("no violation recorded for %s on %s: %v", role, subject, s.viol.all())
	})
	if _, err := s.buses["client"].Stream.GetLastMsgForSubject(s.ctx, subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the stream has a message on %s: %v", subject, err)
	}
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// setPasswords sets the role passwords auth-users.conf reads and returns them.
func setPasswords(t *testing.T) map[string]string {
	pw := map[string]string{}
	for _, role := range secRoles {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		pw[role] = fmt.Sprintf("%x", b)
		t.Setenv("TOOLBUS_"+strings.ToUpper(role)+"_PASSWORD", pw[role])
	}
	return pw
}

// User and password per role (deploy/nats/auth-users.conf): a full run, and each role
// confined to its own subjects.
func TestSecurityUserPassword(t *testing.T) {
	pw := setPasswords(t)
	srv := startConfigured(t, "auth-users.conf")
	url := srv.ClientURL()
	opts := map[string][]nats.Option{}
	for _, role := range secRoles {
		opts[role] = []nats.Option{nats.UserInfo(role, pw[role])}
	}
	s := startSecured(t, url, opts)
	s.runOnce("sec-users-1")

	for _, c := range []struct{ name, user, pass string }{
		{"no credentials", "", ""}, {"wrong password", "executor", "guess"}, {"unknown user", "root", pw["executor"]},
	} {
		var o []nats.Option
		if c.user != "" {
			o = append(o, nats.UserInfo(c.user, c.pass))
		}
		if _, err := connectAs(t, url, "intruder", nil, o...); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Fatalf("%s: connect error %v, want an authorization violation", c.name, err)
		}
	}
	// Each role may publish only its own events: no forged run, result or outcome.
	s.forbidden("executor", "toolbus.evil.run.started")
	s.forbidden("client", "toolbus.evil.tool.finished.noop")
	s.forbidden("planner", "toolbus.evil.tool.waiting.noop") // planners publish tool.finished only for calls beyond the per-step cap
	s.forbidden("injector", "toolbus.evil.run.started")
	s.forbidden("executor", "toolbus.evil.model.requested")
	// No role may purge the audit trail.
	st, err := jetstream.New(s.conns["executor"])
	if err != nil {
		t.Fatal(err)
	}
	stream, err := st.Stream(s.ctx, events.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(s.ctx, time.Second)
	err = stream.Purge(pctx)
	cancel()
	if err == nil {
		t.Fatal("the executor purged the stream")
	}
	info, err := s.buses["client"].Stream.Info(s.ctx)
	if err != nil || info.State.Msgs == 0 {
		t.Fatalf("stream after the purge attempt: %v %+v", err, info)
	}
	eventstest.Eventually(t, 5*time.Second, func() error {
		for _, v := range s.viol.of("executor") {
			if strings.Contains(v, "$JS.API.STREAM.PURGE."+events.DefaultStream) {
				return nil
			}
		}
		return fmt.Errorf("no violation for the purge: %v", s.viol.all())
	})
	// Core NATS eavesdropping on events is refused too (reading goes through JetStream).
	if _, err := s.conns["executor"].SubscribeSync("toolbus.>"); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 5*time.Second, func() error {
		for _, v := range s.viol.of("executor") {
			if strings.Contains(strings.ToLower(v), "subscription") && strings.Contains(v, "toolbus.>") {
				return nil
			}
		}
		return fmt.Errorf("no subscription violation: %v", s.viol.all())
	})
	t.Logf("refused as expected: %v", s.viol.all())
}

// One nkey per role (deploy/nats/auth-nkeys.conf): the server holds public keys only,
// each process its seed file (TOOLBUS_NATS_NKEY).
func TestSecurityNKeys(t *testing.T) {
	dir := t.TempDir()
	opts := map[string][]nats.Option{}
	for _, role := range secRoles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		t.Setenv("TOOLBUS_"+strings.ToUpper(role)+"_NKEY", pub)
		o, err := nats.NkeyOptionFromSeed(writeFile(t, dir, role+".nk", seed))
		if err != nil {
			t.Fatal(err)
		}
		opts[role] = []nats.Option{o}
	}
	srv := startConfigured(t, "auth-nkeys.conf")
	s := startSecured(t, srv.ClientURL(), opts)
	s.runOnce("sec-nkeys-1")
	s.forbidden("executor", "toolbus.evil.run.started")

	stranger, _ := nkeys.CreateUser()
	seed, _ := stranger.Seed()
	o, err := nats.NkeyOptionFromSeed(writeFile(t, dir, "stranger.nk", seed))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := connectAs(t, srv.ClientURL(), "stranger", nil, o); err == nil {
		t.Fatal("an unknown nkey connected")
	}
}

// testPKI is a CA with a server certificate (127.0.0.1, localhost) and a client
// certificate, plus a client certificate of another CA.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey, otherCert, otherKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	leaf := func(name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	}
	ca, caKey, caPEM := newCA("toolbus test CA")
	other, otherKey, _ := newCA("some other CA")
	sc, sk := leaf("nats-server", ca, caKey, x509.ExtKeyUsageServerAuth)
	cc, ck := leaf("toolbus-client", ca, caKey, x509.ExtKeyUsageClientAuth)
	oc, ok := leaf("toolbus-client", other, otherKey, x509.ExtKeyUsageClientAuth)
	return testPKI{
		ca: writeFile(t, dir, "ca.pem", caPEM), serverCert: writeFile(t, dir, "server.pem", sc), serverKey: writeFile(t, dir, "server-key.pem", sk),
		clientCert: writeFile(t, dir, "client.pem", cc), clientKey: writeFile(t, dir, "client-key.pem", ck),
		otherCert: writeFile(t, dir, "other.pem", oc), otherKey: writeFile(t, dir, "other-key.pem", ok),
	}
}

// Mutual TLS with a CA (deploy/nats/tls.conf): the client verifies the server with the
// CA, the server requires a client certificate of the CA, plus user and password.
func TestSecurityTLS(t *testing.T) {
	pki := newTestPKI(t)
	pw := setPasswords(t)
	t.Setenv("NATS_TLS_CERT", pki.serverCert)
	t.Setenv("NATS_TLS_KEY", pki.serverKey)
	t.Setenv("NATS_TLS_CA", pki.ca)
	srv := startConfigured(t, "tls.conf")
	url := strings.Replace(srv.ClientURL(), "nats://", "tls://", 1)
	opts := map[string][]nats.Option{}
	for _, role := range secRoles {
		opts[role] = []nats.Option{nats.RootCAs(pki.ca), nats.ClientCert(pki.clientCert, pki.clientKey), nats.UserInfo(role, pw[role])}
	}
	s := startSecured(t, url, opts)
	s.runOnce("sec-tls-1")
	s.forbidden("client", "toolbus.evil.tool.finished.noop")

	for _, c := range []struct {
		name string
		opts []nats.Option
		want string
	}{
		{"no CA: the server is not trusted", []nats.Option{nats.ClientCert(pki.clientCert, pki.clientKey), nats.UserInfo("client", pw["client"])}, "certificate"},
		{"no client certificate", []nats.Option{nats.RootCAs(pki.ca), nats.UserInfo("client", pw["client"])}, ""},
		{"a client certificate of another CA", []nats.Option{nats.RootCAs(pki.ca), nats.ClientCert(pki.otherCert, pki.otherKey), nats.UserInfo("client", pw["client"])}, ""},
		{"no TLS options on a nats:// URL", []nats.Option{nats.UserInfo("client", pw["client"])}, ""},
	} {
		u := url
		if strings.HasPrefix(c.name, "no TLS options") {
			u = srv.ClientURL()
		}
		_, err := connectAs(t, u, "intruder", nil, c.opts...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: connect error %v, want a refusal", c.name, err)
		}
		t.Logf("%s: refused: %v", c.name, err)
	}
}

// A creds file per role (operator mode, what nsc produces; TOOLBUS_NATS_CREDS): the
// user JWTs carry the permissions of deploy/nats/permissions.conf.
func TestSecurityCredsFile(t *testing.T) {
	// The role permissions, as the server reads them from the config files.
	setPasswords(t)
	conf, err := server.ProcessConfigFile(filepath.Join("..", "deploy", "nats", "auth-users.conf"))
	if err != nil {
		t.Fatal(err)
	}
	perms := map[string]*server.Permissions{}
	for _, u := range conf.Users {
		perms[u.Username] = u.Permissions
	}

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, _ := okp.PublicKey()
	skp, err := nkeys.CreateAccount()
	must(err)
	spub, _ := skp.PublicKey()
	sysJWT, err := jwt.NewAccountClaims(spub).Encode(okp)
	must(err)
	akp, err := nkeys.CreateAccount()
	must(err)
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "TOOLBUS"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	accJWT, err := ac.Encode(okp)
	must(err)
	oc := jwt.NewOperatorClaims(opub)
	oc.SystemAccount = spub
	resolver := &server.MemAccResolver{}
	must(resolver.Store(spub, sysJWT))
	must(resolver.Store(apub, accJWT))
	srv := startSecServer(t, &server.Options{JetStream: true, TrustedOperators: []*jwt.OperatorClaims{oc},
		AccountResolver: resolver, SystemAccount: spub})

	dir := t.TempDir()
	creds := func(name string, p *server.Permissions) string {
		ukp, err := nkeys.CreateUser()
		must(err)
		upub, _ := ukp.PublicKey()
		uc := jwt.NewUserClaims(upub)
		uc.Name = name
		if p != nil {
			uc.Pub.Allow, uc.Pub.Deny = p.Publish.Allow, p.Publish.Deny
			uc.Sub.Allow, uc.Sub.Deny = p.Subscribe.Allow, p.Subscribe.Deny
		}
		userJWT, err := uc.Encode(akp)
		must(err)
		seed, _ := ukp.Seed()
		b, err := jwt.FormatUserConfig(userJWT, seed)
		must(err)
		return writeFile(t, dir, name+".creds", b)
	}
	opts := map[string][]nats.Option{}
	for _, role := range secRoles {
		if perms[role] == nil {
			t.Fatalf("auth-users.conf has no user %s", role)
		}
		opts[role] = []nats.Option{nats.UserCredentials(creds(role, perms[role]))}
	}
	s := startSecured(t, srv.ClientURL(), opts)
	s.runOnce("sec-creds-1")
	s.forbidden("planner", "toolbus.evil.tool.waiting.noop")

	// A user signed by an account the operator does not know is refused.
	stranger, _ := nkeys.CreateAccount()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	badJWT, err := jwt.NewUserClaims(upub).Encode(stranger)
	must(err)
	seed, _ := ukp.Seed()
	b, err := jwt.FormatUserConfig(badJWT, seed)
	must(err)
	if _, err := connectAs(t, srv.ClientURL(), "stranger", nil, nats.UserCredentials(writeFile(t, dir, "stranger.creds", b))); err == nil {
		t.Fatal("a user of an unknown account connected")
	}
}

// The run's allowlist: run.started names the allowed tools; the planner offers only
// those, and a call of another (known) tool is rejected as not_authorized, without
// running, and goes back to the model.
func TestSecurityToolAllowlist(t *testing.T) {
	var calcRuns int
	var mu sync.Mutex
	spy := executor.Tool{Name: "spy_calc", Description: "counts its runs", InputSchema: objectSchema, ReadOnly: true,
		Func: func(context.Context, json.RawMessage) (any, error) {
			mu.Lock()
			calcRuns++
			mu.Unlock()
			return map[string]int{"n": 5}, nil
		}}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "spy_calc", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, spy)
	s.startAll()
	s.submit("allow-1", events.Limits{}, "noop")
	if ended := s.waitEnd("allow-1"); ended.Status != events.RunCompleted {
		t.Fatalf("status %s (%s)", ended.Status, ended.Reason)
	}
	res := s.finished("allow-1")
	byCall := map[string]events.ToolResult{}
	for _, tf := range res {
		byCall[tf.ToolResult.CallID] = tf.ToolResult
	}
	if r := byCall["a"]; r.Status != events.StatusSucceeded {
		t.Fatalf("allowed call: %+v", r)
	}
	if r := byCall["b"]; r.Status != events.StatusRejected || r.Code() != events.CodeNotAuthorized {
		t.Fatalf("call of a tool outside the allowlist: %+v, want rejected/not_authorized", r)
	}
	mu.Lock()
	n := calcRuns
	mu.Unlock()
	if n != 0 {
		t.Fatalf("the tool outside the allowlist ran %d times", n)
	}
	req, ok := s.seenReq.forStep("allow-1", 0)
	if !ok {
		t.Fatal("no model request for step 0")
	}
	var offered []string
	for _, tc := range req.Tools {
		offered = append(offered, tc.Name)
	}
	if !reflect.DeepEqual(offered, []string{"noop"}) {
		t.Fatalf("tools offered to the model: %v, want only noop", offered)
	}
	next, _ := s.seenReq.forStep("allow-1", 1)
	found := false
	for _, m := range next.Messages {
		if m.Role == events.RoleTool && m.ToolCallID == "b" && m.IsError && strings.Contains(m.Content, "not allowed") {
			found = true
		}
	}
	if !found {
		t.Fatalf("the model did not read the refusal: %+v", next.Messages)
	}
	t.Logf("refused: %s", byCall["b"].Content)
}

// The principal of the run (run.started) reaches the executor's authorization hook with
// the tool and its arguments; the hook's refusal is a rejected/not_authorized result.
func TestSecurityPrincipalReachesAuthorizer(t *testing.T) {
	type seen struct {
		p    events.Principal
		tool string
		args string
	}
	var (
		mu  sync.Mutex
		got []seen
	)
	auth := executor.AuthorizerFunc(func(_ context.Context, p events.Principal, tool string, args json.RawMessage) error {
		mu.Lock()
		got = append(got, seen{p, tool, string(args)})
		mu.Unlock()
		if tool == "calculator" && !slices.Contains(p.Roles, "oncall") {
			return executor.NewError(events.CodeNotAuthorized, "calculator needs the oncall role")
		}
		return nil
	})
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "calculator", `{"expression":"6*7"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	s.start("exec-auth", executor.NewWorker(s.bus,
		executor.New(s.reg, executor.WithAuthorizer(auth), executor.WithInstance("exec-auth"), executor.WithLogger(s.log)),
		executor.WorkerConfig{Instance: "exec-auth", Grace: time.Second, Logger: s.log}).Run)
	eventstest.Eventually(t, 10*time.Second, func() error {
		cat, err := s.bus.WatchCatalog(s.ctx, nil)
		if err != nil {
			return err
		}
		if _, ok := cat.Lookup("calculator"); !ok {
			return errors.New("catalog without calculator")
		}
		return nil
	})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	principals := map[string]events.Principal{
		"auth-alice": {ID: "alice", Roles: []string{"oncall", "sre"}, Attrs: map[string]string{"team": "payments", "tenant": "t-1"}},
		"auth-bob":   {ID: "bob", Roles: []string{"viewer"}},
	}
	for run, p := range principals {
		err := s.bus.StartRun(s.ctx, "/test", events.RunStarted{RunID: run, Principal: p,
			Messages: []events.Message{{Role: events.RoleUser, Content: "6*7?"}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	for run := range principals {
		if ended := s.waitEnd(run); ended.Status != events.RunCompleted {
			t.Fatalf("%s: %s (%s)", run, ended.Status, ended.Reason)
		}
	}
	if r := s.finished("auth-alice")[0].ToolResult; r.Status != events.StatusSucceeded || !strings.Contains(r.Content, "42") {
		t.Fatalf("alice: %+v", r)
	}
	r := s.finished("auth-bob")[0].ToolResult
	if r.Status != events.StatusRejected || r.Code() != events.CodeNotAuthorized || !strings.Contains(r.Content, "oncall role") {
		t.Fatalf("bob: %+v, want rejected/not_authorized", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("the hook ran %d times, want 2: %+v", len(got), got)
	}
	for _, g := range got {
		want := principals["auth-"+g.p.ID]
		if !reflect.DeepEqual(g.p, want) || g.tool != "calculator" || g.args != `{"expression":"6*7"}` {
			t.Fatalf("the hook saw %+v, want principal %+v, calculator and the call's arguments", g, want)
		}
	}
	t.Logf("bob refused: %s", r.Content)
}
