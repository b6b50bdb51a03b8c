package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// docSection returns the section of the document at path (from the repository root)
// under heading, up to the next "## ".
func docSection(t *testing.T, path, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../..", path))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("%s has no %q", path, heading)
	}
	s = s[i+len(heading)+2:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

// goCmd runs go in dir with env added; it fails the test on error.
func goCmd(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestDeployYourOwnTools does what "Deploy your own tools" of docs/writing-tools.md says,
// from an empty directory: go mod init, replace toolbus with this checkout, the page's
// main.go, go mod tidy and a build, then the executor against a server: its tool is in
// `toolbus tools`, /readyz answers ready, /metrics counts the call made with `toolbus call`,
// its logs are JSON (TOOLBUS_LOG_FORMAT) and its spans reach the OTLP endpoint of
// OTEL_EXPORTER_OTLP_ENDPOINT. It works from an empty module cache (buildOutsideModule).
func TestDeployYourOwnTools(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	section := docSection(t, "docs/writing-tools.md", "## Deploy your own tools")
	m := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("the section shows no Go program")
	}
	dir := t.TempDir()
	buildOutsideModule(t, section, dir, m[1])
	// An OTLP/HTTP endpoint that records the trace exports.
	var traces sync.WaitGroup
	traces.Add(1)
	var once sync.Once
	otlp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/traces" {
			once.Do(traces.Done)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(otlp.Close)

	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 3*time.Minute)
	if _, _, err := provision.Setup(ctx, srv.Conn, events.Config{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, "shout"))
	cmd.Env = append(os.Environ(), "TOOLBUS_NATS_URL="+srv.URL, "TOOLBUS_INSTANCE=shout-1",
		"TOOLBUS_METRICS_ADDR=127.0.0.1:0", "TOOLBUS_LOG_FORMAT=json", "TOOLBUS_LOG_LEVEL=info",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+otlp.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=shout")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	// Every log line is JSON; the metrics address is in the "metrics serving" line.
	addrs := make(chan string, 1)
	var logMu sync.Mutex
	var logs []string
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			logs = append(logs, line)
			logMu.Unlock()
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Errorf("log line is not JSON (TOOLBUS_LOG_FORMAT=json): %q", line)
				continue
			}
			if rec["msg"] == "metrics serving" {
				addrs <- fmt.Sprint(rec["addr"])
			}
		}
		exited <- cmd.Wait()
	}()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-exited:
		exited <- err
		t.Fatalf("the executor exited: %v\n%s", err, strings.Join(logs, "\n"))
	case <-ctx.Done():
		t.Fatal("the executor never served its metrics")
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		if code, body := get("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz: %d %s", code, body)
		}
		return nil
	})

	// The rest of the fleet: a planner and an injector (toolbus call's run goes through them).
	t.Setenv("TOOLBUS_NATS_URL", srv.URL)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	cfg, err := node.Load()
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRoles := context.WithCancel(ctx)
	rolesDone := make(chan error, 1)
	go func() { rolesDone <- cmdRole2(rctx, cfg, "planner", "injector") }()
	t.Cleanup(func() { stopRoles(); <-rolesDone })
	t.Setenv("TOOLBUS_LOG_LEVEL", "")
	code, out, errOut := cli(t, "tools")
	wantCode(t, "toolbus tools", code, 0, out, errOut)
	if !regexp.MustCompile(`(?m)^shout\s+-\s+-\s+shout-1\s`).MatchString(out) {
		t.Fatalf("toolbus tools does not list shout served by shout-1:\n%s", out)
	}
	code, out, errOut = cli(t, "call", "shout", `{"text":"hello"}`)
	wantCode(t, "toolbus call shout", code, 0, out, errOut)
	wantContains(t, "toolbus call shout", out, `"shout": "HELLO!"`)

	code, body := get("/metrics")
	if code != http.StatusOK || !regexp.MustCompile(`toolbus_tool_calls_total\{[^}]*tool="shout"[^}]*\} 1`).MatchString(body) {
		t.Fatalf("/metrics (%d) does not count the call of shout:\n%s", code, body)
	}
	// The spans are flushed at the latest when the executor stops.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { traces.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("no trace reached the OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT)")
	}
}

// buildOutsideModule follows the section's steps in dir, a module outside this repository:
// go mod init, a replace of toolbus by this checkout, main.go, go mod tidy, go build. The
// go command resolves what the new module's graph needs itself: GOPROXY and GOMODCACHE
// come from the environment as for the outer go (a fresh machine's empty module cache is
// filled from the proxy; nothing has to run before). The checkout's go.sum is
// the new module's starting go.sum: the new graph is part of toolbus's, so every module is
// checked against the hashes this repository pins, with no checksum database needed.
func buildOutsideModule(t *testing.T, section, dir, mainGo string) {
	t.Helper()
	steps := []string{"go mod init example.com/shout", "go mod edit -replace github.com/toolbus/toolbus=", "go mod tidy", "go build -o shout ."}
	for _, step := range steps {
		if !strings.Contains(section, step) {
			t.Fatalf("the section no longer says %q: update this test with it", step)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"GOWORK=off", "GOFLAGS=-buildvcs=false"}
	goCmd(t, dir, env, "mod", "init", "example.com/shout")
	goCmd(t, dir, env, "mod", "edit", "-replace", "github.com/toolbus/toolbus="+root)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(mainGo), 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd(t, dir, env, "mod", "tidy")
	goCmd(t, dir, env, "build", "-o", "shout", ".")
}

// cmdRole2 runs roles against TOOLBUS_NATS_URL in this process, as `toolbus planner` and
// `toolbus injector` would.
func cmdRole2(ctx context.Context, cfg Config, roles ...string) error {
	log := cfg.Logger()
	c, err := node.Open(ctx, cfg, log, false)
	if err != nil {
		return err
	}
	defer c.Close()
	return node.RunRoles(ctx, cfg, c.Bus, log, roles...)
}
