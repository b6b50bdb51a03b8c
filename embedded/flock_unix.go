//go:build unix

package embedded

import (
	"os"
	"syscall"
)

// flock takes an exclusive advisory lock on f without waiting.
func flock(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

func funlock(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
