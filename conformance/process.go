package conformance

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/toolbus/toolbus/internal/testutil"
)

// start runs the executor with its output captured.
func start(cfg Config, url, instance string) (*exec.Cmd, *testutil.Buffer, error) {
	if len(cfg.Command) == 0 {
		return nil, nil, errors.New("conformance: no executor command")
	}
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Dir = cfg.Dir
	cmd.Env = append(os.Environ(), "TOOLBUS_NATS_URL="+url, "TOOLBUS_INSTANCE="+instance,
		"TOOLBUS_ACK_WAIT="+cfg.AckWait.String())
	cmd.Env = append(cmd.Env, cfg.Env...)
	out := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("conformance: start %v: %w", cfg.Command, err)
	}
	return cmd, out, nil
}

// stop asks the executor to stop (SIGTERM), kills it if it does not, and returns its output.
func stop(cmd *exec.Cmd, out *testutil.Buffer) string {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	return out.String()
}
