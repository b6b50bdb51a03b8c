package testutil

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the child get SIGKILL when the test process dies (a test timeout
// panics without running cleanups), so no server or worker outlives the tests.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
