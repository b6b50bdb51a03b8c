package faults_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
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

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// TestFaultSecurityRoles runs the real binaries with credentials: nats-server with
// deploy/nats/tls.conf (a user and password per role behind mutual TLS) and with
// deploy/nats/auth-nkeys.conf (an nkey per role), and every toolbus role as its own
// process configured only by TOOLBUS_NATS_* variables, the client being `toolbus run`.
// It runs in plain `go test` too (a few seconds once the binaries are built).
func TestFaultSecurityRoles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	natsBin, toolbusBin, _ := binaries(t)
	roles := []string{"admin", "planner", "executor", "injector", "client"}

	t.Run("user and password over mutual TLS", func(t *testing.T) {
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
		securedPipeline(t, natsBin, toolbusBin, dir, "tls.conf", "tls", serverEnv, roleEnv, check)
	})

	t.Run("nkey per role", func(t *testing.T) {
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
		securedPipeline(t, natsBin, toolbusBin, dir, "auth-nkeys.conf", "nats", serverEnv, roleEnv, check)
	})
}

// securedPipeline starts nats-server with a deploy config and the roles with their
// credentials, runs `toolbus run` as the client and checks the run from the stream.
func securedPipeline(t *testing.T, natsBin, toolbusBin, dir, conf, scheme string, serverEnv []string, roleEnv map[string][]string, check []nats.Option) {
	t.Helper()
	port := freePort(t)
	cfgDir := deployCopy(t, filepath.Join(dir, "conf"), filepath.Join(dir, "store"))
	srv := startProc(t, dir, "nats", natsBin, []string{"-c", filepath.Join(cfgDir, conf), "-a", "127.0.0.1",
		"-p", strconv.Itoa(port), "-m", strconv.Itoa(freePort(t))}, serverEnv)
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
	initCmd.Env = childEnv(append([]string{"TOOLBUS_NATS_URL=" + url, "TOOLBUS_TOOLS=demo,diag"}, roleEnv["admin"]...))
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
