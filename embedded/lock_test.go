package embedded_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/embedded"
)

// holdEnv makes the test binary a process that starts an embedded server on the
// directory it names, prints the server's URL and runs until killed.
const holdEnv = "EMBEDDED_TEST_HOLD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(holdEnv); dir != "" {
		srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(1)
		}
		fmt.Println("URL", srv.ClientURL())
		select {}
	}
	os.Exit(m.Run())
}

// holder starts a second process whose embedded server holds dir and returns it with
// its server's URL.
func holder(t *testing.T, dir string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "URL ") {
		t.Fatalf("holder: %q %v", line, err)
	}
	return cmd, strings.TrimSpace(strings.TrimPrefix(line, "URL "))
}

// One process per data directory: a second process's server refuses the directory,
// naming the holder and its URL; what the holder wrote is there for the next server
// once the holder is gone (killed: the kernel frees the lock).
func TestStoreDirOneProcess(t *testing.T) {
	dir := t.TempDir()
	cmd, url := holder(t, dir)

	_, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	var inUse *embedded.InUseError
	if !errors.As(err, &inUse) || !errors.Is(err, embedded.ErrStoreInUse) {
		t.Fatalf("second server on a held directory: %v, want an *InUseError", err)
	}
	if inUse.Holder.PID != cmd.Process.Pid || inUse.Holder.URL != url {
		t.Fatalf("refusal names %+v, want pid %d url %s", inUse.Holder, cmd.Process.Pid, url)
	}
	if !strings.Contains(err.Error(), "TOOLBUS_NATS_URL="+url) || !strings.Contains(err.Error(), fmt.Sprint(cmd.Process.Pid)) {
		t.Fatalf("refusal does not say which process and which URL: %v", err)
	}
	if h, held := embedded.ReadHolder(dir); !held || h.URL != url {
		t.Fatalf("ReadHolder = %+v, %v; want held by %s", h, held, url)
	}

	// The holder's server writes through its URL.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEPT", Subjects: []string{"kept.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "kept.one", []byte("written by the holder")); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if _, held := embedded.ReadHolder(dir); held {
		t.Fatal("a killed holder still holds the directory")
	}
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		t.Fatalf("the directory of a killed holder: %v", err)
	}
	defer srv.Stop()
	nc2, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, _ := jetstream.New(nc2)
	s, err := js2.Stream(ctx, "KEPT")
	if err != nil {
		t.Fatalf("the holder's stream is gone: %v", err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "kept.one")
	if err != nil || string(m.Data) != "written by the holder" {
		t.Fatalf("the holder's message: %v %v", m, err)
	}
}

// In one process too, a directory serves one server at a time; Stop gives it back.
func TestStoreDirReleasedByStop(t *testing.T) {
	dir := t.TempDir()
	a, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir}); !errors.Is(err, embedded.ErrStoreInUse) {
		a.Stop()
		t.Fatalf("second server in one process: %v", err)
	}
	a.Stop()
	b, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		t.Fatalf("after Stop: %v", err)
	}
	b.Stop()
}
