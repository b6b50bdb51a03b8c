package faults_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// TestFaultSecurityRoles runs the real binaries with credentials: nats-server with
// deploy/nats/tls.conf (a user and password per role behind mutual TLS) and with
// deploy/nats/auth-nkeys.conf (an nkey per role), and every toolbus role as its own
// process configured only by TOOLBUS_NATS_* variables, the client being `toolbus run`.
// It runs in plain `go test` too (a few seconds once the binaries are built).
func TestFaultSecurityRoles(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	natsBin, toolbusBin, _ := binaries(t)
	roles := []string{"admin", "planner", "executor", "injector", "client"}

	t.Run("user and password over mutual TLS", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		pki := writePKI(t, dir)
		serverEnv := []string{"NATS_TLS_CERT=" + pki["server.pem"], "NATS_TLS_KEY=" + pki["server-key.pem"], "NATS_TLS_CA=" + pki["ca.pem"]}
		roleEnv := map[string][]string{}
		for _, role := range roles {
			pw := strconv.FormatInt(time.Now().UnixNano(), 36) + role
			serverEnv = append(serverEnv, "TOOLBUS_"+strings.ToUpper(role)+"_PASSWORD="+pw)
			roleEnv[role] = []string{"TOOLBUS_NATS_USER=" + role, "TOOLBUS_NATS_PASSWORD=" + pw,
				"TOOLBUS_NATS_TLS_CA=" + pki["ca.pem"], "TOOLBUS_NATS_TLS_CERT=" + pki["client.pem"], "TOOLBUS_NATS_TLS_KEY=" + pki["client-key.pem"]}
		}
		check := []nats.Option{nats.RootCAs(pki["ca.pem"]), nats.ClientCert(pki["client.pem"], pki["client-key.pem"]),
			nats.UserInfo("admin", strings.TrimPrefix(roleEnv["admin"][1], "TOOLBUS_NATS_PASSWORD="))}
		securedPipeline(t, []string{natsBin}, toolbusBin, dir, "tls.conf", "tls", serverEnv, roleEnv, check)
	})

	t.Run("nkey per role", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		var serverEnv []string
		roleEnv := map[string][]string{}
		var check []nats.Option
		for _, role := range roles {
			kp, err := nkeys.CreateUser()
			if err != nil {
				t.Fatal(err)
			}
			pub, _ := kp.PublicKey()
			seed, _ := kp.Seed()
			seedFile := filepath.Join(dir, role+".nk")
			if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
				t.Fatal(err)
			}
			serverEnv = append(serverEnv, "TOOLBUS_"+strings.ToUpper(role)+"_NKEY="+pub)
			roleEnv[role] = []string{"TOOLBUS_NATS_NKEY=" + seedFile}
			if role == "admin" {
				o, err := nats.NkeyOptionFromSeed(seedFile)
				if err != nil {
					t.Fatal(err)
				}
				check = []nats.Option{o}
			}
		}
		securedPipeline(t, []string{natsBin}, toolbusBin, dir, "auth-nkeys.conf", "nats", serverEnv, roleEnv, check)
	})

	// The operator/JWT setup exactly as `go run ./deploy/nats/gen -grants` writes it: the
	// server runs auth-jwt.conf (operator, accounts, memory resolver), every process
	// gets its <user>.creds. The executor is a team's (executor-alpha, granted the
	// tools the pipeline calls, with TOOLBUS_TEAM=alpha), and a client bound to alice
	// may start runs for alice only.
	t.Run("JWT from deploy/nats/gen", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		grants := natsjwt.Grants{Teams: map[string][]string{"alpha": {"noop", "calculator"}},
			Clients: map[string][]string{"alice": {"alice"}}}
		// The generated config stores in the test's directory (gen -store).
		res, err := natsjwt.GenerateGrants(filepath.Join("..", "deploy", "nats", "permissions.conf"), filepath.Join(dir, "gen"), grants,
			natsjwt.WithBcryptCost(bcrypt.MinCost), natsjwt.WithStoreDir(filepath.Join(dir, "store")))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(res.Config)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "resolver: MEMORY") {
			t.Fatalf("auth-jwt.conf is not the operator setup the test expects:\n%s", b)
		}
		creds := func(user string) []string { return []string{"TOOLBUS_NATS_CREDS=" + res.Creds[user]} }
		roleEnv := map[string][]string{}
		for _, role := range roles {
			roleEnv[role] = creds(role)
		}
		roleEnv["executor"] = append(creds(natsjwt.TeamUser("alpha")), "TOOLBUS_TEAM=alpha", "TOOLBUS_EXECUTOR_TOOLS=noop,calculator")
		// The server is the toolbus binary's own (toolbus server): a multi-team
		// deployment needs nothing but toolbus.
		url, dump := securedPipeline(t, []string{toolbusBin, "server"}, toolbusBin, dir, res.Config, "nats", nil, roleEnv, []nats.Option{nats.UserCredentials(res.Creds["admin"])})

		run := func(id, principal string) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, toolbusBin, "run", "--id", id, "--principal", principal, "add nothing")
			cmd.Env = childEnv(append([]string{"TOOLBUS_NATS_URL=" + url, "TOOLBUS_INSTANCE=alice-cli"}, creds(natsjwt.ClientUser("alice"))...))
			dieWithParent(cmd)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		// Alice's bound credentials start a run for alice...
		if out, err := run("jwt-alice", "alice"); err != nil || !strings.Contains(out, "run jwt-alice: completed") {
			dump()
			t.Fatalf("toolbus run --principal alice as client-alice: %v\n%s", err, out)
		}
		// ...and the server refuses them a run for bob: nothing is stored.
		out, err := run("jwt-bob", "bob")
		// The server's refusal: the CLI's PermissionError (built only from the server's
		// asynchronous permissions violation) and, when the process lives long enough to
		// print it, the client library's log line of the violation itself.
		if err == nil || !strings.Contains(strings.ToLower(out), "permissions violation") && !strings.Contains(out, `permission denied: the credentials of user client-alice may not publish to "toolbus.jwt-bob.run.started.bob"`) {
			dump()
			t.Fatalf("toolbus run --principal bob as client-alice: %v, want a permissions violation:\n%s", err, out)
		}
		t.Logf("client-alice starting a run for bob: %v\n%s", err, out)
		ctx, js := adminJetStream(t, url, res.Creds["admin"])
		stream, err := js.Stream(ctx, events.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.GetLastMsgForSubject(ctx, events.SubjectRun("jwt-bob")); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("the stream holds an event of the refused run: %v", err)
		}
		// The team's executor heartbeats under its team's key.
		kv, err := js.KeyValue(ctx, store.BucketInstances)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.Keys(ctx)
		if err != nil || len(keys) == 0 || !slices.ContainsFunc(keys, func(k string) bool { return store.InstanceTeam(k) == "alpha" }) {
			t.Fatalf("instance records %v (%v), want the team alpha's executor under its team's key", keys, err)
		}
	})
}

