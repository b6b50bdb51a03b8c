package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/internal/testutil"
)

// serverProc is a `toolbus server` process of a test.
type serverProc struct {
	cmd    *exec.Cmd
	url    string
	stderr *testutil.Buffer
	done   chan error
}

// startServerProc starts bin server -c config -sd store -p <a free port> -m 0 (the
// generated configs' monitoring port is fixed).
func startServerProc(t *testing.T, bin, config, store string) *serverProc {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	p := &serverProc{stderr: &testutil.Buffer{}, done: make(chan error, 1), url: "nats://127.0.0.1:" + strconv.Itoa(port)}
	p.cmd = exec.Command(bin, "server", "-c", config, "-sd", store, "-p", strconv.Itoa(port), "-m", "0")
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("server log:\n%s", p.stderr)
		}
	})
	return p
}

// connect connects with opts, retrying until the server is up (or the deadline).
func (p *serverProc) connect(t *testing.T, opts ...nats.Option) *nats.Conn {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		nc, err := nats.Connect(p.url, opts...)
		if err == nil {
			t.Cleanup(nc.Close)
			return nc
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect to %s: %v", p.url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends sig and waits for the process: its exit code.
func (p *serverProc) stop(t *testing.T, sig os.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(time.Minute):
		t.Fatalf("the server did not stop on %v", sig)
		return -1
	}
}

// buildToolbus builds this command into a temporary directory.
func buildToolbus(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "toolbus")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestServerCommand runs `toolbus server` as a process with the configs
// deploy/nats/gen writes: in operator mode a generated credential connects and gets
// JetStream, stored where -sd says; with users and passwords, SIGHUP loads a team
// granted since the start; SIGTERM stops it with exit 0; an invalid file, or JetStream
// with no store directory, exits 1 naming the file.
func TestServerCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildToolbus(t)
	dir := t.TempDir()
	perms := filepath.Join("..", "..", "deploy", "nats", "permissions.conf")
	gen := func(g natsjwt.Grants) natsjwt.Result {
		res, err := natsjwt.GenerateGrants(perms, filepath.Join(dir, "gen"), g, natsjwt.WithBcryptCost(bcrypt.MinCost))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := gen(natsjwt.Grants{Teams: map[string][]string{"alpha": {"calculator"}}})

	t.Run("operator mode serves JetStream", func(t *testing.T) {
		store := filepath.Join(dir, "jwt-store")
		p := startServerProc(t, bin, res.Config, store)
		nc := p.connect(t, nats.UserCredentials(res.Creds["admin"]))
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SERVERTEST", Subjects: []string{"servertest.>"}}); err != nil {
			t.Fatalf("JetStream as admin: %v", err)
		}
		if _, err := js.Publish(ctx, "servertest.x", []byte("hi")); err != nil {
			t.Fatalf("publish: %v", err)
		}
		if _, err := os.Stat(filepath.Join(store, "jetstream")); err != nil {
			t.Fatalf("the store is not where -sd says: %v", err)
		}
		if code := p.stop(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("SIGTERM: exit %d", code)
		}
	})

	t.Run("SIGHUP reloads the users", func(t *testing.T) {
		p := startServerProc(t, bin, res.UsersConfig, filepath.Join(dir, "users-store"))
		p.connect(t, userPassword(t, res, "admin"))
		res2 := gen(natsjwt.Grants{Teams: map[string][]string{"alpha": {"calculator"}, "beta": {"web_search"}}})
		beta := natsjwt.TeamUser("beta")
		if nc, err := nats.Connect(p.url, userPassword(t, res2, beta)); err == nil {
			nc.Close()
			t.Fatalf("%s connected before the reload", beta)
		}
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		p.connect(t, userPassword(t, res2, beta))
		// The server takes the new users before it logs the whole reload done.
		eventstest.Eventually(t, 10*time.Second, func() error {
			if !strings.Contains(p.stderr.String(), "reloaded") {
				return errors.New("the log does not say the configuration was reloaded")
			}
			return nil
		})
		if code := p.stop(t, syscall.SIGINT); code != 0 {
			t.Fatalf("SIGINT: exit %d", code)
		}
	})

	t.Run("invalid configurations", func(t *testing.T) {
		for _, tc := range []struct {
			name, conf, want string
		}{
			{"syntax", "listen: 127.0.0.1:4222\njetstream {\n  max_file_store: 1GB\n", "bad.conf"},
			{"jetstream without a store", "listen: 127.0.0.1:4222\njetstream {\n  max_file_store: 1GB\n}\n", "-sd DIR"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				file := filepath.Join(t.TempDir(), "bad.conf")
				if err := os.WriteFile(file, []byte(tc.conf), 0o600); err != nil {
					t.Fatal(err)
				}
				out, err := exec.Command(bin, "server", "-c", file).CombinedOutput()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 {
					t.Fatalf("exit %v, want 1:\n%s", err, out)
				}
				if !strings.Contains(string(out), file) || !strings.Contains(string(out), tc.want) {
					t.Fatalf("the error does not name %s and %q:\n%s", file, tc.want, out)
				}
			})
		}
	})
}

// userPassword is the user/password login of user in res.
func userPassword(t *testing.T, res natsjwt.Result, user string) nats.Option {
	t.Helper()
	pw, err := os.ReadFile(res.Passwords[user])
	if err != nil {
		t.Fatal(err)
	}
	return nats.UserInfo(user, string(pw))
}

// The flags of `toolbus server` override the file, its store_dir included (which
// nats-server's -sd refuses); a JetStream file with no store directory and a bad -m are
// refused.
func TestServerOptions(t *testing.T) {
	single := filepath.Join("..", "..", "deploy", "nats", "single.conf")
	noStore := filepath.Join(t.TempDir(), "nostore.conf")
	if err := os.WriteFile(noStore, []byte("jetstream {\n  max_file_store: 1GB\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		f         embedded.Configured
		host      string
		port      int
		store     string
		http      int
		wantErrIn string
	}{
		{name: "the file", f: embedded.Configured{Config: single}, host: "0.0.0.0", port: 4222, store: "/data", http: 8222},
		{name: "flags override it", f: embedded.Configured{Config: single, StoreDir: "/var/lib/nats", Host: "127.0.0.1", Port: 4333, Monitor: "0"},
			host: "127.0.0.1", port: 4333, store: "/var/lib/nats", http: 0},
		{name: "no store", f: embedded.Configured{Config: noStore}, wantErrIn: "no store_dir: give the directory with -sd DIR"},
		{name: "-sd gives it", f: embedded.Configured{Config: noStore, StoreDir: "/s"}, host: "", port: 0, store: "/s"},
		{name: "bad -m", f: embedded.Configured{Config: single, Monitor: "x"}, wantErrIn: `-m "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := embedded.ConfiguredOptions(tc.f)
			if tc.wantErrIn != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrIn) || !strings.Contains(err.Error(), tc.f.Config) && tc.f.Monitor == "" {
					t.Fatalf("err = %v, want %q naming the file", err, tc.wantErrIn)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if opts.Host != tc.host || opts.Port != tc.port || opts.StoreDir != tc.store || opts.HTTPPort != tc.http || !opts.NoSigs {
				t.Fatalf("host %q port %d store %q monitoring %d nosigs %v; want %q %d %q %d true",
					opts.Host, opts.Port, opts.StoreDir, opts.HTTPPort, opts.NoSigs, tc.host, tc.port, tc.store, tc.http)
			}
		})
	}
}
