package faults_test

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the child get SIGKILL when the test process dies (a test timeout
// panics without running cleanups), so no server or worker outlives the suite.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