// TestFaultFairShareAccounts: fair share in the accounts layout with the credentials
// deploy/nats/gen ships: `toolbus init` (admin) stages the calls and makes the
// scheduler's durable; the injector, with its generated credentials, runs the
// scheduler and releases the call; the team's executor, in its own account, pulls and
// runs it; client alice's `toolbus run` completes (securedPipeline checks it).
func TestFaultFairShareAccounts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	_, toolbusBin, _ := binaries(t)
	dir := t.TempDir()
	grants := natsjwt.Grants{Teams: map[string][]string{"alpha": {"noop", "calculator"}}, Clients: map[string][]string{"alice": {"alice"}}}
	res, err := natsjwt.GenerateGrants(filepath.Join("..", "deploy", "nats", "permissions.conf"), filepath.Join(dir, "gen"), grants,
		natsjwt.WithBcryptCost(bcrypt.MinCost), natsjwt.WithStoreDir(filepath.Join(dir, "store")))
	if err != nil {
		t.Fatal(err)
	}
	roleEnv := map[string][]string{}
	for _, role := range []string{"admin", "planner", "injector", "client"} {
		roleEnv[role] = []string{"TOOLBUS_NATS_CREDS=" + res.Creds[role]}
	}
	roleEnv["executor"] = []string{"TOOLBUS_NATS_CREDS=" + res.Creds[natsjwt.TeamUser("alpha")], "TOOLBUS_TEAM=alpha", "TOOLBUS_EXECUTOR_TOOLS=noop,calculator"}
	url, dump := securedPipeline(t, []string{toolbusBin, "server"}, toolbusBin, dir, res.Config, "nats", nil, roleEnv,
		[]nats.Option{nats.UserCredentials(res.Creds["admin"])}, "TOOLBUS_FAIR_SHARE=1")
	ctx, js := adminJetStream(t, url, res.Creds["admin"])
	qs, err := js.Stream(ctx, events.QueueStreamName(events.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	// The call went through the scheduler: staged, then released by it.
	if _, err := qs.GetLastMsgForSubject(ctx, events.StagePrefix+".>"); err != nil {
		dump()
		t.Fatalf("no staged call: %v", err)
	}
	rel, err := qs.GetLastMsgForSubject(ctx, events.QueuePrefix+".>")
	if err != nil || rel.Header.Get(events.FairStagedHeader) == "" {
		dump()
		t.Fatalf("no call released by the scheduler: %v", err)
	}
	fairHeldProbes(t, url, func(user string) string { return res.Creds[user] }, false)
}

// securedPipeline starts a NATS server (server: nats-server, or toolbus server) with a
// deploy config (a file of deploy/nats, or the absolute path of one the generator wrote) and the roles with their credentials, runs
// `toolbus run` as the client and checks the run from the stream. It returns the
// server's URL and a dump of every process's log tail.
func securedPipeline(t *testing.T, server []string, toolbusBin, dir, conf, scheme string, serverEnv []string, roleEnv map[string][]string, check []nats.Option, initEnv ...string) (string, func()) {
	t.Helper()
	port := freePort(t)
	confPath := conf
	if !filepath.IsAbs(conf) {
		confPath = filepath.Join(deployCopy(t, filepath.Join(dir, "conf"), filepath.Join(dir, "store")), conf)
	}
	conf = filepath.Base(conf)
	srv := startProc(t, dir, "nats", server[0], append(server[1:len(server):len(server)], "-c", confPath, "-a", "127.0.0.1",
		"-p", strconv.Itoa(port), "-m", strconv.Itoa(freePort(t))), serverEnv)
	url := fmt.Sprintf("%s://127.0.0.1:%d", scheme, port)
	var nc *nats.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		nc, err = nats.Connect(url, append([]nats.Option{nats.Timeout(time.Second)}, check...)...)
		if err == nil {
			break
		}
		if srv.exited() || time.Now().After(deadline) {
			t.Fatalf("nats-server with %s not ready: %v\n%s", conf, err, srv.logTail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer nc.Close()

	var procs []*proc
	dump := func() {
		for _, p := range append(procs, srv) {
			t.Logf("---- %s ----\n%s", p.name, p.logTail(15))
		}
	}
	// The admin sets the bus up; the roles only bind to what it made.
	initCtx, initCancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer initCancel()
	initCmd := exec.CommandContext(initCtx, toolbusBin, "init")
	initCmd.Env = childEnv(append(append([]string{"TOOLBUS_NATS_URL=" + url, "TOOLBUS_TOOLS=demo,diag"}, initEnv...), roleEnv["admin"]...))
	dieWithParent(initCmd)
	initOut, err := initCmd.CombinedOutput()
	if err != nil || !strings.Contains(string(initOut), "created stream "+events.DefaultStream) || !strings.Contains(string(initOut), "created consumer tool_noop") {
		dump()
		t.Fatalf("toolbus init: %v\n%s", err, initOut)
	}
	t.Logf("toolbus init:\n%s", initOut)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := map[string]string{}
	for _, role := range []string{"executor", "planner", "injector"} {
		metricsAddr[role] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		env := append([]string{"TOOLBUS_NATS_URL=" + url, "TOOLBUS_INSTANCE=" + role, "TOOLBUS_MODEL=script:noop",
			"TOOLBUS_GRACE=2s", "TOOLBUS_TOOLS=demo,diag", "TOOLBUS_METRICS_ADDR=" + metricsAddr[role]}, roleEnv[role]...)
		procs = append(procs, startProc(t, dir, role, toolbusBin, []string{role}, env))
	}
	// The executor is up when its tools are in the catalog.
	kv, err := js.KeyValue(context.Background(), store.BucketTools)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := kv.Get(context.Background(), "noop"); err == nil {
			break
		}
		for _, p := range procs {
			if p.exited() {
				dump()
				t.Fatalf("%s exited", p.name)
			}
		}
		if time.Now().After(deadline.Add(30 * time.Second)) {
			dump()
			t.Fatal("the executor did not publish its tools")
		}
		time.Sleep(100 * time.Millisecond)
	}
	run := "secured-" + strings.TrimSuffix(conf, ".conf")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, toolbusBin, "run", "--id", run, "--principal", "alice", "add nothing, three times")
	cmd.Env = childEnv(append([]string{"TOOLBUS_NATS_URL=" + url, "TOOLBUS_INSTANCE=client"}, roleEnv["client"]...))
	dieWithParent(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		dump()
		t.Fatalf("toolbus run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "run "+run+": completed") {
		t.Fatalf("toolbus run output:\n%s", out)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	stream, err := js.Stream(sctx, events.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(sctx, jetstream.WithSubjectFilter(events.SubjectRun(run)))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for subj, c := range info.State.Subjects {
		if strings.Contains(subj, ".tool.finished.") {
			n += int(c)
		}
	}
	if n != 8 {
		t.Fatalf("%d results in the stream, want 8 (2 steps of 4 noop calls): %v", n, info.State.Subjects)
	}
	// The client's other commands, with its own credentials.
	client := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, toolbusBin, args...)
		cmd.Env = childEnv(append([]string{"TOOLBUS_NATS_URL=" + url, "TOOLBUS_INSTANCE=client"}, roleEnv["client"]...))
		dieWithParent(cmd)
		out, err := cmd.CombinedOutput()
		if err != nil {
			dump()
			t.Fatalf("toolbus %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tools"}, "noop"},
		{[]string{"runs"}, run},
		{[]string{"tail", "--all", run}, "run " + run + ": completed"},
		{[]string{"replay", run}, run},
	} {
		if out := client(c.args...); !strings.Contains(out, c.want) {
			t.Fatalf("toolbus %v: output lacks %q:\n%s", c.args, c.want, out)
		}
	}
	// `toolbus mcp` (stdio) with the client's credentials lists the catalog and calls a tool.
	{
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, toolbusBin, "mcp")
		cmd.Env = childEnv(append([]string{"TOOLBUS_NATS_URL=" + url, "TOOLBUS_INSTANCE=client-mcp"}, roleEnv["client"]...))
		cmd.Stderr = io.Discard
		dieWithParent(cmd)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "faults-host", Version: "v0"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("toolbus mcp as the client: %v", err)
		}
		tools, err := cs.ListTools(ctx, nil)
		if err != nil || !slices.ContainsFunc(tools.Tools, func(tl *mcp.Tool) bool { return tl.Name == "calculator" }) {
			t.Fatalf("toolbus mcp lists %v (%v), want calculator", tools, err)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "calculator", Arguments: map[string]any{"expression": "2+3*4"}})
		if err != nil || res.IsError || len(res.Content) == 0 {
			t.Fatalf("toolbus mcp calls calculator: %+v %v", res, err)
		}
		if tc, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, "14") {
			t.Fatalf("toolbus mcp: calculator answered %+v", res.Content[0])
		}
		_ = cs.Close()
	}
	// Every role is ready and no operation was refused to its credentials.
	for role, addr := range metricsAddr {
		for path, want := range map[string]string{"/readyz": "ready", "/metrics": "toolbus_permission_denied_total 0"} {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				t.Fatalf("%s %s: %v", role, path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
				t.Fatalf("%s %s: %d, want 200 with %q:\n%.2000s", role, path, resp.StatusCode, want, b)
			}
		}
	}
	for _, p := range append(procs, srv) {
		if strings.Contains(strings.ToLower(p.logText()), "permissions violation") {
			dump()
			t.Fatalf("%s logged a permissions violation", p.name)
		}
	}
	t.Logf("%s: run completed by role processes with their own credentials:\n%s", conf, out)
	return url, dump
}

// writePKI writes a CA, a server certificate for 127.0.0.1 and a client certificate.
func writePKI(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	write := func(name, typ string, der []byte) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		files[name] = p
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "toolbus faults CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write("ca.pem", "CERTIFICATE", caDER)
	for i, name := range []string{"server", "client"} {
		k := key()
		usage := x509.ExtKeyUsageServerAuth
		if name == "client" {
			usage = x509.ExtKeyUsageClientAuth
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: "toolbus " + name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		write(name+".pem", "CERTIFICATE", der)
		write(name+"-key.pem", "EC PRIVATE KEY", kb)
	}
	return files
}
