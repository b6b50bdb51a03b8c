package testutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A nats-server process beside a test: a server reloaded while clients use it (a
// revocation under running connections) must not run inside a race-instrumented test
// binary, where nats-server 2.15.2's own unlocked reads of its options (stream.go's
// direct gets read s.opts.MaxPending while ReloadOptions swaps s.opts) fail the whole
// package at random. The binary is built without -race, from the module's dependency.

const (
	natsReady    = "Server is ready"
	natsReloaded = "Reloaded server configuration"
	natsNoReload = "Failed to reload server configuration"
	natsModule   = "github.com/nats-io/nats-server/v2"
)

var natsBin struct {
	once sync.Once
	path string
	err  error
}

// GoTool finds the go command: on PATH, else in GOROOT or /usr/local/go.
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	for _, dir := range []string{os.Getenv("GOROOT"), "/usr/local/go"} {
		if p := filepath.Join(dir, "bin", "go"); dir != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return "go"
}

// NATSServerBinary builds nats-server (github.com/nats-io/nats-server/v2, the version
// this module requires) without the race detector, once: into the temp directory under
// a name of its version and of Go's, so the test binaries of several packages, and later
// runs, link it once (a replaced module, which may change under one version, is built
// again by each test binary).
func NATSServerBinary() (string, error) {
	natsBin.once.Do(func() {
		out, err := exec.Command(GoTool(), "list", "-m", "-f", "{{.Version}}{{if .Replace}} replaced{{end}}", natsModule).CombinedOutput()
		if err != nil {
			natsBin.err = fmt.Errorf("go list %s: %w\n%s", natsModule, err, out)
			return
		}
		version, replaced := strings.CutSuffix(strings.TrimSpace(string(out)), " replaced")
		natsBin.path = filepath.Join(os.TempDir(), "toolbus-nats-server-"+version+"-"+runtime.Version())
		if _, err := os.Stat(natsBin.path); err == nil && !replaced {
			return
		}
		// Built beside its final name and renamed: test binaries build it at once.
		tmp := natsBin.path + "." + strconv.Itoa(os.Getpid())
		out, err = exec.Command(GoTool(), "build", "-o", tmp, natsModule).CombinedOutput()
		if err == nil {
			err = os.Rename(tmp, natsBin.path)
		}
		if err != nil {
			natsBin.err = fmt.Errorf("go build %s: %w\n%s", natsModule, err, out)
		}
	})
	return natsBin.path, natsBin.err
}

// NATSProcess is a nats-server process on a configuration file, on a free port of
// 127.0.0.1. The file sets the JetStream store_dir (nats-server refuses -sd beside it),
// or the store is shared under the temp directory.
type NATSProcess struct {
	URL  string
	conf string
	cmd  *exec.Cmd
	log  Buffer
	done chan struct{}
	mu   sync.Mutex // one reload at a time
}

// StartNATSProcess runs nats-server -c conf until Stop, once it is ready for clients.
// The free port it picks may be taken before the server listens: it tries another then.
func StartNATSProcess(conf string) (*NATSProcess, error) {
	bin, err := NATSServerBinary()
	if err != nil {
		return nil, err
	}
	for range 3 {
		var p *NATSProcess
		if p, err = startNATS(bin, conf); err == nil || !strings.Contains(err.Error(), "address already in use") {
			return p, err
		}
	}
	return nil, err
}

func startNATS(bin, conf string) (*NATSProcess, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	p := &NATSProcess{URL: "nats://127.0.0.1:" + port, conf: conf, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "-c", conf, "-a", "127.0.0.1", "-p", port)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	DieWithParent(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	if err := p.await(natsReady, 0, "", 0, time.Minute); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// StartNATS is StartNATSProcess for a test: stopped when it ends, its log shown if the
// test failed.
func StartNATS(t testing.TB, conf string) *NATSProcess {
	t.Helper()
	p, err := StartNATSProcess(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("nats-server's log:\n%s", p.Log())
		}
	})
	return p
}

// Reload makes the server load its file again (SIGHUP, as kill -HUP or nats-server
// --signal reload) and waits until it says it did; a file it refuses is an error.
func (p *NATSProcess) Reload() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	done, failed := strings.Count(p.log.String(), natsReloaded), strings.Count(p.log.String(), natsNoReload)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		return fmt.Errorf("nats-server: reload: %w", err)
	}
	if err := p.await(natsReloaded, done, natsNoReload, failed, 30*time.Second); err != nil {
		return fmt.Errorf("nats-server: reload of %s: %w", p.conf, err)
	}
	return nil
}

// await waits up to d until the log holds more than n lines of want, failing early on
// more than m lines of refusal (if not "") or on the process's exit.
func (p *NATSProcess) await(want string, n int, refusal string, m int, d time.Duration) error {
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		log := p.log.String()
		if strings.Count(log, want) > n {
			return nil
		}
		if refusal != "" && strings.Count(log, refusal) > m {
			return errors.New(lastLine(log, refusal))
		}
		select {
		case <-p.done:
			return fmt.Errorf("nats-server exited:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server: no %q in %v:\n%s", want, d, log)
		}
	}
}

func lastLine(log, containing string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], containing) {
			return lines[i]
		}
	}
	return containing
}

// Log is what the server printed so far.
func (p *NATSProcess) Log() string { return p.log.String() }

// Stop kills the server and waits for it.
func (p *NATSProcess) Stop() {
	_ = p.cmd.Process.Kill()
	<-p.done
}
